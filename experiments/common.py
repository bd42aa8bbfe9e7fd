"""Shared plumbing of the experiment entry points (not library code).

Each experiment module defines `run(config, workdir) -> results` and a
three-line `main`; this file holds what they share: flags, training several
seeds through the one training loop, reading metrics back, fixed analysis
batches, and writing report.md / results.json.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np

from mha_jax import config as config_lib
from mha_jax import train


def app_main(run, get_config, name: str):
  """Define `--config` (the experiment's ConfigDict, overridable as
  `--config.train.num_steps=...`) and `--workdir`, then run
  `run(config, workdir)` under absl and say where the report is.

  Flags are defined here, not at import, so experiment modules can import
  each other (and tests can import them) without clashing flags.
  """
  config_flag = config_flags.DEFINE_config_dict("config", get_config(),
                                                lock_config=True)
  workdir_flag = flags.DEFINE_string(
      "workdir", f"runs/{name}", "Output folder: report.md, results.json, "
      "PNGs and one sub-folder per training run.")
  reuse_flag = flags.DEFINE_bool(
      "reuse_runs", False, "Load a finished run whose config.json matches "
      "instead of training it again (to redo only the analysis).")

  def main(argv):
    global _REUSE_RUNS
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    _REUSE_RUNS = reuse_flag.value
    start = time.time()
    run(config_flag.value, workdir_flag.value)
    print(f"Done in {time.time() - start:.0f} s. Report: "
          f"{pathlib.Path(workdir_flag.value) / 'report.md'}")

  app.run(main)


def variant(config, **overrides) -> ml_collections.ConfigDict:
  """A copy of `config` with dotted overrides (`**{"model.x": 1}`)."""
  c = ml_collections.ConfigDict(config.to_dict())
  for path, value in overrides.items():
    group, field = path.split(".")
    c[group][field] = value
  config_lib.validate_config(c)
  return c


_REUSE_RUNS = False  # set by --reuse_runs


def train_run(config, run_dir) -> train.TrainState:
  """Train from scratch into `run_dir` (an older run there is replaced).

  Starting fresh (instead of resuming) keeps a report in sync with the
  config it states, even after the config changed. With --reuse_runs, a
  finished run with the identical config is loaded instead.
  """
  run_dir = pathlib.Path(run_dir)
  if _REUSE_RUNS and (run_dir / "config.json").exists():
    same = ((run_dir / "config.json").read_text()
            == config.to_json_best_effort(indent=2))
    if same and curve(run_dir, "train")[0][-1:] == [config.train.num_steps]:
      logging.info("Reusing %s", run_dir)
      return train.load_state(run_dir)[0]
  shutil.rmtree(run_dir, ignore_errors=True)
  logging.info("Training %s", run_dir)
  return train.train_and_evaluate(config, run_dir)


def curve(run_dir, split: str = "eval", key: str = "loss"):
  """`(steps, values)` of one metric from a run's metrics.jsonl."""
  rows = [json.loads(line) for line in
          (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if r["split"] == split and key in r]
  return [r["step"] for r in rows], [r[key] for r in rows]


def analysis_batch(config, num_examples: int, seed: int = 12345):
  """A fixed batch of the config's task, never seen in training."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.task.batch_size = num_examples
  return train.batch_fn(c)(jax.random.PRNGKey(seed))  # jitted: op-by-op is slow


def weights_of(model, batch):
  """Attention weights `{"self": [L, B, H, T, T], ...}` as NumPy."""
  _, weights = jax.jit(lambda b: train.apply_model(model, b,
                                                   return_weights=True))(batch)
  return jax.tree.map(np.asarray, weights)


def eval_loss(model, batch, loss: str) -> dict:
  """Loss (and accuracy for classes) of `model` on `batch`, as floats."""
  _, metrics = jax.jit(lambda b: train.compute_loss(model, b, loss))(batch)
  return {k: float(v) for k, v in metrics.items()}


def mean_std(values) -> tuple[float, float]:
  """Mean and standard deviation (ddof=0) over seeds."""
  values = np.asarray(values, np.float64)
  return float(values.mean()), float(values.std())


def fmt(mean: float, std: float | None = None, digits: int = 3) -> str:
  """`0.123 ± 0.004` for tables."""
  if std is None:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


def md_table(headers, rows) -> str:
  """A Markdown table."""
  lines = ["| " + " | ".join(str(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _to_json(x):
  if isinstance(x, dict):
    return {str(k): _to_json(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_to_json(v) for v in x]
  if isinstance(x, (np.ndarray, jax.Array)):
    return _to_json(np.asarray(x).tolist())
  if isinstance(x, (np.floating, np.integer, np.bool_)):
    return x.item()
  return x


def write_outputs(workdir, results: dict, report: str):
  """Write results.json (every number) and report.md into `workdir`."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "results.json").write_text(
      json.dumps(_to_json(results), indent=1) + "\n")
  (workdir / "report.md").write_text(report.rstrip() + "\n")
