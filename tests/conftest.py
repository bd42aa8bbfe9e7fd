"""Shared test setup: strict numerics so shape bugs fail loudly."""

import os
import subprocess
import sys

import pytest

# Most of the suite's time is XLA compiling small programs. Its CPU
# backend's older loop emitters compile them about 40% faster than the
# default fusion emitters (30 distinct jax.random programs: 8.4 -> 4.9 s;
# 7 small gradients: 1.3 -> 0.8 s), and the programs they emit compute the
# same operations. The flag is for XLA's CPU backend alone, and XLA aborts
# the process on a flag it does not know (flags come and go between
# releases: a GPU build of jax 0.11 rejected this one and every test worker
# died). So a child process first tries it, and the flag is set only where
# that child started JAX with it and its default backend is the CPU. The
# answer travels in the environment: pytest-xdist workers, the multidevice
# suite and experiment subprocesses inherit it without asking again.
_CPU_FLAG = "--xla_cpu_use_fusion_emitters=false"
_PROBED = "MHA_JAX_TEST_CPU_FLAG"  # "1": set, "0": not set (see above)
_PROBE = ("import jax, sys; "
          "sys.exit(0 if jax.default_backend() == 'cpu' else 3)")


def _cpu_flag_applies() -> bool:
  """True when JAX starts with `_CPU_FLAG` and its default backend is CPU."""
  if os.environ.get(_PROBED) in ("0", "1"):
    return os.environ[_PROBED] == "1"
  flags = " ".join([os.environ.get("XLA_FLAGS", ""), _CPU_FLAG]).strip()
  env = {**os.environ, "XLA_FLAGS": flags,
         "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  try:
    ok = subprocess.run([sys.executable, "-c", _PROBE], env=env,
                        capture_output=True, timeout=120).returncode == 0
  except subprocess.TimeoutExpired:
    ok = False
  os.environ[_PROBED] = "1" if ok else "0"
  return ok


# Set before JAX creates its CPU client.
if _cpu_flag_applies() and _CPU_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      [os.environ.get("XLA_FLAGS", ""), _CPU_FLAG]).strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

# Implicit rank promotion hides shape bugs (Equinox does the same).
jax.config.update("jax_numpy_rank_promotion", "raise")

# The suite's time is mostly XLA compiling hundreds of tiny programs, and
# compiling without XLA's optimisation passes about halves the suite (8 min
# 47 s -> 4 min 45 s on 2 cores, same tests passing). The tests check
# values, gradients, shapes and errors, which the passes must not change;
# speed is measured by the benchmarks, and `mesh_check` and the experiments
# run the optimised programs end to end.
jax.config.update("jax_disable_most_optimizations", True)

# Multi-device checks need 8 simulated CPU devices, which must be configured
# before JAX starts; tests/parallel/test_sharding.py runs them in a subprocess.
collect_ignore = []
if os.environ.get("MHA_JAX_MULTIDEVICE") != "1":
  collect_ignore.append("parallel/multidevice")
# The real GGUF models (SmolLM2-135M, Gemma 3 270M) against transformers:
# a tier of its own, `make test-real`, which .ci/run also runs.
if os.environ.get("MHA_JAX_REAL_MODELS") != "1":
  collect_ignore.append("real_models")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "cpu_only(reason): asserts a fact of JAX's CPU backend "
      "(a kernel choice, a schedule, a host-memory setting); skipped, with "
      "the reason, where the default backend is another")


def pytest_runtest_setup(item):
  marker = item.get_closest_marker("cpu_only")
  if marker is not None and jax.default_backend() != "cpu":
    why = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
    pytest.skip(f"CPU-only fact on the {jax.default_backend()} backend: {why}")


@pytest.fixture(autouse=True)
def _torch_default_denormals():
  """The train-step benchmark's torch peers make the process flush
  denormals to zero (experiments/benchmark/train_step.py); after each test
  torch's default is back, so a later test in the same worker does not
  inherit it (hypothesis's float strategies refuse to run under
  flushing)."""
  yield
  torch = sys.modules.get("torch")
  if torch is not None:
    torch.set_flush_denormal(False)
