"""Command-line errors: one line naming the problem, last, exit status 1.

The subprocess tests run the real entry points (absl flags are global to
a process) on inputs that fail before JAX compiles anything, and check
the whole of stderr: the one line, no traceback, config dump or help.
"""

import fcntl
import json
import os
import pathlib
import subprocess
import sys

import pytest

from configs import default
from experiments import cli
from mha_jax.training import config as config_lib
from mha_jax.training import workdir as workdir_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _stderr_of(*args, timeout=120) -> str:
  """stderr of `python -m <args>` run from the repository root, which must
  fail with exit status 1."""
  proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 1, proc.stderr[-2000:]
  return proc.stderr


@pytest.mark.parametrize("args, line", [
    (["experiments.train", "--config=configs/defalt.py:smoke",
      "--workdir=unused"],
     "Error: --config=configs/defalt.py:smoke: no such file "
     f"configs/defalt.py (in {ROOT}); did you mean "
     "--config=configs/default.py:smoke?"),
    (["experiments.train", "--config=configs/pruning.py:smok",
      "--workdir=unused"],
     "Error: configs/pruning.py: unknown config argument 'smok' (as in "
     "--config=configs/pruning.py:smok); expected none (the full run) or "
     "'smoke' (a tiny run of a few seconds)"),
    # The SAE's smoke run trains a model and SAEs: minutes, not seconds.
    (["experiments.sae", "--config=configs/sae.py:smok",
      "--workdir=unused"],
     "Error: configs/sae.py: unknown config argument 'smok'; expected none "
     "(the full run) or 'smoke' (a tiny run of 1 to 5 minutes), or "
     "'smollm2' (SmolLM2's layer 17)"),
])
def test_a_missing_config_file_or_variant_is_one_line(args, line):
  assert _stderr_of(*args) == line + "\n"


def test_a_bad_value_fails_before_a_workdir_is_made(tmp_path):
  """An experiment validates a training config before it runs; absl's
  --help and the config are not printed."""
  workdir = tmp_path / "run"
  assert _stderr_of("experiments.pruning", "--config.model.num_heads=-1",
                    f"--workdir={workdir}") == (
      "Error: config.model.num_heads: must be a positive int, got -1\n")
  assert not workdir.exists()


def test_all_to_all_over_more_shards_than_heads_fails_at_validation(
    tmp_path):
  """Refused by validate_config, before any device or workdir: the
  process has one device, and the message still comes first."""
  workdir = tmp_path / "run"
  stderr = _stderr_of(
      "experiments.train", "--config=configs/default.py:smoke",
      "--config.mesh.sequence=4", "--config.model.implementation=all_to_all",
      f"--workdir={workdir}")
  assert stderr == (
      "Error: config.mesh.sequence: mesh.sequence=4 must divide the 2 query "
      "heads per device (model.num_heads=2 / mesh.model=1) for "
      "model.implementation 'all_to_all'; use 'ring', or a sequence axis "
      "that divides 2\n")
  assert not workdir.exists()


def test_a_workdir_in_use_is_one_line_naming_the_holder(tmp_path):
  lock = tmp_path / ".lock"
  fd = os.open(lock, os.O_RDWR | os.O_CREAT)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"host": "h1", "pid": 7,
                             "started": "2025-01-02 03:04:05"}).encode())
    stderr = _stderr_of("experiments.train",
                        "--config=configs/default.py:smoke",
                        f"--workdir={tmp_path}")
  finally:
    os.close(fd)
  assert stderr == (
      f"Error: workdir {tmp_path} is in use by process 7 on h1 (started "
      "2025-01-02 03:04:05); wait for that run to finish (or stop it) before "
      "resuming here, or give another --workdir\n")
  assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def test_missing_config_file_names_a_near_file_or_the_folder(tmp_path):
  (tmp_path / "configs").mkdir()
  for name in ("__init__.py", "default.py", "copy.py"):
    (tmp_path / "configs" / name).write_text("")
  assert cli.missing_config_file("configs/copy.py:smoke", tmp_path) is None
  assert cli.missing_config_file("configs/cpy.py", tmp_path) == (
      f"--config=configs/cpy.py: no such file configs/cpy.py (in {tmp_path})"
      "; did you mean --config=configs/copy.py?")
  assert cli.missing_config_file("configs/nope.py:smoke", tmp_path) == (
      "--config=configs/nope.py:smoke: no such file configs/nope.py (in "
      f"{tmp_path}); configs/ holds copy.py, default.py")
  assert cli.missing_config_file("other/x.py", tmp_path) == (
      f"--config=other/x.py: no such file other/x.py (in {tmp_path}); the "
      "experiments' configs are configs/*.py, run from the repository root")


@pytest.mark.parametrize("heads, model, sequence, ok", [
    (4, 1, 2, True), (4, 1, 4, True), (4, 2, 2, True), (8, 2, 4, True),
    (2, 1, 4, False), (4, 2, 4, False), (4, 1, 8, False)])
def test_all_to_all_needs_heads_per_device_divisible_by_sequence(
    heads, model, sequence, ok):
  """Known cases by hand: H / mesh.model query heads per device must
  split over the sequence axis; the ring takes any of them."""
  config = default.get_config("smoke")
  config.model.update(num_heads=heads, d_model=8 * heads)
  config.mesh.update(model=model, sequence=sequence)
  config.task.seq_len = 16
  config.model.implementation = "ring"
  config_lib.validate_config(config)
  config.model.implementation = "all_to_all"
  if ok:
    config_lib.validate_config(config)
  else:
    with pytest.raises(config_lib.ConfigError,
                       match=rf"mesh.sequence={sequence} must divide the "
                       rf"{heads // model} query heads per device"):
      config_lib.validate_config(config)


def test_check_free_refuses_a_held_workdir_and_creates_nothing(tmp_path):
  workdir_lib.check_free(tmp_path / "absent")
  assert not (tmp_path / "absent").exists()
  with workdir_lib.lock(tmp_path):
    with pytest.raises(workdir_lib.WorkdirInUse,
                       match=rf"^workdir {tmp_path} is in use by process "
                       rf"{os.getpid()} on "):
      workdir_lib.check_free(tmp_path)
  workdir_lib.check_free(tmp_path)  # released with the `with` block
