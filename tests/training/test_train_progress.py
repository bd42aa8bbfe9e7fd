"""The console lines of a run: the first right after the compiling step,
an ETA that leaves compilation out, a line at least every QUIET_S
seconds, and "run k of n" for the runs of an experiment."""

import logging
import re

import pytest
from absl import logging as absl_logging

from configs import default
from mha_jax.measure import runs
from mha_jax.training import train
from mha_jax.training import progress


def _tiny(num_steps):
  c = default.get_config("smoke")
  c.model.num_layers = 1
  c.train.update(num_steps=num_steps, warmup_steps=1, log_every=num_steps,
                 eval_every=num_steps)
  return c


@pytest.fixture(name="info_log")
def _info_log(caplog):
  """caplog with absl's INFO lines. absl's verbosity (a flag, WARNING
  until a command line sets it) must say INFO too: the checkpoint code
  restores it after hiding orbax's lines."""
  old = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  with caplog.at_level(logging.INFO, logger="absl"):
    yield caplog
  absl_logging.set_verbosity(old)


def _lines(caplog):
  return [r.getMessage() for r in caplog.records
          if r.getMessage().startswith(("step ", "Training ", "Reusing "))]


@pytest.mark.parametrize("done, total, first, seconds, expected", [
    (101, 1501, 1, 10.0, (10.0, 140.0)),  # 100 steps in 10 s: 1400 left
    (50, 50, 10, 8.0, (5.0, 0.0)),
    (1, 100, 1, 5.0, (None, None)),  # only the compiling step so far
    (7, 100, 6, 0.0, (None, None)),
])
def test_pace_counts_only_the_steps_after_the_compiling_one(
    done, total, first, seconds, expected):
  assert progress.pace(done, total, first, seconds) == expected


def test_first_line_after_step_one_then_every_quiet_interval(
    tmp_path, info_log, monkeypatch):
  """log_every = num_steps: without the first line and the quiet-time
  lines the run would say nothing until it ends. QUIET_S = 0 stands for
  steps slower than it, so every step after the first gets a line."""
  monkeypatch.setattr(progress, "QUIET_S", 0.0)
  train.train_and_evaluate(_tiny(3), tmp_path)
  lines = _lines(info_log)
  assert len(lines) == 3, lines
  assert re.fullmatch(r"step 1/3 \| accuracy \d\.\d{4} \| grad_norm "
                      r"\d+\.\d{4} \| loss \d+\.\d{4} \| first step "
                      r"\d+\.\d s, compile included", lines[0]), lines[0]
  assert re.fullmatch(r"step 2/3 \| \d+\.\d steps/s \| ETA 0:00:\d\d",
                      lines[1]), lines[1]
  # The last step logs its metrics row, and an ETA of nothing left.
  assert re.fullmatch(r"step 3/3 \| accuracy .* \| loss \d+\.\d{4} \| "
                      r"\d+\.\d steps/s \| ETA 0:00:00", lines[2]), lines[2]


def test_seed_runs_say_run_k_of_n(tmp_path, info_log):
  # The process's count so far is whatever earlier tests left.
  runs.train_run(_tiny(2), tmp_path / "a")
  count = int(re.search(r"Training run (\d+) of the command: ",
                        _lines(info_log)[0]).group(1))
  info_log.clear()
  list(runs.seed_runs(_tiny(2), tmp_path / "b", (3, 4), reuse=True))
  list(runs.seed_runs(_tiny(2), tmp_path / "b", (3, 4), reuse=True))
  opening = [m for m in _lines(info_log) if not m.startswith("step ")]
  assert opening == [
      f"Training run 1 of 2 of this setting (run {count + 1} of the "
      f"command): {tmp_path / 'b' / 'seed3'}",
      f"Training run 2 of 2 of this setting (run {count + 2} of the "
      f"command): {tmp_path / 'b' / 'seed4'}",
      f"Reusing run 1 of 2 of this setting (run {count + 3} of the "
      f"command): {tmp_path / 'b' / 'seed3'}",
      f"Reusing run 2 of 2 of this setting (run {count + 4} of the "
      f"command): {tmp_path / 'b' / 'seed4'}"]

