"""A hand-wired 2-layer induction circuit: the known answer for the
circuit tools (`patching`, `composition`) and the text experiment's
detectors. Only tests use it, so it lives here, beside them.

Shape letters: B batch, T length (8), V vocabulary (12), D d_model, Dh
head width.

The residual stream is laid out in one-hot blocks, D = 3 V + T + 4:

  [0, V)          the token                      (embedding)
  [V, V+T)        the position                   (learned positions)
  [V+T, 2V+T)     S: "the token before me was i" (written by L1H1)
  [2V+T, 3V+T)    R: "my token is i", a copy      (written by L1H2)
  4 more          one balance dimension per writer, holding minus what it
                  writes elsewhere, so that every vector has mean 0 and a
                  LayerNorm only divides by a norm that is the same at
                  every position

Layer 1: head 0 attends to the previous position (queries and keys read
the position block) and writes the token it finds into S; head 1 attends
to its own position and writes its token into R, which nothing reads.
Layer 2: head 0 reads the token block but writes nothing (W_O = 0); head 1
is the induction head: its query reads the token block, its KEY READS S,
its value reads the token block and its output writes the token block,
which the readout reads. With no match, head 1 attends to position 0 (a
fixed token in every sequence), so a run without the earlier copy falls
back to the same place whatever else it holds.

So two paths matter, both into layer-2 head 1: layer-1 head 0 -> its
keys (K-composition) and the embedding -> its values (and, for the
second copy, the embedding -> its queries); every other path is exactly
zero. Each corruption of `pairs` breaks a known set of them. All LayerNorm
scales are 1 and all biases 0; the scores are scaled so that the patterns
that matter are one-hot to float precision (`checks` says how close).
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.models.model_config import ModelConfig
from mha_jax.models.transformer import DecoderLM

V, T, DH = 12, 8, 16
TOK, POS, S, R = 0, V, V + T, 2 * V + T  # block starts
BAL_T, BAL_P, BAL_S, BAL_R = 3 * V + T + np.arange(4)  # balance dims
D = 3 * V + T + 4
SINK = V  # the head dimension every query of the induction head shares
BOS = 1  # the token at position 0 of every sequence

# Clean sequences (T + 1 tokens: inputs and targets): BOS, a 3-token
# segment, a filler, the segment again, the filler. Corrupted (`pairs`):
# some of them replaced by tokens that occur nowhere else. All tokens
# distinct otherwise, so no match happens by chance.
_CLEAN = np.array([[BOS, 3, 4, 5, 6, 3, 4, 5, 6],
                   [BOS, 9, 2, 7, 11, 9, 2, 7, 11]])
_FIRST_COPY = np.array([[7, 8, 9], [3, 4, 10]])
FIRST, SECOND, SEGMENT = 1, 5, 3


def config() -> ModelConfig:
  return ModelConfig(vocab_size=V, d_model=D, num_layers=2, num_heads=2,
                     head_dim=DH, max_len=T, attention_only=True,
                     positions="learned", implementation="einsum")


def build(scale: float = 6.0, out_scale: float = 10.0) -> DecoderLM:
  """The wired model; `scale` sharpens the patterns, `out_scale` sizes
  the induction head's output (and so the clean log-probabilities)."""
  # Shapes only, then every array set here: no random init to compile.
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: DecoderLM(config(), rngs=nnx.Rngs(0))))
  state = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state)
  model = nnx.merge(graphdef, state)
  for ln in [b.ln_attn for b in model.blocks] + [model.final_ln]:
    ln.scale[...] = jnp.ones((D,))
  w = {(l, n): np.zeros((D, 2, DH) if n != "w_o" else (2, DH, D), np.float32)
       for l in range(2) for n in ("w_q", "w_k", "w_v", "w_o")}
  for p in range(T):
    w[0, "w_q"][POS + p, 0, p] = scale  # prev-token: query p ...
    w[0, "w_k"][POS + p, 0, p + 1] = scale  # ... matches key p - 1
    w[0, "w_q"][POS + p, 1, p] = scale  # current-token: query p ...
    w[0, "w_k"][POS + p, 1, p] = scale  # ... matches key p
  # Every token embedding holds -1 at BAL_T, so every query of the
  # induction head has the same SINK component; only key 0 answers it.
  w[1, "w_q"][BAL_T, 1, SINK] = -scale
  w[1, "w_k"][POS + 0, 1, SINK] = 4.0 * scale
  for i in range(V):
    for h in range(2):
      w[0, "w_v"][TOK + i, h, i] = 1.0
    w[0, "w_o"][0, i, [S + i, BAL_S]] = [1.0, -1.0]  # L1H1: previous token
    w[0, "w_o"][1, i, [R + i, BAL_R]] = [1.0, -1.0]  # L1H2: my token
    w[1, "w_q"][TOK + i, 0, i] = 1.0  # L2H1 reads tokens, writes nothing
    w[1, "w_k"][TOK + i, 0, i] = 1.0
    w[1, "w_q"][TOK + i, 1, i] = scale  # L2H2: my token ...
    w[1, "w_k"][S + i, 1, i] = 2.0 * scale  # ... = the key's previous one
    w[1, "w_v"][TOK + i, 1, i] = 1.0  # copy the key's own token
    w[1, "w_o"][1, i, [TOK + i, BAL_T]] = [out_scale, -out_scale]
  embed = np.zeros((V, D), np.float32)
  embed[np.arange(V), TOK + np.arange(V)] = 1.0
  embed[:, BAL_T] = -1.0
  pos = np.zeros((T, D), np.float32)
  pos[np.arange(T), POS + np.arange(T)] = 1.0
  pos[:, BAL_P] = -1.0
  readout = np.zeros((D, V), np.float32)
  readout[TOK + np.arange(V), np.arange(V)] = 1.0
  model.embed.embed.embedding[...] = jnp.asarray(embed)
  model.embed.pos_embed.embedding[...] = jnp.asarray(pos)
  model.readout.kernel[...] = jnp.asarray(readout)
  for l in range(2):
    for n in ("w_q", "w_k", "w_v", "w_o"):
      getattr(model.blocks[l].attn, n)[...] = jnp.asarray(w[l, n])
  return model


# The corruptions of `corruption.KINDS` that single out one path, on the
# wired sequences: the positions whose tokens are replaced (by ones that
# occur nowhere else) and the predictions scored (offsets into the second
# copy). "key": the first copy's offset 0, the previous token of the key
# that prediction 0 finds; "value": offset 1, the token it copies.
WIRED_KINDS = {"first_copy": (range(FIRST, FIRST + SEGMENT), (0, 1)),
               "second_copy": (range(SECOND, SECOND + SEGMENT), (0, 1)),
               "key": ((FIRST,), (0,)),
               "value": ((FIRST + 1,), (0,))}


def pairs(kind: str = "first_copy") -> dict:
  """`inputs`, `corrupted`, `targets`, `loss_mask`, all `[B, T]`, for one
  of `WIRED_KINDS`: the loss counts the second copy after its first token,
  as the task does ("key", "value": prediction 0 only, as
  `corruption.corrupt` scores even offsets)."""
  if kind not in WIRED_KINDS:
    raise ValueError(f"wired_circuit.pairs: `kind` must be one of "
                     f"{tuple(WIRED_KINDS)}, got {kind!r}")
  where, scored = WIRED_KINDS[kind]
  corrupt = _CLEAN.copy()
  # _FIRST_COPY holds tokens absent from each clean row: no chance match.
  corrupt[:, list(where)] = _FIRST_COPY[:, :len(where)]
  mask = np.zeros((len(_CLEAN), T), np.float32)
  mask[:, [SECOND + j for j in scored]] = 1.0
  return {"inputs": jnp.asarray(_CLEAN[:, :-1]),
          "corrupted": jnp.asarray(corrupt[:, :-1]),
          "targets": jnp.asarray(_CLEAN[:, 1:]),
          "loss_mask": jnp.asarray(mask)}


@functools.partial(jax.jit, static_argnums=0)
def _patterns(graphdef, state, tokens):
  sites = ("blocks.0.attn.pattern", "blocks.1.attn.pattern")
  _, acts = nnx.merge(graphdef, state)(tokens, capture=sites)
  return jnp.stack([acts[s] for s in sites])


def checks(model, tokens) -> dict:
  """How one-hot the wired patterns are on `tokens [B, T]`: the smallest
  weight, over queries, that each head puts where it is wired to look
  (L1H1: the previous position, L1H2: its own, L2H2 on the second copy:
  the key after the earlier occurrence, or position 0 when there is
  none)."""
  w0, w1 = np.asarray(_patterns(*nnx.split(model), tokens))  # [B, 2, T, T]
  tokens = np.asarray(tokens)
  ind = []
  for b in range(tokens.shape[0]):
    for t in range(SECOND, SECOND + SEGMENT - 1):
      hits = [j for j in range(1, t) if tokens[b, j - 1] == tokens[b, t]]
      ind.append(w1[b, 1, t, hits[0] if hits else 0])
  return {"previous": float(np.min([w0[:, 0, t, t - 1]
                                    for t in range(1, T)])),
          "current": float(np.min([w0[:, 1, t, t] for t in range(T)])),
          "induction": float(np.min(ind))}
