"""The residual stream's views of an `ActivationCache`: the stream
layer by layer, each head's result, the decomposition into what wrote
to it, and the norms applied to a stack of its components.

Shape letters: B batch, T length, D d_model, H heads, L layers, C
components of a stack.

`ResidualStream` is mixed into `ActivationCache` (activation_cache.py):
its methods read the cache's activations by name (`self["resid_pre",
l]`), its `Layout` (`self.layout`) and its layer check (`self._layer`).
Nothing here needs the batch axis: every method reads only the trailing
`[T, D]` (`[T, H, D]` for `result`) of what it stacks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax import hooks as hooks_lib
from mha_jax.models import blocks as blocks_lib


def _pos(x: jax.Array, pos_slice, axis: int) -> jax.Array:
  """`x` with `pos_slice` (None: all; an int drops the axis; a slice or
  a list of ints keeps it) taken on the position axis `axis`."""
  if pos_slice is None:
    return x
  index = [slice(None)] * x.ndim
  index[axis % x.ndim] = (jnp.asarray(pos_slice)
                          if isinstance(pos_slice, (list, tuple))
                          else pos_slice)
  return x[tuple(index)]


def _norm_parts(norm):
  """`(kind, eps, weight [D] float32 or None, bias [D] or None)` of one
  of the models' norms: `blocks.RMSNorm` (weight = offset + scale, so
  Gemma's 1 + w) or `nnx.LayerNorm`."""
  if isinstance(norm, blocks_lib.RMSNorm):
    return ("rms", norm.eps,
            norm.offset + norm.scale[...].astype(jnp.float32), None)
  scale, bias = getattr(norm, "scale", None), getattr(norm, "bias", None)
  if not hasattr(norm, "epsilon"):
    raise TypeError(f"apply_ln_to_stack: expected a model or one of its "
                    f"norms (RMSNorm, nnx.LayerNorm), got "
                    f"{type(norm).__name__}")
  return ("layer", norm.epsilon,
          None if scale is None else scale[...].astype(jnp.float32),
          None if bias is None else bias[...].astype(jnp.float32))


def frozen_norm(norm, reference, *, weight: bool = True):
  """`(linear, bias)`: the norm `norm` (a model's RMSNorm or
  nnx.LayerNorm) with its scale frozen at `reference [..., D]`'s, as a
  linear map of components `[..., *reference.shape[:-1], D]` and the
  constant it adds (LayerNorm's bias `[D]`, or 0.0).

  `linear(t)` centres `t` (LayerNorm), divides it by the reference's
  `sqrt(mean((x - mean x)^2) + eps)` (RMSNorm: `sqrt(mean(x^2) + eps)`)
  and, with `weight`, multiplies by the norm's weight (RMSNorm: offset +
  w). So components that sum to the reference map to outputs that sum,
  with the bias, to `norm(reference)`. The one place this arithmetic
  lives: `apply_ln_to_stack` and `interp.logit_lens` both use it.
  """
  kind, eps, w, b = _norm_parts(norm)
  x = jnp.asarray(reference, jnp.float32)
  if kind == "layer":
    x = x - x.mean(axis=-1, keepdims=True)
  scale = jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)

  def linear(t):
    t = jnp.asarray(t, jnp.float32)
    if (t.ndim < scale.ndim
        or t.shape[t.ndim - scale.ndim:-1] != scale.shape[:-1]):
      raise ValueError(
          f"apply_ln_to_stack: `stack` has shape {list(t.shape)}, expected "
          f"[..., {', '.join(map(str, scale.shape[:-1]))}, D] (the "
          "stream's positions after `pos_slice`)")
    if kind == "layer":
      t = t - t.mean(axis=-1, keepdims=True)
    out = t / scale.reshape((1,) * (t.ndim - scale.ndim) + scale.shape)
    if weight and w is not None:
      out = out * w.reshape((1,) * (out.ndim - 1) + w.shape)
    return out

  return linear, (0.0 if b is None else b)


class ResidualStream:
  """The residual stream's methods of `ActivationCache` (module
  docstring): `accumulated_resid`, `stack_head_results`,
  `decompose_resid`, `apply_ln_to_stack`."""

  def _top(self, layer) -> int:
    """A methods' `layer`: None or -1 is L (the final stream)."""
    if layer is None or layer == -1:
      return self.layout.num_layers
    return self._layer(layer, "layer", allow_end=True, error=ValueError)

  def _refuse_post(self, fn):
    if self.layout.placement == "post":
      raise ValueError(
          f"{fn}: the model's blocks are post-norm (norm_placement='post', "
          "as BERT's): each block normalises the sum of its stream and its "
          "sublayer's output, so the stream is not a sum of components")

  def accumulated_resid(self, layer: int | None = None, *,
                        incl_mid: bool = False, mlp_input: bool = False,
                        apply_ln: bool = False, model=None, pos_slice=None,
                        return_labels: bool = False):
    """The stream at each layer's input up to `layer`'s: `[C, B, T, D]`.

    `layer` None (or -1, or L) ends with the final stream, labelled
    "final_post" (`resid_post` of the last block); otherwise with
    `resid_pre` of `layer` ("{l}_pre"), and with `mlp_input` its
    `resid_mid`. `incl_mid` adds each earlier block's `resid_mid`.
    `apply_ln` (needs `model`): at the final stream, each entry through
    the final norm itself (the logit lens: `model.logits` of it gives
    logits); at an earlier layer, `apply_ln_to_stack` with that layer's
    norm and the stream's scale.
    """
    top = self._top(layer)
    n = self.layout.num_layers
    if (incl_mid or mlp_input) and self.layout.parallel:
      raise ValueError("accumulated_resid: parallel blocks (GPT-NeoX) have "
                       "no resid_mid; drop incl_mid and mlp_input")
    parts, labels = [], []
    for l in range(top + 1):
      if l == n:
        parts.append(self["resid_post", n - 1])
        labels.append("final_post")
        break
      parts.append(self["resid_pre", l])
      labels.append(f"{l}_pre")
      if (incl_mid and l < top) or (mlp_input and l == top):
        parts.append(self["resid_mid", l])
        labels.append(f"{l}_mid")
    out = jnp.stack([_pos(p, pos_slice, -2) for p in parts])
    if apply_ln:
      norm = self._norm_of(model, top, mlp_input, "accumulated_resid")
      out = (norm(out) if top == n else self.apply_ln_to_stack(
          out, model, layer=top, mlp_input=mlp_input, pos_slice=pos_slice))
    return (out, labels) if return_labels else out

  def stack_head_results(self, layer: int | None = None, *,
                         pos_slice=None, return_labels: bool = False):
    """Each head's `result` (its own `z_h @ W^O_h`) of layers before
    `layer` (None: all), `[L * H, B, T, D]`, labelled "L{l}H{h}"."""
    top = self._top(layer)
    parts, labels = [], []
    for l in range(top):
      result = _pos(self["result", l], pos_slice, -3)  # [B, T, H, D]
      parts.append(jnp.moveaxis(result, -2, 0))  # [H, B, T, D]
      labels += [hooks_lib.head_name(l, h) for h in range(result.shape[-2])]
    if not parts:
      raise ValueError("stack_head_results: `layer`=0 leaves no heads")
    out = jnp.concatenate(parts)
    return (out, labels) if return_labels else out

  def decompose_resid(self, layer: int | None = None, *,
                      mlp_input: bool = False, mode: str = "all",
                      incl_embeds: bool = True, by_head: bool = False,
                      apply_ln: bool = False, model=None, pos_slice=None,
                      return_labels: bool = False):
    """The stream at `layer`'s input as a stack of what wrote to it,
    `[C, B, T, D]`; the components sum to it (with `incl_embeds` and
    mode "all").

    Components, in order: "embed" (`blocks.0.resid_pre`: tokens,
    positions, token types, after any embedding scale or norm), then per
    block l before `layer` "{l}_attn_out" and "{l}_mlp_out"; with
    `mlp_input`, layer's own "{l}_attn_out" too (none for parallel blocks,
    whose MLP reads the block's input). `mode` "attn" or "mlp" keeps only
    those. `by_head` splits each attention output into its heads
    ("L{l}H{h}", the `result` site) and "{l}_attn_bias", what is left
    (the output bias b_o, or 0). `apply_ln` (needs `model`):
    `apply_ln_to_stack` at `layer`.

    Refused for post-norm blocks (the stream is no sum), and `by_head`
    for sandwich blocks (Gemma 2/3), whose attention output passes a
    norm after the heads are summed.
    """
    fn = "decompose_resid"
    self._refuse_post(fn)
    if mode not in ("all", "attn", "mlp"):
      raise ValueError(f"{fn}: `mode` must be 'all', 'attn' or 'mlp', got "
                       f"{mode!r}")
    if by_head and self.layout.placement == "sandwich":
      raise ValueError(f"{fn}: by_head=True is not possible with sandwich "
                       "blocks (Gemma 2/3): each attention output passes a "
                       "norm after its heads are summed, so the heads' "
                       "results do not add up to it")
    top = self._top(layer)
    if mlp_input and top == self.layout.num_layers:
      raise ValueError(f"{fn}: mlp_input=True needs a block's `layer` in "
                       f"0..{top - 1}; the final stream feeds no MLP")
    attn = mode != "mlp"
    mlp = mode != "attn" and not self.layout.attention_only
    parts, labels = [], []

    def add_attn(l):
      if not by_head:
        parts.append(self["attn_out", l])
        labels.append(f"{l}_attn_out")
        return
      result = self["result", l]  # [B, T, H, D]
      heads = jnp.moveaxis(result, -2, 0)
      parts.extend(heads)
      labels.extend(hooks_lib.head_name(l, h) for h in range(heads.shape[0]))
      parts.append(self["attn_out", l] - result.sum(axis=-2))
      labels.append(f"{l}_attn_bias")

    if incl_embeds:
      parts.append(self["resid_pre", 0])
      labels.append("embed")
    for l in range(top):
      if attn:
        add_attn(l)
      if mlp:
        parts.append(self["mlp_out", l])
        labels.append(f"{l}_mlp_out")
    if mlp_input and attn and not self.layout.parallel:
      add_attn(top)
    if not parts:
      raise ValueError(f"{fn}: nothing to stack (layer={layer}, "
                       f"mode={mode!r}, incl_embeds={incl_embeds})")
    out = jnp.stack([_pos(p, pos_slice, -2) for p in parts])
    if apply_ln:
      out = self.apply_ln_to_stack(out, model, layer=top,
                                   mlp_input=mlp_input, pos_slice=pos_slice)
    return (out, labels) if return_labels else out

  # --- norms ------------------------------------------------------------

  def _norm_of(self, model, top, mlp_input, fn):
    """The norm that reads the stream at `top` (L: the final norm)."""
    if model is None:
      raise ValueError(f"{fn}: apply_ln=True needs `model`, the model whose "
                       "norm to apply, got None")
    self._refuse_post(fn)
    if top == self.layout.num_layers:
      norm = getattr(model, "final_ln", None)
      if norm is None:
        raise ValueError(f"{fn}: the model has no final norm "
                         "(ModelConfig.final_ln=False)")
      return norm
    block = model.blocks[top]
    return block.ln_mlp if mlp_input else block.ln_attn

  def _stream(self, top, mlp_input):
    """The stream the norm at `top` reads, `[B, T, D]`."""
    if top == self.layout.num_layers:
      return self["resid_post", top - 1]
    if mlp_input and not self.layout.parallel:
      return self["resid_mid", top]
    return self["resid_pre", top]

  def apply_ln_to_stack(self, stack: jax.Array, model_or_norm, *,
                        layer: int | None = None, mlp_input: bool = False,
                        pos_slice=None, weight: bool = True) -> jax.Array:
    """Components of a stream `[..., B, T, D]` as the norm at `layer` sees
    them: each is centred (LayerNorm) and divided by the scale of the
    FULL stream there, `sqrt(mean((x - mean x)^2) + eps)` (RMSNorm:
    `sqrt(mean(x^2) + eps)`), then, with `weight`, multiplied by the
    norm's weight (RMSNorm: offset + w, Gemma's 1 + w). The bias is never
    added: it is no component's. So the outputs sum, with the bias, to
    the norm of the stream: `norm(x) = sum_c out_c + b`.

    `model_or_norm`: the model (then `layer` None, -1 or L means the final
    norm, l < L block l's attention norm, or with `mlp_input` its MLP
    norm) or one norm module (its stream is then `layer`'s as above).
    `pos_slice`: the positions the stack holds (taken from the scale, as
    TransformerLens's). `weight=False` is TransformerLens's arithmetic,
    which assumes the weight was folded into what reads the stream.
    Returns float32, the stack's shape.
    """
    fn = "apply_ln_to_stack"
    self._refuse_post(fn)
    top = self._top(layer)
    if mlp_input and top == self.layout.num_layers:
      raise ValueError(f"{fn}: mlp_input=True needs a block's `layer` in "
                       f"0..{top - 1}; the final norm feeds no MLP")
    norm = (self._norm_of(model_or_norm, top, mlp_input, fn)
            if hasattr(model_or_norm, "blocks") else model_or_norm)
    reference = _pos(self._stream(top, mlp_input), pos_slice, -2)
    return frozen_norm(norm, reference, weight=weight)[0](stack)

