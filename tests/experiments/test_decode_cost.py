"""experiments/kv_cache's decode-cost counts against the traced programs."""

import jax.numpy as jnp
import ml_collections
import pytest

from experiments.kv_cache import decode_cost
from mha_jax.core import flops


@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_decode_step_matmul_flops_match_the_formula(num_kv_heads):
  """decode_cost's analytic count equals the matmuls in the jaxpr of the
  model's cached step and of recomputing the prefix (readout included)."""
  cfg = ml_collections.ConfigDict({"model": {
      "vocab_size": 11, "d_model": 16, "num_layers": 2, "num_heads": 4,
      "mlp_dim": 24, "max_len": 16, "positions": "rotary",
      "implementation": "einsum"}})
  model = decode_cost.make_model(cfg, num_kv_heads)
  state, step, recompute = decode_cost.split_model(model)
  caches = decode_cost.filled_caches(model, 3, 10, 7)
  counted = flops.jaxpr_matmul_flops(step, state, jnp.ones((3,), jnp.int32),
                                     caches)
  assert counted == decode_cost.analytic_flops(
      cfg, num_kv_heads, 3, 7, cached=True, slots=10)
  counted = flops.jaxpr_matmul_flops(recompute, state,
                                     jnp.ones((3, 7), jnp.int32))
  assert counted == decode_cost.analytic_flops(cfg, num_kv_heads, 3, 7,
                                               cached=False)
