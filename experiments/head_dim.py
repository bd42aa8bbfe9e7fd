r"""Experiment 3: head width d_k against head count h at fixed d_model.

  python -m experiments.head_dim --workdir=runs/head_dim

Part A trains the two-offset retrieval layer of `configs/head_dim.py` for
every h (d_k = d_model / h). Part B fits the query/key maps of ONE head of
width d_k to a random target attention matrix and reports the error against
d_k (the low-rank bottleneck of a head). Writes report.md, results.json and
PNG figures into --workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from experiments import common
from mha_jax import low_rank
from mha_jax import plots
from mha_jax import two_offsets

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/head_dim.py", "The experiment's config file; override "
    "fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/head_dim", "Output folder: report.md, results.json, "
    "PNGs and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train part A, fit part B, write the report; returns what results.json
  holds."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  d = config.model.d_model
  setting_list = [(f"h={h} (d_k={d // h})",
                   {"model.num_heads": h, "model.head_dim": 0})
                  for h in e.heads]
  cont, target_var = two_offsets.sweep(config, workdir,
                                       "two_offset_continuous", setting_list,
                                       reuse=reuse_runs)
  labels = list(cont)
  nmse = [common.mean_std([r["nmse"] for r in cont[k]]) for k in labels]
  plots.line_plot([d // h for h in e.heads],
                  {"two-offset retrieval": ([m for m, _ in nmse],
                                            [s for _, s in nmse])},
                  xlabel="d_k (h = d_model / d_k)", ylabel="normalised MSE",
                  logx=True, title=f"Part A: d_model = {d}, one layer",
                  path=str(workdir / "nmse_vs_dk.png"))
  fit = low_rank.width_sweep(len(e.seeds), n=e.fit_n, d_model=e.fit_d_model,
                            steps=e.fit_steps, lr=e.fit_lr,
                            temperature=e.fit_temperature)
  kl = [common.mean_std(v) for v in fit["kl"]]
  plots.line_plot(fit["d_k"], {"mean KL to target": ([m for m, _ in kl],
                                                     [s for _, s in kl])},
                  xlabel="d_k", ylabel="KL (nats)", logy=True,
                  title=f"Part B: fit one head to a random {e.fit_n}x"
                  f"{e.fit_n} attention",
                  path=str(workdir / "low_rank_fit.png"))
  results = {"part_a": cont, "part_a_target_variance": target_var,
             "part_b": fit}
  return common.write_outputs(workdir, results,
                              _report(config, cont, nmse, labels, fit, kl),
                              drop=("weights_example",))


def _report(config, cont, nmse, labels, fit, kl):
  e = config.experiment
  d = config.model.d_model
  best = labels[int(np.argmin([m for m, _ in nmse]))]
  rows_a = [[k, common.fmt(*m),
             common.fmt(*common.mean_std([r["offset1"].max()
                                          for r in cont[k]]), digits=2),
             common.fmt(*common.mean_std([r["offset3"].max()
                                          for r in cont[k]]), digits=2)]
            for k, m in zip(labels, nmse)]
  rows_b = [[dk, f"{m:.2e} ± {s:.1e}",
             f"{np.mean(err):.3f}"]
            for dk, (m, s), err in zip(fit["d_k"], kl, fit["max_error"])]
  # Smallest d_k whose mean KL is within 10x of the d_k = n fit.
  floor = kl[-1][0]
  knee = next(dk for dk, (m, _) in zip(fit["d_k"], kl) if m <= 10 * floor)
  lines = [
      "# Experiment 3: the head-width sweet spot",
      "",
      "Command: `python -m experiments.head_dim --workdir=runs/head_dim` "
      "(config `configs/head_dim.py`).",
      "",
      f"## Part A: two-offset retrieval, d_model = {d}, h = {list(e.heads)}",
      "",
      f"One attention-only layer, {config.model.positions} positions, "
      f"{config.train.num_steps} steps, seeds {list(e.seeds)}; normalised "
      f"MSE on {e.analysis_examples} held-out sequences (mean ± std).",
      "",
      common.md_table(["setting", "NMSE", "best head weight on t-1",
                       "best head weight on t-3"], rows_a),
      "",
      "![nmse_vs_dk.png](nmse_vs_dk.png)",
      "",
      f"Best setting: {best}.",
      "",
      f"## Part B: one head of width d_k fitted to a random {e.fit_n}x"
      f"{e.fit_n} attention matrix",
      "",
      f"X: {e.fit_n} random vectors in R^{e.fit_d_model}; target rows = "
      f"softmax({e.fit_temperature} * N(0, 1)); {e.fit_steps} Adam steps "
      f"(lr {e.fit_lr}); {len(e.seeds)} random targets; KL(target || fit) "
      "averaged over rows, and the largest absolute weight error.",
      "",
      common.md_table(["d_k", "mean KL (nats)", "max |error|"], rows_b),
      "",
      "![low_rank_fit.png](low_rank_fit.png)",
      "",
      "## What this shows, next to the source's claim",
      "",
      "The source says that below a sweet spot of d_k, adding heads "
      "degrades quality although the cost does not change.",
      "",
      f"* Part A: NMSE is lowest at {best}; see the table for how it "
      "rises on each side: with one head the layer cannot fetch two "
      "positions (NMSE at the 0.5 bound of experiment 2), and at the "
      "smallest d_k a head's scores have too few dimensions to pick one "
      "offset sharply out of absolute positions (compare the best head "
      "weight on t-1 across rows).",
      f"* Part B: the fit error drops to within 10x of the full-width "
      f"fit at d_k = {knee} (n = {e.fit_n}); a head of width d_k produces "
      "score matrices of rank <= d_k, and since a softmax ignores a "
      "constant per row, rank n - 1 suffices for any full-support target "
      f"(n - 1 = {e.fit_n - 1}). Narrower heads cannot represent an "
      "arbitrary pattern; they rely on the pattern being simple.",
  ]
  return "\n".join(lines)


def main(argv):
  common.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
