"""Runs tests/parallel/multidevice in a subprocess with 8 simulated CPU devices.

XLA fixes the device count when JAX starts, so these checks cannot share a
process with the rest of the suite (which must see one device).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from configs import default
from mha_jax.training import config as config_lib
from mha_jax.parallel import sharding

HERE = pathlib.Path(__file__).parent


@pytest.mark.multidevice
def test_multidevice_suite_on_8_simulated_cpu_devices():
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      " --xla_force_host_platform_device_count=8").strip()
  env["MHA_JAX_MULTIDEVICE"] = "1"
  env["JAX_PLATFORMS"] = "cpu"
  # Every check compares a sharded program with its one-device twin,
  # compiled the same way; with XLA's optimisations off the suite compiles
  # about a sixth faster (mesh_check runs the optimised case end to end).
  env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "-p", "no:xdist", str(HERE / "multidevice")],
      env=env, cwd=HERE.parents[1], capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_make_mesh_rejects_sizes_that_do_not_use_the_devices():
  with pytest.raises(ValueError, match="model"):
    sharding.make_mesh(data=-1, model=3, devices=[object()] * 8)
  with pytest.raises(ValueError, match="exactly"):
    sharding.make_mesh(data=3, model=2, devices=[object()] * 8)


def test_param_spec_rules():
  spec = sharding.param_spec
  assert spec(("w_q",), (16, 8, 4), 4) == sharding.P(None, "model", None)
  assert spec(("w_o",), (8, 4, 16), 4) == sharding.P("model", None, None)
  # GQA with fewer kv heads than the model axis: replicated, by choice.
  assert spec(("w_k",), (16, 2, 4), 4) == sharding.P()
  assert spec(("b_o",), (16,), 4) == sharding.P()
  with pytest.raises(ValueError, match="num_heads"):
    spec(("w_q",), (16, 6, 4), 4)


def test_rules_read_nnx_and_optimizer_paths():
  """Real key paths: nnx.State leaves end in "value"; AdamW adds mu/nu."""
  spec = sharding.param_spec
  attn = ("blocks", "0", "attn")
  assert spec(attn + ("w_q", "value"), (16, 8, 4), 4) == spec(
      ("w_q",), (16, 8, 4), 4) == sharding.P(None, "model", None)
  assert spec(("1", "0", "mu") + attn + ("w_o", "value"), (8, 4, 16),
              4) == sharding.P("model", None, None)
  block = ("blocks", "1")
  # Megatron pairing: up-projection split on F (kernel and bias), down on F.
  assert spec(block + ("mlp_in", "kernel", "value"), (16, 64),
              4) == sharding.P(None, "model")
  assert spec(block + ("mlp_in", "bias", "value"), (64,),
              4) == sharding.P("model")
  assert spec(block + ("mlp_out", "kernel", "value"), (64, 16),
              4) == sharding.P("model", None)
  assert spec(block + ("mlp_out", "bias", "value"), (16,), 4) == sharding.P()
  for other in (("readout", "kernel"), ("embed", "embed", "embedding"),
                block + ("ln_attn", "scale"), ("1", "0", "count")):
    assert spec(other + ("value",), (16, 16), 4) == sharding.P(), other


@pytest.mark.parametrize("field,mesh,model,task,match", [
    ("mesh.model", dict(model=3), {}, {}, "does not divide the 8"),
    ("mesh.data", dict(data=3, model=2), {}, {}, "exactly the 8"),
    ("mesh.model", dict(model=8), dict(num_heads=4), {}, "num_heads=4"),
    ("task.batch_size", dict(data=4, model=2), {}, dict(batch_size=6),
     "data axis"),
])
def test_mesh_from_config_names_the_field(field, mesh, model, task, match):
  c = default.get_config()
  c.mesh.update(**mesh)
  c.model.update(**model)
  c.task.update(**task)
  with pytest.raises(ValueError, match=f"config.{field}: .*{match}"):
    sharding.mesh_from_config(c, devices=[object()] * 8)


def test_validate_config_wants_heads_divisible_by_the_model_axis():
  c = default.get_config()
  c.mesh.model = 3  # num_heads = 4
  with pytest.raises(ValueError, match="config.mesh.model: .*num_heads=4"):
    config_lib.validate_config(c)
