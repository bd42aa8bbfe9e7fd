"""Head-sharded attention on a 2x4 mesh equals one device; HLO has no gathers."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from mha_jax.parallel import sharding


def _setup(num_kv_heads, b=4, t=16, d=32, h=8):
  assert jax.device_count() == 8, jax.devices()
  key = jax.random.PRNGKey(0)
  params = mha_jax.init_mha_params(key, d, h, num_kv_heads=num_kv_heads,
                                   use_bias=True)
  # Non-zero biases so that their sharding is exercised too.
  params = jax.tree.map(
      lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(1), p.shape),
      params)
  x = jax.random.normal(jax.random.PRNGKey(2), (b, t, d))
  mesh = sharding.make_mesh(data=2, model=4)
  return params, x, mesh


def _loss(params, x, implementation):
  y = mha_jax.multi_head_attention(params, x, is_causal=True,
                                   implementation=implementation)
  return jnp.mean(y ** 2), y


# Every kv layout with the default path; the slower-to-compile vmap path
# with replicated kv heads (2 < 4 devices on "model").
@pytest.mark.parametrize("num_kv_heads,implementation", [
    (8, "einsum"), (4, "einsum"), (2, "einsum"), (1, "einsum"), (2, "vmap")])
def test_sharded_forward_and_grad_equal_single_device(num_kv_heads,
                                                      implementation):
  params, x, mesh = _setup(num_kv_heads)
  fn = jax.jit(jax.value_and_grad(_loss, has_aux=True), static_argnums=2)
  (l1, y1), g1 = fn(params, x, implementation)
  ps = sharding.shard_tree(params, mesh)
  xs = sharding.shard_batch(x, mesh)
  (l2, y2), g2 = fn(ps, xs, implementation)
  # Sharded sums reduce in another order: equal up to float32 rounding.
  np.testing.assert_allclose(y2, y1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  for name in g1:
    np.testing.assert_allclose(g2[name], g1[name], rtol=1e-4, atol=1e-6,
                               err_msg=name)
  # Parameters really are split: w_q holds H / 4 heads per device.
  assert ps["w_q"].addressable_shards[0].data.shape == (32, 2, 4)
  kv_heads_per_device = ps["w_k"].addressable_shards[0].data.shape[1]
  assert kv_heads_per_device == (num_kv_heads // 4 if num_kv_heads >= 4
                                 else num_kv_heads)


def _collectives(hlo: str) -> dict[str, list[str]]:
  found = {}
  for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute",
             "reduce-scatter"):
    found[op] = [line for line in hlo.splitlines()
                 if re.search(rf"= \S+ {op}(-start)?\(", line)]
  return found


@pytest.mark.parametrize("implementation", ["vmap", "einsum"])
def test_head_sharded_layer_hlo_has_one_reduction_and_no_gathers(
    implementation):
  params, x, mesh = _setup(8)
  ps = sharding.shard_tree(params, mesh)
  xs = sharding.shard_batch(x, mesh)
  fwd = jax.jit(lambda p, x: mha_jax.multi_head_attention(
      p, x, is_causal=True, implementation=implementation))
  hlo = fwd.lower(ps, xs).compile().as_text()
  ops = _collectives(hlo)
  # Each device computes whole heads: nothing of the weights or the
  # [B, H, T, T] scores is gathered, and the output projection's partial sums
  # over heads are combined by exactly one all-reduce.
  assert ops["all-gather"] == [], ops["all-gather"]
  assert ops["all-to-all"] == [] and ops["collective-permute"] == [], ops
  assert len(ops["all-reduce"]) == 1, ops["all-reduce"]
  # That reduction carries the [B/2, T, D] output on each device, not scores.
  assert "f32[2,16,32]" in ops["all-reduce"][0], ops["all-reduce"][0]
