"""Context parallelism on one device: layouts, and bad input refused by name.

The values are checked on 8 simulated devices (multidevice/
test_context_parallel.py); these checks need no devices at all: every
error is raised from shapes and the mesh's axis sizes, before tracing.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from configs import default
from mha_jax.core import score_rules
from mha_jax.parallel import all_to_all
from mha_jax.parallel import context
from mha_jax.parallel import ring
from mha_jax.parallel import sharding
from mha_jax.training import config as config_lib


def test_zigzag_known_answer_and_round_trip():
  # T = 8 on 2 devices: chunks of 2; device 0 holds chunks 0 and 3.
  np.testing.assert_array_equal(context.layout_order(8, 2, "zigzag"),
                                [0, 1, 6, 7, 2, 3, 4, 5])
  np.testing.assert_array_equal(context.layout_order(8, 2, "contiguous"),
                                np.arange(8))
  x = jnp.arange(24).reshape(1, 24)
  z = context.to_layout(x, 4, "zigzag")
  np.testing.assert_array_equal(context.from_layout(z, 4, "zigzag"), x)
  # The positions each device computes are the ones the order gave it.
  for r in range(4):
    np.testing.assert_array_equal(
        context.local_positions(r, 6, 4, "zigzag"), z[0, 6 * r:6 * r + 6])


def _mesh(**axes):
  return jax.sharding.AbstractMesh(tuple(axes.values()), tuple(axes))


def _qkv(t=32, h=4, kv=2):
  shape = lambda heads: jax.ShapeDtypeStruct((2, t, heads, 8), jnp.float32)
  return (jnp.zeros(shape(h).shape), jnp.zeros(shape(kv).shape),
          jnp.zeros(shape(kv).shape))


@pytest.mark.parametrize("fn", [ring.ring_attention,
                                all_to_all.all_to_all_attention])
@pytest.mark.parametrize("kwargs,match", [
    (dict(mesh=_mesh(data=8)), "no 'sequence' axis"),
    (dict(mesh=_mesh(sequence=3)), "does not divide the length 32"),
    (dict(mesh=_mesh(sequence=4),
          rules=score_rules.ScoreRules(q_positions=jnp.zeros((2, 32),
                                                             jnp.int32))),
     "`q_positions`"),
    (dict(mesh=_mesh(sequence=4), mask=jnp.ones((32, 32), bool)),
     "`mask` of shape \\(32, 32\\) varies over queries"),
    (dict(mesh=_mesh(sequence=4, model=3)), "H=4 query heads do not split"),
    (dict(mesh=_mesh(data=3, sequence=4)), "batch B=2 does not split"),
    (dict(), "no mesh"),
])
def test_bad_input_is_refused_by_name(fn, kwargs, match):
  q, k, v = _qkv()
  with pytest.raises(ValueError, match=f"{fn.__name__}: .*{match}"):
    fn(q, k, v, **kwargs)


def test_ring_layout_checks():
  q, k, v = _qkv(t=36)
  # 36 splits over 4 devices but not into the 8 chunks of "zigzag".
  with pytest.raises(ValueError, match="into 8 equal chunks"):
    ring.ring_attention(q, k, v, mesh=_mesh(sequence=4), layout="zigzag")
  with pytest.raises(ValueError, match="`layout` must be one of"):
    ring.ring_attention(q, k, v, mesh=_mesh(sequence=4), layout="striped")


def test_all_to_all_needs_heads_divisible_by_the_axis():
  q, k, v = _qkv(h=4)
  with pytest.raises(ValueError, match="4 query heads per device .* do not "
                     "split over the 8 devices"):
    all_to_all.all_to_all_attention(q, k, v, mesh=_mesh(sequence=8))


def test_attend_offers_the_paths_by_name_and_refuses_dropout():
  q, k, v = _qkv()
  with pytest.raises(ValueError, match="dropout"):
    mha_jax.attend(q, k, v, implementation="ring", dropout_rate=0.1,
                   dropout_rng=jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="never forms the attention weights"):
    mha_jax.attend(q, k, v, implementation="all_to_all",
                   hooks=mha_jax.Hooks(capture=("pattern",)))
  with pytest.raises(ValueError, match="no mesh"):  # none set on one device
    mha_jax.attend(q, k, v, implementation="ring")
  for path in ("ring", "all_to_all"):
    with pytest.raises(ValueError, match=f"implementation='{path}'.*`bias` "
                       "is a \\[Tq, Tk\\] array"):
      mha_jax.attend(q, k, v, bias=jnp.zeros((32, 32)), implementation=path)


def test_make_mesh_sequence_axis():
  devices = [object()] * 8
  with pytest.raises(ValueError, match="sequence.*does not divide the 8"):
    sharding.make_mesh(model=2, sequence=3, devices=devices)
  with pytest.raises(ValueError, match="`sequence` must be a positive int"):
    sharding.make_mesh(sequence=0, devices=devices)


@pytest.mark.parametrize("mesh,model,task,match", [
    (dict(sequence=2), {}, {}, "needs model.implementation 'ring' or "
     "'all_to_all'"),
    (dict(sequence=3), dict(implementation="ring"), dict(seq_len=16),
     "must divide task.seq_len=16"),
    (dict(sequence=0), {}, {}, "must be a positive int"),
])
def test_validate_config_checks_the_sequence_axis(mesh, model, task, match):
  c = default.get_config()
  c.mesh.update(**mesh)
  c.model.update(**model)
  c.task.update(**task)
  with pytest.raises(ValueError, match=f"config.mesh.sequence: .*{match}"):
    config_lib.validate_config(c)


def test_mesh_from_config_counts_the_sequence_axis():
  c = default.get_config()
  c.mesh.update(model=2, sequence=3)
  with pytest.raises(ValueError, match="config.mesh.sequence: .*2 x 3 does "
                     "not divide the 8"):
    sharding.mesh_from_config(c, devices=[object()] * 8)
