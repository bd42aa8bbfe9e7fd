"""User rules through the layers: `multi_head_attention`, the NNX module,
`ModelConfig`, the `scores` hook and cached decoding; and the built-in
rules written as user rules (`masks.*_mod`, `score_rules.*_mod`) give the
built-ins' numbers."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import attention
from mha_jax.core import masks
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib
from mha_jax.core import score_rules
from mha_jax.core.attention_spec import AttentionSpec
from mha_jax.models import model_config
from mha_jax.models import modules
from mha_jax.models import transformer

B, T, D, H = 2, 8, 16, 4


def _inputs(seed=0):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (params_lib.init_mha_params(ks[0], D, H, num_kv_heads=2),
          jax.random.normal(ks[1], (B, T, D)),
          jax.random.normal(ks[2], (H, 2 * T - 1)))


def test_multi_head_attention_rules_equal_mask_and_bias_arrays():
  # A learned relative bias and packed documents, as rules and as the
  # dense `bias` / `mask` arrays they stand for; the table's gradient
  # through the rule equals its gradient through the gathered bias.
  params, x, table = _inputs()
  ids = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]])
  rel = jnp.arange(T)[:, None] - jnp.arange(T)[None, :] + T - 1

  def by_rules(table):
    rules = score_rules.ScoreRules(
        score_mod=lambda s, b, h, qi, ki: s + table[h, qi - ki + T - 1],
        mask_mod=masks.documents_mod(ids))
    return multi_head.multi_head_attention(
        params, x, is_causal=True, implementation="flash", rules=rules)

  def by_arrays(table):
    same = ids[:, None, :, None] == ids[:, None, None, :]  # [B,1,T,T]
    return multi_head.multi_head_attention(
        params, x, is_causal=True, implementation="vmap", mask=same,
        bias=table[:, rel][None])

  both = jax.jit(lambda f: jax.value_and_grad(
      lambda t: jnp.sum(jnp.sin(f(t))))(table), static_argnums=0)
  (got, got_grad), (want, want_grad) = both(by_rules), both(by_arrays)
  np.testing.assert_allclose(got, want, atol=1e-5)
  np.testing.assert_allclose(got_grad, want_grad, atol=2e-5)


def test_builtin_rules_written_as_rules_give_the_builtins_numbers():
  ks = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(ks[0], (B, 5, H, 8))
  k, v = (jax.random.normal(kk, (B, T, 2, 8)) for kk in ks[1:])
  ids = jnp.array([[0, 0, 1, 1, 1, 2, 2, 2], [0, 0, 0, 0, 1, 1, 1, 1]])
  slopes = score_rules.alibi_slopes(H)
  R = score_rules.ScoreRules
  pairs = [  # (built-in, is_causal), (as a rule)
      ((R(), True), R(mask_mod=masks.causal_mod())),
      ((R(local_window=(2, 1)), False), R(mask_mod=masks.window_mod(2, 1))),
      ((R(q_segment_ids=ids[:, 3:], kv_segment_ids=ids), False),
       R(mask_mod=masks.documents_mod(ids))),
      ((R(soft_cap=0.5), False), R(score_mod=score_rules.soft_cap_mod(0.5))),
      ((R(alibi_slopes=slopes), True),
       R(score_mod=score_rules.alibi_mod(slopes),
         mask_mod=masks.causal_mod())),
  ]
  # Prefix-LM: the first 3 keys bidirectional, causal after, as a mask.
  prefix = (np.arange(T)[None] <= np.arange(3, T)[:, None]) | (
      np.arange(T)[None] < 3)
  run = lambda causal, rules, mask=None: attention.attend(
      q, k, v, is_causal=causal, rules=rules, mask=mask,
      implementation="einsum")[0]

  @jax.jit
  def all_pairs():  # one compiled program for the lot
    got = [run(False, rule) for _, rule in pairs]
    want = [run(causal, builtin) for (builtin, causal), _ in pairs]
    got.append(run(False, R(mask_mod=masks.prefix_lm_mod(3))))
    want.append(run(False, R(), jnp.asarray(prefix)))
    return got, want
  for got, want, name in zip(*all_pairs(), ["causal", "window", "documents",
                                            "soft cap", "alibi", "prefix"]):
    np.testing.assert_allclose(got, want, atol=1e-6, err_msg=name)


def test_scores_hook_shows_the_modified_scores():
  params, x, _ = _inputs(2)
  run = jax.jit(lambda rules: multi_head.multi_head_attention(
      params, x, is_causal=True, implementation="einsum", capture="scores",
      rules=rules)[1]["scores"])
  got = run(score_rules.ScoreRules(score_mod=score_rules.soft_cap_mod(0.3)))
  np.testing.assert_allclose(got, run(score_rules.ScoreRules(soft_cap=0.3)),
                             atol=1e-6)
  assert np.nanmax(np.where(np.isfinite(got), np.abs(got), np.nan)) <= 0.3


def test_module_call_rule_equals_segment_ids():
  spec = AttentionSpec(d_model=D, num_heads=H, num_kv_heads=2, causal=True,
                       implementation="flash")
  layer = modules.MultiHeadAttention(spec, rngs=nnx.Rngs(0))
  _, x, _ = _inputs(3)
  ids = jnp.array([[0, 0, 1, 1, 1, 1, 2, 2], [0, 0, 0, 0, 0, 1, 1, 1]])
  want, _ = layer(x, rules=score_rules.ScoreRules(q_segment_ids=ids,
                                                  kv_segment_ids=ids))
  got, _ = layer(x, rules=score_rules.ScoreRules(
      mask_mod=masks.documents_mod(ids)))
  np.testing.assert_allclose(got, want, atol=1e-6)


_forward = nnx.jit(lambda m, x: m(x))


def test_model_config_rules_reach_the_layers_and_decode_from_a_cache():
  # Relative-distance rules given to the config reach the layers, and
  # cached decoding with them equals the full forward: the cache passes
  # each new token's true position as q_idx (a rule read at slot index
  # or at 0 would differ).
  base = dict(vocab_size=11, d_model=16, num_layers=1, num_heads=4,
              max_len=12, implementation="einsum")
  slopes = score_rules.alibi_slopes(4)
  ruled = transformer.DecoderLM(model_config.ModelConfig(
      **base, mask_mod=masks.window_mod(3),
      score_mod=score_rules.alibi_mod(slopes)), rngs=nnx.Rngs(0))
  # The config's rules reach the layer (what the module test's values
  # check on a layer).
  spec = ruled.blocks[0].attn.spec
  assert (spec.mask_mod, spec.score_mod) == (ruled.config.mask_mod,
                                             ruled.config.score_mod)
  tokens = jax.random.randint(jax.random.key(4), (2, 9), 0, 11)
  full = _forward(ruled, tokens)
  call = nnx.jit(lambda m, x, c, n: m(x, cache=c, lengths=n))
  first, cache = call(ruled, tokens[:, :5], ruled.init_cache(2),
                      jnp.array([5, 3]))
  np.testing.assert_allclose(first[1, :3], full[1, :3], atol=1e-5)
  for s in range(3):
    step, cache = call(ruled, tokens[jnp.arange(2), jnp.array([5, 3]) + s][
        :, None], cache, jnp.array([1, 1]))
    np.testing.assert_allclose(step[:, 0], full[[0, 1], [5 + s, 3 + s]],
                               atol=1e-5, err_msg=f"step {s}")
