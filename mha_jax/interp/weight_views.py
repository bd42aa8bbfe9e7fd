"""A decoder's weights under TransformerLens's names, per layer and head.

Shape letters: L layers, H query heads, K key/value heads, D d_model, Dh
query/key width, Dv value width, V vocabulary, P position-table rows.

`weights(model)` reads a `DecoderLM`'s parameters once into `Weights`, a
frozen pytree of arrays stacked over layers in TransformerLens's layouts:
`W_Q [L, H, D, Dh]`, `W_O [L, H, Dv, D]`, `W_E [V, D]`, `W_U [D, V]`.
The QK and OV circuits `QK = W_Q W_K^T` and `OV = W_V W_O` `[L, H, D,
D]` are `Factored` products, so their singular values, eigenvalues and
norms never form a D x D (let alone V x V) matrix:

    w = weights(model)
    w.OV[1, 3].S                          # layer 1, head 3: [Dv]
    (w.W_E @ w.OV @ w.W_U).eigenvalues    # full OV circuits: [L, H, Dv]

Grouped-query attention: the model stores K kv heads (`W_K_kv`,
`W_V_kv [L, K, D, Dh]`, TransformerLens's `_W_K`, `_W_V`); `W_K`, `W_V`
(and `b_K`, `b_V`) are per QUERY head, head h holding kv head
`hooks.kv_head(h, H, K)`'s weights, so `QK[l, h]` and `OV[l, h]` are
query head h's circuits, the same head index as `pattern`, `z` and
`result`.

What the arrays are: the model's own parameters. A norm's scale is not in
them (TransformerLens's `from_pretrained` folds it in by default; here
call `fold.fold_layer_norm` first), nor are rotary positions, QK-norm or
soft caps, which act between the two factors of QK, so `QK` is the
bilinear form of the projections alone. `W_E` is what the embedding adds
to the stream: the token table times `embed_scale` (Gemma's sqrt(D)).
`W_U` is the readout, the token table's transpose when tied.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mha_jax import hooks
from mha_jax.interp.factored import Factored
from mha_jax.models.blocks import sinusoidal_positions
from mha_jax.models.transformer import DecoderLM


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
  """A decoder's weights, stacked over layers (module docstring); `None`
  where the model has no such weight (biases, `W_pos` with rotary
  positions, `W_E` with continuous inputs)."""
  W_Q: jax.Array  # [L, H, D, Dh]
  W_K_kv: jax.Array  # [L, K, D, Dh]
  W_V_kv: jax.Array  # [L, K, D, Dv]
  W_O: jax.Array  # [L, H, Dv, D]
  b_Q: jax.Array | None  # [L, H, Dh]
  b_K_kv: jax.Array | None  # [L, K, Dh]
  b_V_kv: jax.Array | None  # [L, K, Dv]
  b_O: jax.Array | None  # [L, D]
  W_E: jax.Array | None  # [V, D], times embed_scale
  W_pos: jax.Array | None  # [P, D], learned or sinusoidal table
  W_U: jax.Array | None  # [D, V or O]
  b_U: jax.Array | None  # [V or O]

  @property
  def num_heads(self) -> int:
    """H."""
    return self.W_Q.shape[1]

  @property
  def num_kv_heads(self) -> int:
    """K."""
    return self.W_K_kv.shape[1]

  def _per_query_head(self, x):
    return None if x is None else hooks.expand_kv(x, self.num_heads, axis=1)

  @property
  def W_K(self) -> jax.Array:  # noqa: N802 (TransformerLens's names)
    """`[L, H, D, Dh]`: head h holds its kv head's W_K."""
    return self._per_query_head(self.W_K_kv)

  @property
  def W_V(self) -> jax.Array:  # noqa: N802
    """`[L, H, D, Dv]`: head h holds its kv head's W_V."""
    return self._per_query_head(self.W_V_kv)

  @property
  def b_K(self) -> jax.Array | None:
    """`[L, H, Dh]` (None without biases)."""
    return self._per_query_head(self.b_K_kv)

  @property
  def b_V(self) -> jax.Array | None:
    """`[L, H, Dv]` (None without biases)."""
    return self._per_query_head(self.b_V_kv)

  @property
  def QK(self) -> Factored:  # noqa: N802
    """`W_Q W_K^T` `[L, H, D, D]` (rank <= Dh): a query's stream row times
    it times a key's stream row is their score before the scale (without
    biases, rotary, QK-norm, soft caps)."""
    return Factored(self.W_Q, jnp.swapaxes(self.W_K, -1, -2))

  @property
  def OV(self) -> Factored:  # noqa: N802
    """`W_V W_O` `[L, H, D, D]` (rank <= Dv): what head h writes to the
    stream for a unit of attention on a key's stream row."""
    return Factored(self.W_V, self.W_O)


def weights(model) -> Weights:
  """`model`'s weights (a `DecoderLM`) as `Weights`, in float32.

  Raises TypeError for any other model (an `Encoder` has no readout and
  an `EncoderDecoder` two stacks: read their modules directly).
  """
  if not isinstance(model, DecoderLM):
    raise TypeError(f"weights: `model` must be a DecoderLM, got "
                    f"{type(model).__name__}")
  c = model.config
  f32 = lambda x: jnp.asarray(x[...], jnp.float32)
  params = [b.attn.core_params() for b in model.blocks]

  def stack(name):
    if name not in params[0]:
      return None
    return jnp.stack([jnp.asarray(p[name], jnp.float32) for p in params])

  # [L, D, H, Dh] -> [L, H, D, Dh]: TransformerLens puts the head first.
  heads_first = lambda x: jnp.moveaxis(x, 2, 1)
  w_e = w_pos = None
  if c.input_dim == 0:
    w_e = f32(model.embed.embed.embedding)
    if c.embed_scale is not None:  # the scale the embedder applies
      w_e = w_e * jnp.asarray(c.embed_scale, w_e.dtype)
  if c.positions == "learned":
    w_pos = f32(model.embed.pos_embed.embedding)
  elif c.positions == "sinusoidal":
    w_pos = sinusoidal_positions(c.max_len, c.d_model)
  if model.readout is None:  # tied: the unscaled token table
    w_u, b_u = f32(model.embed.embed.embedding).T, None
  else:
    w_u = f32(model.readout.kernel)
    b_u = f32(model.readout.bias) if c.readout_bias else None
  return Weights(
      W_Q=heads_first(stack("w_q")), W_K_kv=heads_first(stack("w_k")),
      W_V_kv=heads_first(stack("w_v")), W_O=stack("w_o"),
      b_Q=stack("b_q"), b_K_kv=stack("b_k"), b_V_kv=stack("b_v"),
      b_O=stack("b_o"), W_E=w_e, W_pos=w_pos, W_U=w_u, b_U=b_u)
