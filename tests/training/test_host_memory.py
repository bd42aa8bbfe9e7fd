"""keep_freed_memory: a big block freed and allocated again reuses its
pages instead of faulting in fresh ones (each case in its own process,
since the setting is process-wide; the probe uses malloc as XLA does,
not numpy, which asks for huge pages), called as a user's script calls
it, `mha_jax.keep_freed_memory()`."""

import pathlib
import subprocess
import sys

import pytest

from mha_jax.training import host_memory

_PROBE = """
import ctypes, resource, sys
if sys.argv[1] == "keep":
  import mha_jax
  first = mha_jax.keep_freed_memory()
  print("applied", first["applied"], mha_jax.keep_freed_memory() is first)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = int(sys.argv[2]) * 2**20
def touch_and_free():  # what XLA does with a call's scratch
  block = libc.malloc(size)
  ctypes.memset(block, 1, size)
  libc.free(block)
touch_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch_and_free()
print("faults", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.fixture
def glibc_malloc():
  """Skips where glibc's malloc is not the one to set."""
  if not sys.platform.startswith("linux"):
    pytest.skip("glibc's mallopt: Linux only")
  if host_memory._loaded_allocator():
    pytest.skip("another allocator is preloaded here")


def _faults(mode, mib=100):
  out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(mib)],
                       check=True, capture_output=True, text=True).stdout
  lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
  return lines, int(lines["faults"][0])


def test_a_freed_block_is_reused_without_page_faults(glibc_malloc):
  _, plain = _faults("plain")
  lines, kept = _faults("keep")
  assert lines["applied"] == ["True", "True"]  # and the same answer again
  # 100 MiB is 25,600 pages of 4 KiB: glibc maps a block that large
  # afresh each time, so the second one faults every page in again.
  assert plain >= 25_000, plain
  assert kept < 1_000, kept


def test_a_freed_block_over_2_gib_is_kept_too(glibc_malloc):
  # A trim threshold of 2**31 - 1 (the largest int) still gave back a
  # freed heap top over 2 GiB, and SmolLM2's EAP scores (a 5.6 GB peak)
  # faulted 1.4M pages a call; -1 turns trimming off.
  lines, kept = _faults("keep", mib=2200)
  assert lines["applied"] == ["True", "True"]
  assert kept < 1_000, kept  # 563,200 pages if the top is trimmed


def test_the_environment_turns_it_off():
  out = subprocess.run(
      [sys.executable, "-c", "from mha_jax.training import host_memory; "
       "print(host_memory.keep_freed_memory())"], check=True,
      capture_output=True, text=True,
      env={**__import__("os").environ, host_memory.OFF_VARIABLE: "0"}).stdout
  assert "'applied': False" in out and "MHA_JAX_KEEP_FREED_MEMORY=0" in out


def _stubbed(monkeypatch):
  """Calls of keep_freed_memory (1) and of the loop's body (2), in order;
  stubs, since the setting itself is process-wide (checked above in
  processes of their own)."""
  from mha_jax.training import train  # pylint: disable=g-import-not-at-top
  calls = []
  monkeypatch.setattr(host_memory, "keep_freed_memory",
                      lambda: calls.append(1) or {"applied": True})
  monkeypatch.setattr(train, "_train_and_evaluate",
                      lambda *a: calls.append(2))
  return calls


def test_the_library_loop_leaves_the_process_alone(monkeypatch, tmp_path):
  # A user's own call of the training function changes no allocator.
  from configs import induction  # pylint: disable=g-import-not-at-top
  from mha_jax.training import train  # pylint: disable=g-import-not-at-top
  calls = _stubbed(monkeypatch)
  train.train_and_evaluate(induction.get_config("smoke"), tmp_path)
  assert calls == [2]


# `python -m experiments.train`'s run with the two stubs of `_stubbed`, in
# a process of its own: the command defines absl flags (`--workdir`) that
# another entry point imported by an earlier test in the same worker may
# hold already, and absl refuses a flag defined twice.
_TRAIN_COMMAND = """
import sys
from mha_jax.training import host_memory, train
calls = []
host_memory.keep_freed_memory = lambda: calls.append(1) or {"applied": True}
train._train_and_evaluate = lambda *a: calls.append(2)
from configs import induction
from experiments import train as train_main
train_main.run(induction.get_config("smoke"), sys.argv[1])
print(calls)
"""


def test_the_experiment_commands_turn_it_on_first(monkeypatch, tmp_path):
  from configs import induction  # pylint: disable=g-import-not-at-top
  from configs import eap_ioi  # pylint: disable=g-import-not-at-top
  from configs import eap_ioi_bench  # pylint: disable=g-import-not-at-top
  from configs import sae  # pylint: disable=g-import-not-at-top
  from experiments import cli  # pylint: disable=g-import-not-at-top
  out = subprocess.run(
      [sys.executable, "-c", _TRAIN_COMMAND, str(tmp_path / "run")],
      check=True, capture_output=True, text=True,
      cwd=pathlib.Path(__file__).resolve().parents[2]).stdout
  assert out.splitlines()[-1] == "[1, 2]", out
  calls = _stubbed(monkeypatch)
  # Every experiment's main applies it (training or not), except where
  # the config has a setting of its own, which the benchmark applies.
  monkeypatch.setattr(cli, "run_app", lambda main_fn: main_fn(["prog"]))
  for config, want in ((induction.get_config("smoke"), [1]),
                       (sae.get_config("smoke"), [1]),
                       (eap_ioi.get_config("smoke"), [1]),
                       (eap_ioi_bench.get_config(), [])):
    calls.clear()
    holder = lambda value: type("Flag", (), {"value": value})()
    fl = cli.ExperimentFlags(holder(config), holder(str(tmp_path)),
                             holder(False))
    cli.main(lambda *a, **k: None, fl)
    assert calls == want, config
