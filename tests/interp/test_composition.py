"""Weight-based circuit scores (mha_jax.interp.composition): known answers.

The pure ratios on matrices whose answer is known by hand; the circuits
against what the model itself computes (scores and head outputs, with
LayerNorm scales and rotary positions); every score of the hand-wired
circuit of `tests/wired_circuit.py`, worked out from its wiring below.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.interp import composition
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.transformer import DecoderLM

import wired_circuit as wc


def _isometry(d, rows, cols):
  """`[d, d]` with 1 at (rows[i], cols[i]): maps those unit vectors."""
  m = np.zeros((d, d), np.float32)
  m[rows, cols] = 1.0
  return m


def test_frobenius_ratio_known_values():
  d = 8
  for r in (1, 2, 4):  # aligned rank-r partial isometries: 1 / sqrt(r)
    x = _isometry(d, range(r), range(r, 2 * r))
    y = _isometry(d, range(r, 2 * r), range(r))
    np.testing.assert_allclose(composition.frobenius_ratio(x, y),
                               1 / np.sqrt(r), rtol=1e-6)
    np.testing.assert_allclose(composition.frobenius_ratio(3.0 * x, -y),
                               1 / np.sqrt(r), rtol=1e-6)  # scale-free
  x = _isometry(d, [0, 1], [2, 3])
  y = _isometry(d, [4, 5], [0, 1])  # reads where x does not write
  assert composition.frobenius_ratio(x, y) == 0.0
  assert composition.frobenius_ratio(x, np.zeros((d, d))) == 0.0
  batch = composition.frobenius_ratio(np.stack([x, x]), np.stack([y, x.T]))
  np.testing.assert_allclose(batch, [0.0, 1 / np.sqrt(2)], rtol=1e-6)


def test_copying_score_known_values():
  rot90 = np.array([[0.0, -1.0], [1.0, 0.0]], np.float32)  # eigen +-i
  cases = {"identity": (np.eye(3), (1.0, 1.0)),
           "minus identity": (-np.eye(3), (-1.0, 0.0)),
           "rotation": (rot90, (0.0, 0.0)),
           "diag(2, -1)": (np.diag([2.0, -1.0]), (1 / 3, 2 / 3)),
           "zero": (np.zeros((2, 2)), (0.0, 0.0))}
  for name, (m, expect) in cases.items():
    got = composition.copying_score(jnp.asarray(m, jnp.float32))
    np.testing.assert_allclose(got, expect, atol=1e-6, err_msg=name)


def test_rotation_composes_like_rotary_positions():
  """R(a) R(b)^T = R(a - b): why a QK circuit needs only the offset."""
  r = lambda d: np.asarray(composition.rotation(d, 8, 100.0))
  np.testing.assert_allclose(r(5) @ r(2).T, r(3), atol=1e-5)
  np.testing.assert_allclose(r(0), np.eye(8), atol=1e-7)


def _random_rotary_model(num_heads=2, num_kv_heads=None):
  """2 layers of rotary heads of width 8 (2 by default; `num_kv_heads`:
  grouped-query), random LayerNorm scales, zero biases (which the
  circuits leave out), drawn with NumPy."""
  config = ModelConfig(vocab_size=12, d_model=16, num_layers=2,
                       num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=8, max_len=8, attention_only=True,
                       positions="rotary", rotary_base=100.0,
                       implementation="einsum")
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: DecoderLM(config, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(0)
  state = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 0.5,
                                             x.dtype), state)
  model = nnx.merge(graphdef, state)
  for ln in [b.ln_attn for b in model.blocks] + [model.final_ln]:
    ln.scale[...] = jnp.asarray(rng.uniform(0.5, 1.5, 16), jnp.float32)
    ln.bias[...] = jnp.zeros((16,))
  return model


@functools.partial(jax.jit, static_argnums=0)
def _layer_1(graphdef, state, tokens):
  sites = ("blocks.1.resid_pre", "blocks.1.attn.scores",
           "blocks.1.attn.pattern", "blocks.1.attn.result")
  _, acts = nnx.merge(graphdef, state)(tokens, capture=sites)
  return [acts[s] for s in sites]


@pytest.mark.parametrize("heads", [(2, None), (4, 2)])
def test_circuits_reproduce_what_the_model_computes(heads):
  """x_i A(i - j) x_j^T / sqrt(Dh) are layer 1's scores and sum_j p_ij x_j
  M its centred head outputs, x the normalised residual stream; with 4
  query heads on 2 kv heads too, so each query head's circuits must use
  the W_K and W_V of the kv head the model pairs it with."""
  model = _random_rotary_model(*heads)
  tokens = np.random.default_rng(1).integers(0, 10, (2, 6))
  resid, scores, pattern, result = map(np.asarray, _layer_1(
      *nnx.split(model), tokens))
  x = resid - resid.mean(-1, keepdims=True)
  x = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)  # [B, T, D]
  w = composition.head_weights(model, 1)
  ov = np.asarray(composition.ov_circuits(w["w_v"], w["w_o"], w["g"]))
  for i in range(6):
    for j in range(i + 1):  # visible keys
      rot = composition.rotation(i - j, 8, 100.0)
      a = np.asarray(composition.qk_circuits(w["w_q"], w["w_k"], w["g"], rot))
      expect = np.einsum("bd,hde,be->bh", x[:, i], a, x[:, j]) / np.sqrt(8)
      np.testing.assert_allclose(scores[:, :, i, j], expect, atol=2e-4)
  centred = result - result.mean(-1, keepdims=True)  # [B, T, H, D]
  expect = np.einsum("bhij,bjd,hde->bihe", pattern, x, ov)
  np.testing.assert_allclose(centred, expect, atol=2e-4)


@functools.partial(jax.jit, static_argnums=0)
def _wired_scores(graphdef, state):
  model = nnx.merge(graphdef, state)
  return (composition.composition_scores(model, 0, 1),
          composition.composition_scores(model, 0, 1, offsets=(1, 3)),
          composition.copying_scores(model, 1),
          composition.full_ov_circuits(model, 1, tokens=[3, 4, 5]))


def test_the_wired_circuit_composes_only_through_the_keys():
  """By hand from the wiring (no LayerNorm scale, every written vector
  already centred): M_1 = sum_i tok_i -> (S_i - bal), A_2 = 2 s^2 sum_i
  tok_i -> S_i - 4 s^2 bal_T -> pos_0, so M_1 A_2^T = 2 s^2 I on the V
  token dimensions and the K-composition of L1H1 into L2H2 is
  2 s^2 sqrt(V) / (sqrt(2 V) 2 s^2 sqrt(V + 4)) = 1 / sqrt(2 (V + 4)).
  Nothing else reads S, and R is read by nobody: every other score is 0.
  """
  scores, shifted, copy, full = _wired_scores(*nnx.split(wc.build()))
  expect = {k: np.zeros((2, 2)) for k in "qkv"}
  expect["k"][0, 1] = 1 / np.sqrt(2 * (wc.V + 4))
  for k in "qkv":
    np.testing.assert_allclose(scores[k], expect[k], atol=1e-6, err_msg=k)
  # Without rotary positions the offsets change nothing.
  np.testing.assert_allclose(shifted["k"], scores["k"], atol=1e-7)
  # The induction head's full OV circuit is 10 x the identity on tokens
  # (copying 1); L1H1 writes nothing the readout reads (0).
  np.testing.assert_allclose(copy["copying"], [0.0, 1.0], atol=1e-5)
  np.testing.assert_allclose(copy["positive_share"], [0.0, 1.0], atol=1e-5)
  np.testing.assert_allclose(full[1], 10.0 * np.eye(3), atol=1e-5)


@functools.partial(jax.jit, static_argnums=0)
def _dla_and_logits(graphdef, state, tokens, targets, mask):
  model = nnx.merge(graphdef, state)
  return (composition.direct_logit_attribution(model, tokens, targets, mask),
          model(tokens))


def _logit_difference(logits, targets, mask):
  """The model's own: target logit minus mean logit, averaged on mask."""
  tgt = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  return np.sum((tgt - logits.mean(-1)) * mask) / np.sum(mask)


def test_direct_logit_attribution_adds_up_and_finds_the_writer():
  pairs = jax.tree.map(np.asarray, wc.pairs())
  args = (pairs["inputs"], pairs["targets"], pairs["loss_mask"])
  dla, logits = _dla_and_logits(*nnx.split(wc.build()), *args)
  heads = np.asarray(dla["heads"])
  # Layer 1 writes only into S and R (and their balance dimensions), the
  # readout reads only the token block; L2H1 has W_O = 0.
  np.testing.assert_allclose(heads[0], 0.0, atol=1e-5)
  assert heads[1, 0] == 0.0
  # L2H2 by hand. Entering layer 1: +-1 at token, position and their two
  # balance dims (norm^2 4 of D = 48: sigma^2 = 1/12); layer 1 writes
  # +-sqrt(12) four times, so layer 2 sees norm^2 4 + 48 (sigma'^2 =
  # 52/48) and its head writes a = 10 / sigma' at the predicted token and
  # -a at the token balance dim, which then holds -(1 + a). The final
  # LayerNorm divides by sigma_f, and the mean over the V tokens takes
  # a / V off the target's a.
  a = 10.0 / np.sqrt(52 / 48)
  sigma_f = np.sqrt((1 + a ** 2 + (1 + a) ** 2 + 2 + 48) / 48)
  np.testing.assert_allclose(heads[1, 1], a / sigma_f * (1 - 1 / wc.V),
                             rtol=1e-4)
  np.testing.assert_allclose(
      dla["total"], _logit_difference(np.asarray(logits), pairs["targets"],
                                      pairs["loss_mask"]), rtol=1e-5)
  # A random model with LayerNorm biases: the terms still add up.
  model = _random_rotary_model()
  model.final_ln.bias[...] = jnp.asarray(
      np.random.default_rng(2).normal(size=16), jnp.float32)
  dla, logits = _dla_and_logits(*nnx.split(model), *args[:2],
                                np.ones_like(pairs["loss_mask"]))
  np.testing.assert_allclose(
      dla["total"], _logit_difference(np.asarray(logits), pairs["targets"],
                                      np.ones_like(pairs["loss_mask"])),
      rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(dla["rest"], 0.0, atol=1e-5)  # no b_o, no MLP


def test_random_baselines_are_chance_levels():
  comp = composition.composition_baseline(0, 16, 4, 4, 64)
  copy = composition.copying_baseline(1, 10, 16, 4, 64)
  for k in "qkv":
    assert comp[k].shape == (64,)
    assert 0.0 < float(comp[k].min()) and float(comp[k].max()) < 1.0
  # Q and K compose with the same random matrices, transposed: the same
  # distribution (means within a few standard errors).
  se = np.sqrt((np.var(comp["q"]) + np.var(comp["k"])) / 64)
  assert abs(float(np.mean(comp["q"]) - np.mean(comp["k"]))) < 4 * se
  assert abs(float(np.mean(copy["copying"]))) < 4 * float(
      np.std(copy["copying"])) / np.sqrt(64)  # random: no sign preferred


def test_random_baseline_is_the_ratio_of_its_draws():
  """The known answer, in float64 from the draws the docstring names,
  with head_dim != value_dim (so drawing one width for the other changes
  the matrices). K-composition reads the receiver's QK circuit
  transposed, ||M_1 A_2^T||: it differs from the Q score draw by draw
  (the two share only their distribution)."""
  d, dh, dv, draws = 8, 2, 5, 6
  got = composition.composition_baseline(3, d, dh, dv, draws)
  rng = np.random.default_rng(3)
  v1, o1, v2, o2, q2, k2 = (rng.standard_normal((draws,) + s).astype(
      np.float32).astype(np.float64) for s in (
          (d, dv), (dv, d), (d, dv), (dv, d), (d, dh), (d, dh)))
  p = np.eye(d) - 1.0 / d
  m1, m2, a2 = v1 @ o1 @ p, v2 @ o2 @ p, q2 @ np.swapaxes(k2, 1, 2)
  norm = lambda x: np.linalg.norm(x, axis=(1, 2))
  ratio = lambda x, y: norm(x @ y) / (norm(x) * norm(y))
  want = {"q": ratio(m1, a2), "k": ratio(m1, np.swapaxes(a2, 1, 2)),
          "v": ratio(m1, m2)}
  for k in "qkv":
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, err_msg=k)
  assert np.min(np.abs(want["q"] - want["k"])) > 1e-3


def test_copying_scores_equal_the_eigenvalues_of_the_whole_circuit():
  """The low-rank route (eigenvalues of b @ a, Dv x Dv) against NumPy's
  eigenvalues of the whole V x V full OV circuit, on a random model whose
  vocabulary (12) is wider than its heads (Dv = 8)."""
  model = _random_rotary_model()
  full = np.asarray(composition.full_ov_circuits(model, 1), np.float64)
  assert full.shape[-1] > 8
  got = composition.copying_scores(model, 1)
  for h in range(full.shape[0]):
    lam = np.linalg.eigvals(full[h])
    mass = np.abs(lam).sum()
    np.testing.assert_allclose(got["copying"][h], lam.real.sum() / mass,
                               atol=1e-4)
    np.testing.assert_allclose(got["positive_share"][h],
                               np.maximum(lam.real, 0).sum() / mass,
                               atol=1e-4)


def test_grouped_query_heads_pass_and_qk_norm_is_refused():
  """Any number of kv heads is fine (the circuits are per query head);
  QK-norm is not: its scales weigh each query and key feature, and the
  QK circuit leaves them out."""
  config = ModelConfig(vocab_size=12, d_model=16, num_layers=1, num_heads=4,
                       num_kv_heads=1, max_len=8, attention_only=True)
  composition.check_circuit_model(nnx.eval_shape(
      lambda: DecoderLM(config, rngs=nnx.Rngs(0))))
  normed = nnx.eval_shape(lambda: DecoderLM(config.replace(qk_norm="rms"),
                                            rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match=r"head_weights: .*no QK-norm.*; the "
                     r"model has qk_norm='rms'"):
    composition.head_weights(normed, 0)
