"""What the two sweep experiments' reports say about an `offset_sweep`.

`experiments.two_offsets` and `experiments.head_dim` both report a
`tuned_sweep`: its NMSE cells, the learning-rate table and plateau check,
the curves, the sentence that links the explorer page of one run and
how the runs were trained. Written here once so both reports read alike;
kept apart from the sweep itself, as a report is kept from its run.
"""

from __future__ import annotations

import numpy as np

from experiments.offset_sweep import TARGET_VARIANCE
from mha_jax.measure import curves
from mha_jax.measure import report as report_lib


def explorer_text(label: str, seed: int) -> str:
  """The report's sentence that links the page `write_explorer` wrote of
  the run of `label` with `seed`."""
  return (f"Every head of the {label} model (seed {seed}) on the held-out "
          "batch of the table, in a browser: [explorer.html](explorer.html) "
          "(the inputs are vectors, so positions label them).")


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
  of a `setting_summary`."""
  return [report_lib.fmt(summ[k]["mean"], summ[k]["std"], 2)
          for k in ("best_offset1", "best_offset3")]


def selection_rows(selection: dict, plateau: dict) -> list[list[str]]:
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
  return rows


def selection_section(config, selection: dict, plateau: dict) -> list[str]:
  """Report lines: the learning-rate choice and plateau check of a
  `tuned_sweep`, a sentence and its table."""
  return [
      "Learning-rate choice (held-out NMSE of the selection seed at each "
      "rate) and the plateau check (same seed, chosen rate: NMSE at "
      f"{config.train.num_steps} steps → at "
      f"{config.experiment.plateau_factor}x as many):",
      "",
      report_lib.md_table(["setting", "NMSE per learning rate", "chosen",
                           "plateau check"],
                          selection_rows(selection, plateau))]


def report_header(title: str, name: str, results: dict) -> list[str]:
  """A sweep report's first lines: its title, then the command of
  `experiments.<name>`, its config and how long it took ("wall_seconds",
  "reused_runs" of `results`)."""
  took = report_lib.wall_time(results["wall_seconds"], results["reused_runs"])
  return [f"# {title}", "",
          f"Command: {report_lib.command(f'experiments.{name}')} "
          f"(config `configs/{name}.py`; {took}).", ""]


def tuning_text(config) -> str:
  """How `tuned_sweep` trained and measured, for a report."""
  e, tr = config.experiment, config.train
  plateau = (f" Plateau check: the selection seed at the chosen rate "
             f"trained {e.plateau_factor}x as long "
             f"({e.plateau_factor * tr.num_steps} steps, the schedule "
             f"stretched) against the same seed at {tr.num_steps} steps."
             if e.plateau_factor > 1 else "")
  return (
      f"{config.model.positions} positions, sequences of "
      f"{config.task.seq_len}, {tr.num_steps} steps of batch "
      f"{config.task.batch_size}, linear warmup over {tr.warmup_steps} steps "
      f"then cosine decay to {tr.end_lr_fraction:g}x the peak. Learning "
      f"rate per setting: the one of {list(e.learning_rates)} with the "
      f"lowest held-out loss on seed {e.selection_seed}, which is not a "
      f"reported seed.{plateau} Reported seeds {list(e.seeds)}; numbers on "
      f"{e.analysis_examples} held-out sequences drawn per seed (positions "
      f"t >= 3). NMSE = MSE / target variance, which is exactly 1 here "
      f"(every target coordinate is a coordinate of some u_s ~ N(0, 1)); 0 "
      f"is perfect, 1 is predicting the mean. Cells are mean ± sample std "
      f"[95% t interval of the mean]; differences carry Welch 95% "
      f"intervals.")
