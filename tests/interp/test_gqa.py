"""Grouped-query attention at every head-level tool: a planted circuit.

A 2-layer model with H = 4 query heads on K = 2 kv heads, every weight
set by hand (the layout of `tests/wired_circuit.py`: one-hot blocks
and balance dimensions, so each LayerNorm only divides by a norm that is
the same at every position). Query heads 0, 1 read kv head 0 and 2, 3 kv
head 1 (`KV_OF`, written out: Hugging Face's `repeat_kv` grouping).

  layer 0, kv head 1: keys read the position, values the token.
    query head 2: previous-token head; writes the token it finds into S
                  ("the token before me was i"), which the readout reads.
    query head 3: the same keys and values, a query that matches its own
                  position; writes nothing.
  layer 0, kv head 0: keys read the token, values nothing.
    query head 1: duplicate-token head (W_O = 0); query head 0: W_Q = 0
                  (uniform), W_O = 0.
  layer 1, kv head 0: keys read S, values the token.
    query head 1: induction head (its query reads the token), writes R.
    query head 0: W_Q = 0, W_O = 0.
  layer 1, kv head 1: keys read the token, values read S.
    query head 3: duplicate-token head, writes what it reads into R.
    query head 2: W_Q = 0, W_O = 0.

No final LayerNorm: the readout reads S only, so the model predicts the
previous token through L0H2 alone, and nothing layer 1 writes (into R)
reaches the logits. So the answers are known: only L0H2 matters, only
L0H2 copies, and the only composition is L0H2 into L1H1's keys and into
L1H3's values, although L1H0 and L1H2 share those very keys and values.
A tool that pairs a query head with the wrong kv head (h % K instead of
h // (H // K), say) moves or loses each of them: heads 1 and 2 are where
the two mappings differ.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax import hooks
from mha_jax.interp import composition
from mha_jax.interp import explorer
from mha_jax.interp import patching
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.transformer import DecoderLM
from mha_jax.training import train_state

V, T, DH, H, K = 8, 6, 8, 4, 2
KV_OF = (0, 0, 1, 1)  # the kv head each query head reads, by hand
TOK, POS, S, R = 0, V, V + T, 2 * V + T  # block starts
BAL_T, BAL_P, BAL_S, BAL_R = 3 * V + T + np.arange(4)
D = 3 * V + T + 4
SCALE, OUT = 4.0, 2.0
# BOS, then a 3-token segment and its first two tokens again: no token
# follows itself, and BOS occurs once.
TOKENS = np.array([[0, 1, 2, 3, 1, 2], [0, 5, 6, 7, 5, 6]], np.int32)


def _weights() -> dict:
  """`{(layer, name): array}` in the model's layout: w_q `[D, H, Dh]`,
  w_k, w_v `[D, K, Dh]`, w_o `[H, Dh, D]`."""
  shapes = {"w_q": (D, H, DH), "w_k": (D, K, DH), "w_v": (D, K, DH),
            "w_o": (H, DH, D)}
  w = {(l, n): np.zeros(s, np.float32) for l in range(2)
       for n, s in shapes.items()}
  s = SCALE
  for p in range(T):
    w[0, "w_k"][POS + p, 1, p + 1] = s  # kv 1: key p sits at dim p + 1
    w[0, "w_q"][POS + p, 2, p] = s  # query p matches key p - 1
    w[0, "w_q"][POS + p, 3, p + 1] = s  # query p matches key p
  for i in range(V):
    w[0, "w_v"][TOK + i, 1, i] = 1.0
    w[0, "w_o"][2, i, [S + i, BAL_S]] = [1.0, -1.0]
    w[0, "w_k"][TOK + i, 0, i] = s
    w[0, "w_q"][TOK + i, 1, i] = s
    w[1, "w_k"][S + i, 0, i] = s  # kv 0: "the token before me was i"
    w[1, "w_v"][TOK + i, 0, i] = 1.0
    w[1, "w_q"][TOK + i, 1, i] = s  # induction: my token is i
    w[1, "w_o"][1, i, [R + i, BAL_R]] = [1.0, -1.0]
    w[1, "w_k"][TOK + i, 1, i] = s  # kv 1: my token
    w[1, "w_v"][S + i, 1, i] = 1.0
    w[1, "w_q"][TOK + i, 3, i] = s  # duplicate token
    w[1, "w_o"][3, i, [R + i, BAL_R]] = [1.0, -1.0]
  return w


W = _weights()


def _build() -> DecoderLM:
  config = ModelConfig(vocab_size=V, d_model=D, num_layers=2, num_heads=H,
                       num_kv_heads=K, head_dim=DH, max_len=T,
                       attention_only=True, positions="learned",
                       final_ln=False, implementation="einsum")
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: DecoderLM(config, rngs=nnx.Rngs(0))))
  state = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state)
  model = nnx.merge(graphdef, state)
  for block in model.blocks:
    block.ln_attn.scale[...] = jnp.ones((D,))
  embed = np.zeros((V, D), np.float32)
  embed[np.arange(V), TOK + np.arange(V)] = 1.0
  embed[:, BAL_T] = -1.0
  pos = np.zeros((T, D), np.float32)
  pos[np.arange(T), POS + np.arange(T)] = 1.0
  pos[:, BAL_P] = -1.0
  readout = np.zeros((D, V), np.float32)
  readout[S + np.arange(V), np.arange(V)] = OUT
  model.embed.embed.embedding[...] = jnp.asarray(embed)
  model.embed.pos_embed.embedding[...] = jnp.asarray(pos)
  model.readout.kernel[...] = jnp.asarray(readout)
  for (l, n), a in W.items():
    getattr(model.blocks[l].attn, n)[...] = jnp.asarray(a)
  return model


MODEL = _build()


def _batch() -> dict:
  """The previous-token task on TOKENS: predict x[t - 1] from t = 1."""
  targets = np.concatenate([TOKENS[:, :1], TOKENS[:, :-1]], axis=1)
  mask = np.ones(TOKENS.shape, np.float32)
  mask[:, 0] = 0.0
  return {"inputs": jnp.asarray(TOKENS), "targets": jnp.asarray(targets),
          "loss_mask": jnp.asarray(mask)}


# ------------------------------------------------- the mapping, by itself


def test_query_head_reads_kv_head_h_over_group_like_repeat_kv():
  """Consecutive query heads share a kv head: Hugging Face's `repeat_kv`
  (a new axis of size G after the kv heads, flattened), in NumPy."""
  assert [hooks.kv_head(h, H, K) for h in range(H)] == list(KV_OF)
  assert [hooks.kv_head(h, 9, 3) for h in range(9)] == [0, 0, 0, 1, 1, 1,
                                                        2, 2, 2]  # SmolLM2
  assert [hooks.kv_head(h, 4, 1) for h in range(4)] == [0, 0, 0, 0]  # MQA
  assert hooks.kv_head(-1, H, K) == 1
  assert hooks.query_heads(1, H, K) == (2, 3)
  assert hooks.query_heads(2, 9, 3) == (6, 7, 8)
  x = np.random.default_rng(0).normal(size=(2, 5, 3, 4)).astype(np.float32)
  b, t, k, d = x.shape
  repeat_kv = np.broadcast_to(x[:, :, :, None], (b, t, k, 3, d)).reshape(
      b, t, 9, d)
  np.testing.assert_array_equal(hooks.expand_kv(x, 9), repeat_kv)
  w = np.moveaxis(x, 2, 0)  # [K, ...] heads first, as `head_weights`
  np.testing.assert_array_equal(hooks.expand_kv(w, 9, axis=0),
                                np.moveaxis(repeat_kv, 2, 0))


def test_the_mapping_fails_naming_the_argument_and_the_range():
  with pytest.raises(ValueError, match=r"kv_head: `head`=4 is out of range: "
                     r"expected an int in \[0, 4\)"):
    hooks.kv_head(4, H, K)
  with pytest.raises(ValueError, match=r"query_heads: `kv`=2 is out of "
                     r"range: expected an int in \[0, 2\)"):
    hooks.query_heads(2, H, K)
  with pytest.raises(ValueError, match=r"`num_kv_heads`=3 must divide "
                     r"`num_heads`=4"):
    hooks.kv_head(0, 4, 3)
  with pytest.raises(ValueError, match=r"expand_kv: `x` has 3 kv heads on "
                     r"axis -2 \(shape \[2, 3, 5\]\), which must divide "
                     r"`num_heads`=4"):
    hooks.expand_kv(np.zeros((2, 3, 5)), 4)


# ------------------------------------------------ the hook sites of MODEL


@functools.partial(jax.jit, static_argnums=0, static_argnames="capture")
def _run(graphdef, state, tokens, capture=()):
  return nnx.merge(graphdef, state)(tokens, capture=capture)


SITES = ("blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v",
         "blocks.0.attn.scores", "blocks.0.attn.z")


def test_expanded_keys_and_values_are_what_each_query_head_reads():
  """q_h . expand_kv(k)_h / sqrt(Dh) are the model's own scores of head
  h, and its pattern times expand_kv(v)_h its own z: the per-query-head
  view lines up with q, scores and z."""
  _, acts = _run(*nnx.split(MODEL), jnp.asarray(TOKENS), capture=SITES)
  q, k, v, scores, z = (np.asarray(acts[s]) for s in SITES)
  assert k.shape == (2, T, K, DH) and q.shape == (2, T, H, DH)
  k_h, v_h = hooks.expand_kv(k, H), hooks.expand_kv(v, H)  # [B, T, H, Dh]
  for h in range(H):
    np.testing.assert_array_equal(k_h[:, :, h], k[:, :, KV_OF[h]])
  want = np.einsum("bqhd,bkhd->bhqk", q, k_h) / np.sqrt(DH)
  causal = np.tril(np.ones((T, T), bool))
  np.testing.assert_allclose(scores[..., causal], want[..., causal],
                             rtol=1e-5, atol=1e-4)
  pattern = np.where(causal, np.exp(scores - scores.max(-1, keepdims=True)),
                     0.0)
  pattern /= pattern.sum(-1, keepdims=True)
  np.testing.assert_allclose(z, np.einsum("bhqk,bkhd->bqhd", pattern, v_h),
                             rtol=1e-5, atol=1e-5)


def _loss(patch=None, head_mask=None) -> float:
  batch = _batch()
  return float(train_state.compute_loss(MODEL, batch, "xent", patch=patch,
                                        head_mask=head_mask)[0])


def test_a_kv_patch_changes_the_whole_group_and_names_kv_heads():
  """Zeroing the values of kv head 1 (the one query head 2 reads) removes
  heads 2 and 3 together: the loss of gating both, by hand. Kv head 0's
  values are 0 in layer 0, so zeroing them changes nothing. A query-head
  index past K fails, naming `heads`, the K kv heads and the mapping."""
  gates = np.ones((2, H), np.float32)
  gates[0, list(hooks.query_heads(1, H, K))] = 0.0
  group = _loss(head_mask=jnp.asarray(gates))
  kv = hooks.kv_head(2, H, K)
  assert kv == 1
  np.testing.assert_allclose(
      _loss(patch=hooks.ablate("blocks.0.attn.v", heads=kv)), group,
      rtol=1e-6)
  assert group > 2.0 and _loss() < 0.05  # log(8) without the head
  assert _loss(patch=hooks.ablate("blocks.0.attn.v", heads=0)) == _loss()
  with pytest.raises(ValueError, match=(
      r"'blocks\.0\.attn\.k': `heads`=3, out of range for axis 2 \(K\) of k "
      r"\[B, Tk, K, Dh\]=\[2, 6, 2, 8\], of size 2: use 0\.\.1, or -2\.\.-1 "
      r"counting from the end; k holds the K kv heads, not the H query "
      r"heads: query head h reads kv head h // \(H // K\) "
      r"\(`hooks\.kv_head\(h, H, K\)`\)")):
    _loss(patch=hooks.ablate("blocks.0.attn.k", heads=3))
  with pytest.raises(ValueError, match=r"`replace`'s value has shape "
                     r"\[2, 6, 4, 8\].*v holds the K kv heads"):
    _loss(patch=hooks.replace("blocks.0.attn.v", np.zeros((2, T, H, DH),
                                                          np.float32)))


def test_activation_patching_of_values_is_per_kv_head():
  """Values patched from the clean run into one whose tokens differ: kv
  head 1's restore the whole previous-token prediction (1), kv head 0's,
  all zero, nothing (0); `[K]` scores, not `[H]`."""
  batch = _batch()
  clean = batch["inputs"]
  corrupt = jnp.asarray(np.where(TOKENS > 0, (TOKENS + 3) % (V - 1) + 1, 0))
  metric = patching.logprob_metric(batch["targets"], batch["loss_mask"])
  got = patching.activation_patching(MODEL, clean, corrupt, metric,
                                     ["blocks.0.attn.v"])
  np.testing.assert_allclose(got["blocks.0.attn.v"], [0.0, 1.0], atol=1e-5)


def test_path_patching_refuses_heads_out_of_range_by_name():
  """A receiver head for k or v counts kv heads; a sender head past H
  used to be read as the embedding (H) or patch nothing (H + 1)."""
  args = (MODEL, jnp.asarray(TOKENS), jnp.asarray(TOKENS), lambda x: 0.0)
  with pytest.raises(ValueError, match=(
      r"the head of `receiver`=\(1, 2, 'k'\) must be a kv head in \[0, 2\) "
      r"or -1 \(every head\), got 2 \(k has K=2 kv heads for H=4 query "
      r"heads: query head h reads kv head h // 2")):
    patching.path_patching(*args, sender=(0, 2), receiver=(1, 2, "k"))
  with pytest.raises(ValueError, match=r"must be a query head in \[0, 4\)"):
    patching.path_patching(*args, sender=(0, 2), receiver=(1, 4, "q"))
  for sender in ((0, H), (0, H + 1), (0, -1)):
    with pytest.raises(ValueError, match=r"`sender` must be \(layer, head\) "
                       r"with a query head in \[0, 4\)"):
      patching.path_patching(*args, sender=sender, receiver=("logits",))


# --------------------------------------------- circuits, by plain NumPy


def _numpy_circuits(layer):
  """QK `[H, D, D]` and OV `[H, D, D]` of each query head from the
  hand-set arrays and KV_OF (g = 1: every LayerNorm scale is 1)."""
  wq, wk, wv, wo = (W[layer, n] for n in ("w_q", "w_k", "w_v", "w_o"))
  p = np.eye(D) - 1.0 / D
  qk = np.stack([wq[:, h] @ wk[:, KV_OF[h]].T for h in range(H)])
  ov = np.stack([wv[:, KV_OF[h]] @ wo[h] @ p for h in range(H)])
  return qk, ov


@functools.partial(jax.jit, static_argnums=0)
def _circuits(graphdef, state):
  model = nnx.merge(graphdef, state)
  out = {}
  for l in range(2):
    w = composition.head_weights(model, l)
    out[str(l)] = (composition.qk_circuits(w["w_q"], w["w_k"], w["g"]),
                   composition.ov_circuits(w["w_v"], w["w_o"], w["g"]))
  raw = model.blocks[0].attn  # kv-head weights straight from the layer
  kv_first = lambda a: jnp.moveaxis(a[...], 1, 0)  # [K, D, Dh]
  g = jnp.ones((D,))
  out["raw"] = (composition.qk_circuits(kv_first(raw.w_q), kv_first(raw.w_k),
                                        g),
                composition.ov_circuits(kv_first(raw.w_v), raw.w_o[...], g))
  return (out, composition.composition_scores(model, 0, 1),
          composition.copying_scores(model, 0),
          composition.copying_scores(model, 1))


def test_circuits_pair_each_query_head_with_its_kv_head():
  """Each query head's QK and OV circuit is the NumPy product with its
  own kv head's W_K / W_V, from `head_weights` and from kv-head weights
  given straight to `qk_circuits`/`ov_circuits`. By hand: L0H2's QK maps
  position p to p - 1 (s^2), its OV token i to S_i minus the balance,
  and L0H3, on the same kv head, has another QK and no OV at all."""
  circuits, *_ = _circuits(*nnx.split(MODEL))
  for key, layer in (("0", 0), ("1", 1), ("raw", 0)):
    qk, ov = _numpy_circuits(layer)
    np.testing.assert_allclose(circuits[key][0], qk, atol=1e-5,
                               err_msg=f"QK {key}")
    np.testing.assert_allclose(circuits[key][1], ov, atol=1e-6,
                               err_msg=f"OV {key}")
  qk, ov = (np.asarray(a) for a in circuits["0"])
  want = np.zeros((D, D))
  want[POS + np.arange(1, T), POS + np.arange(T - 1)] = SCALE ** 2
  np.testing.assert_allclose(qk[2], want, atol=1e-5)
  want = np.zeros((D, D))
  want[POS + np.arange(T), POS + np.arange(T)] = SCALE ** 2
  np.testing.assert_allclose(qk[3], want, atol=1e-5)
  want = np.zeros((D, D))
  want[TOK + np.arange(V), S + np.arange(V)] = 1.0
  want[TOK + np.arange(V), BAL_S] = -1.0
  np.testing.assert_allclose(ov[2], want, atol=1e-6)
  for h in (0, 1, 3):
    assert np.all(ov[h] == 0.0), h


def test_composition_and_copying_find_the_planted_heads_only():
  """By hand (module docstring): M_1 of L0H2 = sum_i tok_i -> (S_i -
  bal_S), norm sqrt(2V); L1H1's QK = s^2 sum_i tok_i -> S_i, so its
  K-composition is s^2 sqrt(V) / (sqrt(2V) s^2 sqrt(V)) = 1/sqrt(2V);
  L1H3's OV = sum_i S_i -> (R_i - bal_R), so its V-composition is
  sqrt(2V) / (sqrt(2V) sqrt(2V)) = 1/sqrt(2V). L1H0 and L1H2 share those
  keys and values but read and write nothing: 0. Only L0H2 copies (its
  full OV circuit is the identity times OUT); nothing of layer 1 does."""
  _, scores, copy0, copy1 = _circuits(*nnx.split(MODEL))
  want = {k: np.zeros((H, H)) for k in "qkv"}
  want["k"][2, 1] = want["v"][2, 3] = 1 / np.sqrt(2 * V)
  for k in "qkv":
    np.testing.assert_allclose(scores[k], want[k], atol=1e-6, err_msg=k)
  np.testing.assert_allclose(copy0["copying"], [0.0, 0.0, 1.0, 0.0],
                             atol=1e-5)
  np.testing.assert_allclose(copy1["copying"], np.zeros(H), atol=1e-5)


# ------------------------------------------------------- patterns, page


def test_explorer_scores_and_ablation_are_per_query_head():
  """The explorer's patterns, scores and ablation, on the planted heads:
  L0H2 is the previous-token head and the only one whose ablation costs
  anything; L0H3 (same kv head) attends to itself, L0H0 uniformly; L1H1
  is the induction head, L1H0 (same kv head) uniform. The page names the
  groups."""
  batch = _batch()
  data = explorer.explore(MODEL, batch, loss="xent")
  kind = data["kinds"][0]
  w, scores = kind["weights"], kind["scores"]  # [L, H, T, T], [L, H]
  t = np.arange(1, T)
  np.testing.assert_allclose(w[0, 2, t, t - 1], 1.0, atol=1e-6)
  np.testing.assert_allclose(w[0, 3, np.arange(T), np.arange(T)], 1.0,
                             atol=1e-6)
  np.testing.assert_allclose(w[0, 0], np.tril(np.ones((T, T)))
                             / np.arange(1, T + 1)[:, None], atol=1e-6)
  same = TOKENS[0][:, None] == TOKENS[0][None, :]  # duplicate token, L0H1
  dup = np.tril(same) / np.tril(same).sum(-1, keepdims=True)
  np.testing.assert_allclose(w[0, 1], dup, atol=1e-6)
  # The second copy: positions 4, 5 look at 2, 3 (after the first copy).
  np.testing.assert_allclose(w[1, 1, [4, 5], [2, 3]], 1.0, atol=1e-5)
  prev = scores["previous_token"][0]
  assert prev[2] > 0.999 and max(prev[[0, 1, 3]]) < 0.6
  ind = scores["induction"][1]
  assert ind[1] > 0.999 and max(ind[[0, 2, 3]]) < 0.6
  ablation = scores["ablation"]
  assert ablation[0, 2] > 2.0
  ablation[0, 2] = 0.0
  np.testing.assert_allclose(ablation, 0.0, atol=1e-6)
  assert data["heads"] == (H, K)
  info = dict(explorer.page_json(data)["info"])
  assert info["heads"] == ("4 query heads on 2 kv heads (grouped-query "
                           "attention): every head here is a query head; "
                           "H0-H1 -> kv 0, H2-H3 -> kv 1")
