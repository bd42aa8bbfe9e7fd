"""What the two sweep experiments' reports say about an `offset_sweep`.

`experiments.two_offsets` and `experiments.head_dim` both report a
`tuned_sweep`: its NMSE cells, the learning-rate table and plateau check,
the curves, and how the runs were trained. The methods paragraph both
reports share is offset_sweep_report.md.tmpl beside this file; `values`
fills it and gives the other values both reports' templates use, from
results.json alone. Written here once so both reports read alike; kept
apart from the sweep itself, as a report is kept from its run.
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments.offset_sweep import TARGET_VARIANCE
from mha_jax.measure import curves
from mha_jax.measure import report as report_lib

METHODS = pathlib.Path(__file__).with_name("offset_sweep_report.md.tmpl")


def plot_nmse_curves(curve_lists: dict, *, title: str, path: str) -> None:
  """Held-out NMSE against steps, `{label: [curve]}` with each curve a
  run's `{"steps", "loss"}`, on a log axis."""
  curves.plot_seed_curves(
      {k: [(c["steps"], np.asarray(c["loss"]) / TARGET_VARIANCE)
           for c in cs] for k, cs in curve_lists.items()},
      ylabel="normalised MSE", logy=True, title=title, path=path)


def summary_cell(summ: dict) -> str:
  """A `stats.summary` as `mean ± std [95% interval]`, 3 significant
  digits (the NMSE of these runs spans 1e-4 to 1)."""
  return report_lib.summary(summ, spec=".3g", std_spec=".2g")


def difference_cell(d: dict) -> str:
  """A `stats.difference` as `+diff [lo, hi]` (3 significant digits)."""
  return report_lib.difference(d, spec="+.3g",
                               missing="(no interval: one seed)")


def offset_cells(summ: dict) -> list[str]:
  """The best head's weight on t-1 and on t-3 (mean ± std, 2 decimals)
  of a `head_summary`."""
  return [report_lib.fmt(summ[k]["mean"], summ[k]["std"], 2)
          for k in ("best_offset1", "best_offset3")]


def selection_table(selection: dict, plateau: dict) -> str:
  """Per setting of a `tuned_sweep`: the held-out NMSE at every rate of
  the grid, the chosen rate, and the plateau check (NMSE at the run's
  length -> at the longer run)."""
  rows = []
  for label, s in selection.items():
    grid = (", ".join(f"{lr}: {v / TARGET_VARIANCE:.3g}"
                      for lr, v in s["grid"].items())
            or "one rate: nothing to choose")
    p = plateau.get(label)
    rows.append([label, grid, f"{s['chosen']:g}"
                 + (" (grid edge)" if s["at_edge"] else ""),
                 (f"{p['loss'] / TARGET_VARIANCE:.3g} → "
                  f"{p['long_loss'] / TARGET_VARIANCE:.3g}"
                  if p else "not run")])
  return report_lib.md_table(["setting", "NMSE per learning rate", "chosen",
                              "plateau check"], rows)


def _plateau(e, num_steps: int) -> str:
  """The methods paragraph's plateau-check sentence; none without one."""
  if e["plateau_factor"] <= 1:
    return ""
  return (f" Plateau check: the selection seed at the chosen rate trained "
          f"{e['plateau_factor']}x as long "
          f"({e['plateau_factor'] * num_steps} steps, the schedule "
          f"stretched) against the same seed at {num_steps} steps.")


def methods(config: dict) -> str:
  """How `tuned_sweep` trained and measured: the shared template filled
  from a results.json's config."""
  e, tr, task = config["experiment"], config["train"], config["task"]
  return report_lib.fill(METHODS, {
      "positions": config["model"]["positions"],
      "seq_len": task["seq_len"], "num_steps": tr["num_steps"],
      "batch_size": task["batch_size"], "warmup_steps": tr["warmup_steps"],
      "end_lr_fraction": f"{tr['end_lr_fraction']:g}",
      "learning_rates": list(e["learning_rates"]),
      "selection_seed": e["selection_seed"],
      "plateau": _plateau(e, tr["num_steps"]), "seeds": list(e["seeds"]),
      "analysis_examples": e["analysis_examples"]}).rstrip("\n")


def values(name: str, saved: dict, selection: dict, plateau: dict,
           command: str | None = None) -> dict:
  """The values both sweep reports' templates use: the command of
  `experiments.<name>` (`command`, `report_lib.command_line`'s, or a
  call from Python without one) and its wall time, the methods
  paragraph, and the learning-rate table (`selection`, `plateau`: the
  `tuned_sweep`'s) with the numbers of the sentence above it."""
  config = saved["config"]
  return {
      "command": report_lib.command(f"experiments.{name}", command),
      "wall_time": report_lib.wall_time(saved["wall_seconds"],
                                        saved["reused_runs"]),
      "methods": methods(config),
      "num_steps": config["train"]["num_steps"],
      "plateau_factor": config["experiment"]["plateau_factor"],
      "selection_table": selection_table(selection, plateau),
  }
