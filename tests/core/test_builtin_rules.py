"""The built-in arguments (`is_causal`, `local_window`, segment ids, the
soft cap, ALiBi slopes) against the rules they are written as
(`masks.causal_mod`, `window_mod`, `documents_mod`,
`score_rules.soft_cap_mod`, `alibi_mod`): the same outputs and gradients,
bit for bit, on every path. The built-ins reach the scores by another
route (whole-grid predicates, the kernel's closed-form block ranges and
hand-written backward) than a user's rule (mapped over scalars, a block
mask, autodiff of the rule), so equality checks that route."""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import masks
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash

R = score_rules.ScoreRules

# One shape per rule, no shrinking (every shape compiles every path).
# Derandomized, the one example is the simplest the strategies allow, so
# their ranges start at shapes with several blocks of 4 (padded keys,
# grouped heads, two batch rows).
_SETTINGS = dict(max_examples=1, deadline=None, derandomize=True,
                 phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                 suppress_health_check=[hypothesis.HealthCheck.too_slow])


def _pair(name, tq, tk, ids, left, right):
  """`(is_causal, built-in rules, the rule's rules)`, each a function of
  the ALiBi slopes `[H]` (traced: both get their gradient)."""
  if name == "causal":
    return True, lambda s: R(), lambda s: R(mask_mod=masks.causal_mod())
  if name == "window":
    return (False, lambda s: R(local_window=(left, right)),
            lambda s: R(mask_mod=masks.window_mod(left, right)))
  if name == "segments":  # the queries are the last tq positions
    return (False, lambda s: R(q_segment_ids=ids[:, tk - tq:],
                               kv_segment_ids=ids),
            lambda s: R(mask_mod=masks.documents_mod(ids)))
  if name == "soft_cap":
    return (False, lambda s: R(soft_cap=0.7),
            lambda s: R(score_mod=score_rules.soft_cap_mod(0.7)))
  assert name == "alibi"
  return (True, lambda s: R(alibi_slopes=s),
          lambda s: R(score_mod=score_rules.alibi_mod(s),
                      mask_mod=masks.causal_mod()))


def _run(path, q, k, v, w, slopes, causal, rules_of, bm=None):
  """out and d sum(out * w) / d (q, k, v, slopes) on `path`, jitted."""
  def loss(q, k, v, slopes):
    rules = rules_of(slopes)
    if path in ("vmap", "einsum"):
      out, _ = attention.attend(q, k, v, is_causal=causal, rules=rules,
                                implementation=path)
    else:  # blocks of 4, so that short sequences have several
      out = flash.flash_attention(
          q, k, v, is_causal=causal, rules=rules.replace(block_mask=bm),
          block_q=4, block_k=4, head_loop=path != "flash_batched")
    return jnp.sum(out * w), out
  (_, out), grads = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, slopes)
  return (out, *grads)


_SHAPES = dict(b=st.sampled_from([2, 1]), tq=st.integers(6, 9),
               extra=st.integers(3, 5),
               heads=st.sampled_from([(4, 2), (2, 1), (2, 2)]),
               left=st.integers(2, 5), right=st.integers(1, 3),
               seed=st.integers(0, 99))


@pytest.mark.parametrize("name", ["causal", "window", "segments",
                                  "soft_cap", "alibi"])
@hypothesis.settings(**_SETTINGS)
@hypothesis.given(**_SHAPES)
def test_builtin_equals_its_rule_bit_for_bit(name, b, tq, extra, heads, left,
                                             right, seed):
  tk, (h, kh) = tq + extra, heads
  rng = np.random.default_rng(seed)
  q, k, v, w = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in
                ((b, tq, h, 8), (b, tk, kh, 8), (b, tk, kh, 8),
                 (b, tq, h, 8)))
  ids = jnp.asarray(np.sort(rng.integers(0, 3, (b, tk)), axis=1), jnp.int32)
  slopes = score_rules.alibi_slopes(h)
  causal, builtin, rule = _pair(name, tq, tk, ids, left, right)
  # "flash" is the CPU kernel, one (batch, kv head) at a time; the batched
  # kernel (the GPU default) runs the same block code on all of them.
  paths = {p: None for p in ("vmap", "einsum", "flash")}
  mask_mod = rule(slopes).mask_mod
  if mask_mod is not None:  # the kernel skipping blocks by the block mask
    paths["flash+block_mask"] = block_mask.create(mask_mod, b, None, tq, tk,
                                                  4, 4)
  for path, bm in paths.items():
    kernel = path.split("+")[0]
    want = _run(kernel, q, k, v, w, slopes, causal, builtin)
    got = _run(kernel, q, k, v, w, slopes, False, rule, bm)
    for g, x, what in zip(got, want, ["out", "dq", "dk", "dv", "dslopes"]):
      np.testing.assert_array_equal(g, x, err_msg=f"{name} {path} {what}")
