"""A hand-wired IOI circuit in three layers: the positive control of the
IOI experiments' tests (every detector and patching method must find
it). Only tests use it, so it lives here, beside them.

Three layers of two heads, weights set by hand so that

  L0H0  duplicate-token head: each name attends to an earlier copy of
        itself (else to position 0) and writes "I repeat name i" (DUP)
  L1H0  S-inhibition head: attends to a position holding DUP (S2, else
        position 0) and moves its name into INH at the query
  L2H0  name mover: attends to names, minus the names in INH, and copies
        the name it finds into the readout

and every other head does nothing (L2H1 attends to names too but writes
nothing). So on a clean prompt END copies IO; on an ABC prompt nothing
is repeated, L2H0 spreads over three names that are neither IO nor S,
and the logit difference is exactly 0.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.ioi_task import models
from experiments.ioi_task import prompts
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.transformer import DecoderLM

TOK = models.word_tokenizer()
NAMES = prompts.single_token_names(TOK)
V, T = TOK.get_vocab_size(), 24
# Residual blocks: token one-hot, position one-hot, DUP, INH, then the
# always-on ONE and the is-a-name NAME dimensions.
TOK0, POS0, DUP0, INH0 = 0, V, V + T, 2 * V + T
ONE, NAME = 3 * V + T, 3 * V + T + 1
D = 3 * V + T + 2
DH = V + T + 2


def _name_ids():
  return np.asarray(sorted(NAMES.values()))


def wired_ioi(gain: float = 5.0, out_scale: float = 10.0) -> DecoderLM:
  """The hand-wired circuit of the module docstring. Every stream holds
  3 to 6 ones; the pre-norms' scale sqrt(4 / D) brings those back to
  about 1, and `gain` squared sizes the scores that matter."""
  config = ModelConfig(vocab_size=V, d_model=D, num_layers=3, num_heads=2,
                       num_kv_heads=2, head_dim=DH, max_len=T,
                       attention_only=True, positions="learned", norm="rms",
                       attn_scale=1.0, readout_bias=False,
                       implementation="einsum")
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: DecoderLM(config, rngs=nnx.Rngs(0))))
  model = nnx.merge(graphdef, jax.tree.map(
      lambda x: jnp.zeros(x.shape, x.dtype), state))
  for b in model.blocks:
    b.ln_attn.scale[...] = jnp.full((D,), np.sqrt(4 / D))
  model.final_ln.scale[...] = jnp.ones((D,))
  w = {(l, n): np.zeros((D, 2, DH) if n != "w_o" else (2, DH, D),
                        np.float32)
       for l in range(3) for n in ("w_q", "w_k", "w_v", "w_o")}
  g = gain
  names = _name_ids()
  # L0H0: same name earlier (+g^2), itself (-g^2), else position 0.
  for i in names:
    w[0, "w_q"][TOK0 + i, 0, i] = g
    w[0, "w_k"][TOK0 + i, 0, i] = g
    w[0, "w_v"][TOK0 + i, 0, i] = 1.0
    w[0, "w_o"][0, i, DUP0 + i] = 1.0
  for p in range(T):
    w[0, "w_q"][POS0 + p, 0, V + p] = g
    w[0, "w_k"][POS0 + p, 0, V + p] = -2 * g
  w[0, "w_q"][ONE, 0, V + T] = g
  w[0, "w_k"][POS0, 0, V + T] = g / 2
  # L1H0: a key holding DUP (+g^2), else position 0 (+g^2 / 2).
  w[1, "w_q"][ONE, 0, 0] = g
  w[1, "w_k"][DUP0:DUP0 + V, 0, 0] = g
  w[1, "w_k"][POS0, 0, 0] = g / 2
  for i in names:
    w[1, "w_v"][DUP0 + i, 0, i] = 1.0
    w[1, "w_o"][0, i, INH0 + i] = 1.0
  # L2H0: names (+g^2), minus twice that for the name held in INH.
  w[2, "w_q"][ONE, 0, 0] = g
  w[2, "w_k"][NAME, 0, 0] = g
  for i in names:
    w[2, "w_q"][INH0 + i, 0, 1 + i] = 2 * g
    w[2, "w_k"][TOK0 + i, 0, 1 + i] = -g
    w[2, "w_v"][TOK0 + i, 0, i] = 1.0
    w[2, "w_o"][0, i, TOK0 + i] = out_scale
  # L2H1: attends to names as L2H0 does, writes nothing.
  w[2, "w_q"][ONE, 1, 0] = g
  w[2, "w_k"][NAME, 1, 0] = g
  embed = np.zeros((V, D), np.float32)
  embed[np.arange(V), TOK0 + np.arange(V)] = 1.0
  embed[:, ONE] = 1.0
  embed[names, NAME] = 1.0
  pos = np.zeros((T, D), np.float32)
  pos[np.arange(T), POS0 + np.arange(T)] = 1.0
  readout = np.zeros((D, V), np.float32)
  readout[TOK0 + np.arange(V), np.arange(V)] = 1.0
  model.embed.embed.embedding[...] = jnp.asarray(embed)
  model.embed.pos_embed.embedding[...] = jnp.asarray(pos)
  model.readout.kernel[...] = jnp.asarray(readout)
  for l in range(3):
    for n in ("w_q", "w_k", "w_v", "w_o"):
      getattr(model.blocks[l].attn, n)[...] = jnp.asarray(w[l, n])
  return model
