"""The SAE experiment's figure: each SAE's training curves (reconstruction
error and L0 against the step), from the runs' metrics.jsonl."""

from __future__ import annotations

import json
import pathlib

from mha_jax.measure import plots


def write(saved: dict, workdir) -> list:
  """`training.png` in `workdir` (the SAEs' folders must be there)."""
  workdir = pathlib.Path(workdir)
  fig, axes = plots.subplots(1, 2, figsize=(10, 3.6))
  drawn = False
  for r in saved["runs"]:
    path = workdir / f"{r['kind']}_seed{r['seed']}" / "metrics.jsonl"
    if not path.exists():
      continue
    rows = [json.loads(x) for x in path.read_text().splitlines() if x]
    steps = [x["step"] for x in rows]
    for ax, key in zip(axes, ("mse", "l0")):
      ax.plot(steps, [x[key] for x in rows],
              label=f"{r['kind']} seed {r['seed']}")
    drawn = True
  if not drawn:
    return []
  axes[0].set(xlabel="step", ylabel="|x - x_hat|^2 (E|x|^2 = D)",
              yscale="log", title="reconstruction error (training batch)")
  axes[1].set(xlabel="step", ylabel="L0", yscale="log",
              title="active features per token")
  axes[0].legend(fontsize=7)
  out = workdir / "training.png"
  plots.save(fig, str(out))
  return [out]
