"""Splicing through the z hook and direct feature attribution, on a tiny
grouped-query decoder."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from mha_jax import hooks
from mha_jax.sae import attribution
from mha_jax.sae import buffer
from mha_jax.sae import metrics
from mha_jax.sae import sae

SITE = "blocks.1.attn.z"
H, K, DV = 4, 2, 4


SCALE = 1.7


@pytest.fixture(scope="module")
def setup():
  """The model, tokens, an SAE, and one compiled forward giving the clean
  logits and captures and the logits with each kind's splice."""
  config = mha_jax.ModelConfig(vocab_size=11, d_model=16, num_layers=2,
                               num_heads=H, num_kv_heads=K, max_len=8,
                               use_bias=True)
  model = mha_jax.DecoderLM(config, rngs=nnx.Rngs(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (2, 7)),
                       jnp.int32)
  params = sae.init(jax.random.PRNGKey(1), H * DV, 24)
  params["b_enc"] = jnp.linspace(-0.5, 0.5, 24)
  params["b_dec"] = jnp.linspace(-0.2, 0.2, H * DV)
  sites = [SITE, "blocks.1.attn.pattern", "blocks.1.attn.v"]

  def run(m, t, p):
    splice = lambda kind: {SITE: lambda z: metrics.splice(
        p, z, kind=kind, k=3, scale=SCALE)}
    return (m(t, capture=sites), m(t, patch=splice("relu")),
            m(t, patch=splice("topk")))
  (logits, cap), relu, topk = nnx.jit(run)(model, tokens, params)
  return model, tokens, params, logits, cap, {"relu": relu, "topk": topk}


@pytest.fixture(scope="module")
def by_hand(setup):
  """The model's logits with z replaced by a given array (one compile)."""
  model, tokens = setup[:2]
  run = nnx.jit(lambda m, t, z: m(t, patch=hooks.replace(SITE, z)))
  return lambda z: run(model, tokens, z)


@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_splice_equals_z_replaced_by_hand(setup, by_hand, kind):
  _, _, params, clean, cap, spliced = setup
  # By hand: the captured z, through the SAE in float64 NumPy, put back.
  z = np.asarray(cap[SITE], np.float64)
  x = z.reshape(-1, H * DV) * SCALE
  p = {n: np.asarray(a, np.float64) for n, a in params.items()}
  pre = (x - p["b_dec"]) @ p["w_enc"] + p["b_enc"]
  f = np.maximum(pre, 0)
  if kind == "topk":
    f = np.where(f >= np.sort(f, -1)[:, -3:-2], f, 0)
  z_hat = ((f @ p["w_dec"] + p["b_dec"]) / SCALE).reshape(z.shape)
  want = by_hand(jnp.asarray(z_hat, jnp.float32))
  np.testing.assert_allclose(spliced[kind], want, atol=1e-5, rtol=1e-5)
  assert not np.allclose(spliced[kind], clean, atol=1e-3)  # it did change


def test_kl_and_loss_of_the_splice_match_numpy(setup):
  # KL(clean || splice) and the spliced CE from the logits above, in
  # float64 NumPy, over a mask that leaves positions out.
  model, tokens, params, clean, _, spliced = setup
  targets = jnp.roll(tokens, -1, 1)
  mask = np.ones(tokens.shape, np.float32)
  mask[:, :2] = 0
  args = (params, SCALE, jnp.zeros(H * DV), tokens, targets, mask)
  kw = dict(kind="relu", k=None)
  ce_kl_fn = metrics.site_ce_kl_fn(model, SITE, **kw)
  loss_fn = metrics.site_loss_fn(model, SITE, **kw)
  logp = lambda a: np.asarray(jax.nn.log_softmax(np.asarray(a, np.float64)))
  lp, lq = logp(clean), logp(spliced["relu"])
  kl = np.sum(np.exp(lp) * (lp - lq), -1)
  want_kl = np.sum(kl * mask) / mask.sum()
  nll = -np.take_along_axis(lq, np.asarray(targets)[..., None], -1)[..., 0]
  want_ce = np.sum(nll * mask) / mask.sum()
  ce, kl = ce_kl_fn("splice", *args)
  assert float(kl) == pytest.approx(want_kl, rel=1e-4)
  assert want_kl > 1e-3  # the splice moved the distribution
  assert float(ce) == pytest.approx(want_ce, rel=1e-5)
  assert float(ce_kl_fn("clean", *args)[1]) == pytest.approx(0.0, abs=1e-6)
  assert float(loss_fn("splice", *args)) == pytest.approx(want_ce, rel=1e-5)


def test_dfa_by_source_sums_to_the_pre_activation(setup):
  _, _, params, _, cap, _ = setup
  feats = np.array([0, 5, 23])
  source = np.array([-1, 0, 1, 1, 2, 3, 4])
  pattern, v, z = (cap[f"blocks.1.attn.{s}"] for s in ("pattern", "v", "z"))

  @jax.jit
  def parts_of(params, pattern, v, z):
    return (attribution.dfa_by_source(params, pattern, v, features=feats,
                                      scale=SCALE),  # [B, T, F', H, S]
            sae.pre_acts(params, buffer.flatten_site(z) * SCALE)[:, feats],
            attribution.dfa_bias(params, feats),
            attribution.dfa_by_head(params, z, scale=SCALE)[..., feats],
            attribution.dfa_at_source(params, pattern, v, source,
                                      scale=SCALE)[..., feats])
  parts, pre, bias, by_head, one = map(np.asarray, parts_of(params, pattern,
                                                             v, z))
  total = parts.sum((-1, -2)).reshape(pre.shape) + bias[None]
  np.testing.assert_allclose(total, pre, atol=1e-5, rtol=1e-5)
  # Over sources it is the per-head DFA; one source, a slice of it.
  np.testing.assert_allclose(parts.sum(-1), np.moveaxis(by_head, 2, 3),
                             atol=1e-5)
  want = parts[:, np.arange(7), :, :, np.maximum(source, 0)]  # [T, B, F', H]
  want = np.where((source >= 0)[:, None, None, None], want, 0.0)
  np.testing.assert_allclose(one, np.moveaxis(want, (0, 2), (1, 3)),
                             atol=1e-6)


def test_head_shares_and_top_contexts():
  w = np.zeros((3, 8), np.float32)
  w[0, 4:6] = [0.6, 0.8]  # all in head 2 of 4
  w[1] = 1 / np.sqrt(8)  # spread evenly
  w[2, [0, 7]] = [0.6, 0.8]  # heads 0 and 3: 0.36 and 0.64
  s = np.asarray(attribution.head_shares(jnp.asarray(w), 4))
  np.testing.assert_allclose(s, [[0, 0, 1, 0], [.25] * 4, [.36, 0, 0, .64]],
                             atol=1e-6)
  acts = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
  assert attribution.top_contexts(acts, 5) == [(0, 1, 3.0), (1, 0, 2.0),
                                               (0, 2, 1.0)]
  with pytest.raises(ValueError, match="`num_heads`=3 must divide"):
    attribution.head_shares(jnp.asarray(w), 3)


def test_losses_over_batches_match_each_batch_by_hand(setup):
  # `losses` over two batches: each mode's CE and KL the mean of the
  # batches' own values (NumPy float64 from the logits of the test above
  # for the splice, the jitted functions for the ablations), and loss
  # recovered the ratio of those means.
  model, tokens, params, clean, _, spliced = setup
  targets = jnp.roll(tokens, -1, 1)
  mask = np.ones(tokens.shape, np.float32)
  batches = [{"inputs": tokens[i:i + 1], "targets": targets[i:i + 1],
              "loss_mask": mask[i:i + 1]} for i in range(2)]
  kw = dict(kind="relu", k=None)
  loss_fn = metrics.site_loss_fn(model, SITE, **kw)
  ce_kl_fn = metrics.site_ce_kl_fn(model, SITE, **kw)
  args = (params, SCALE, jnp.zeros(H * DV))
  got = metrics.losses(loss_fn, batches, *args, ce_kl_fn=ce_kl_fn)
  logp = lambda a: np.asarray(jax.nn.log_softmax(np.asarray(a, np.float64)))
  lp, lq = logp(clean), logp(spliced["relu"])
  t = np.asarray(targets)[..., None]
  nll = lambda l: -np.take_along_axis(l, t, -1)[..., 0].mean(-1)  # [B]
  kl = np.sum(np.exp(lp) * (lp - lq), -1).mean(-1)  # [B]
  assert got["clean"] == pytest.approx(nll(lp).mean(), rel=1e-5)
  assert got["splice"] == pytest.approx(nll(lq).mean(), rel=1e-5)
  assert got["kl_splice"] == pytest.approx(kl.mean(), rel=1e-4)
  for mode in ("zero", "mean"):
    each = [ce_kl_fn(mode, *args, b["inputs"], b["targets"], b["loss_mask"])
            for b in batches]
    assert got[mode] == pytest.approx(np.mean([float(c) for c, _ in each]))
    assert got[f"kl_{mode}"] == pytest.approx(
        np.mean([float(k) for _, k in each]))
  assert got["recovered_zero"] == pytest.approx(
      (got["zero"] - got["splice"]) / (got["zero"] - got["clean"]))
  # Without the KL function the CEs are the same and no KL is reported.
  plain = metrics.losses(loss_fn, batches, *args)
  assert plain["splice"] == pytest.approx(got["splice"], rel=1e-6)
  assert "kl_splice" not in plain
