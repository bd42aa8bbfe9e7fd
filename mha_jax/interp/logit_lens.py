"""The logit lens and direct logit attribution of a decoder's heads.

Shape letters: B batch, T length, D d_model, L layers, H query heads, V
vocabulary, N the stream terms being attributed.

`logit_lens` reads the residual stream after each layer out through the
model's final norm and unembedding (nostalgebraist's logit lens): what
the model would predict if it stopped there. Each stream is normalised
by its own statistics, so entry l is a real readout; the last is the
model's logits.

Direct logit attribution splits the final stream into the terms that
were added to it (each head's `result`, the MLPs, the embedding) and
reads each one out alone, TransformerLens's convention: the final norm's
scale 1/sigma (1/rms for RMSNorm) is the one of the FULL final stream,
frozen, so the read-out is linear and the terms' read-outs add up to the
stream's (before the norm's bias, the readout's bias and a final soft
cap, which belong to no term). A direction `u [D]` (a token's column of
W_U, or the difference of two: `logit_diff_directions`) turns a read-out
into one number per position: the term's share of that logit (or logit
difference).

Sandwich blocks (Gemma 2 and 3) normalise the attention's output before
it joins the stream: a head's term there is its `result` through the
post-norm with that norm's scale frozen the same way (from the sum of
the layer's heads), so the heads' terms still add up to `attn_out`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.models import residual_stream
from mha_jax.models.transformer import DecoderLM


def _check_model(model, fn: str, *, additive: bool = False) -> None:
  """A `DecoderLM` with vocabulary logits; `additive`: one whose stream is
  a sum of the terms written to it (no post-norm, no embedding norm)."""
  if not isinstance(model, DecoderLM):
    raise TypeError(f"{fn}: `model` must be a DecoderLM, got "
                    f"{type(model).__name__}")
  c = model.config
  if c.output_dim:
    raise ValueError(f"{fn}: needs vocabulary logits, but the model has "
                     f"regression outputs (output_dim={c.output_dim})")
  if additive and (c.norm_placement == "post" or c.embed_norm):
    raise ValueError(
        f"{fn}: a term's direct effect needs a residual stream that is the "
        f"sum of what was written to it; the model has norm_placement="
        f"{c.norm_placement!r}, embed_norm={c.embed_norm} (a norm on the "
        f"stream itself rescales every earlier term)")


def logit_lens(model, inputs, *, positions=None, **call_args) -> jax.Array:
  """Logits `[L + 1, B, T, V]` of the stream entering block 0 (entry 0:
  the embedding) and after each block (entry l + 1: `blocks.l.resid_post`)
  through the final norm and the readout (with its final soft cap), each
  stream normalised by its own statistics. Entry L equals the model's
  logits.

  `inputs [B, T]`; `positions` (an int or a list of ints, as NumPy
  indexing) keeps those positions only (`[L + 1, B, V]` for an int). `call_args`
  (`mask`, `patch`, ...) reach the model's call.
  """
  fn = "logit_lens"
  _check_model(model, fn)
  n = model.config.num_layers
  sites = ("blocks.0.resid_pre",) + tuple(
      f"blocks.{l}.resid_post" for l in range(n))
  _, acts = model(inputs, capture=sites, **call_args)

  def read_out(x):  # [B, T, D]: the ops and shapes of the model's own call
    x = x if model.final_ln is None else model.final_ln(x)
    y = model.logits(x)
    return y if positions is None else y[:, positions]

  # One readout per stream rather than one batched over L + 1: a batched
  # matmul may sum in another order, and the last entry would then differ
  # from the model's logits in the last bits.
  return jnp.stack([read_out(acts[s]) for s in sites])


def _lift(a, like):
  """`a` with leading axes of size 1 up to `like`'s rank (the project
  runs with NumPy's implicit rank promotion turned into an error)."""
  return jnp.reshape(a, (1,) * (like.ndim - a.ndim) + a.shape)


def _check_directions(directions, shape, fn):
  """`directions` `[D]`, `[B, D]` or `[B, T, D]` as `[B or 1, T or 1, D]`."""
  u = jnp.asarray(directions, jnp.float32)
  b, t, d = shape
  if u.ndim == 1:
    u = u[None, None]
  elif u.ndim == 2:
    u = u[:, None]
  ok = (u.ndim == 3 and u.shape[-1] == d and u.shape[0] in (1, b)
        and u.shape[1] in (1, t))
  if not ok:
    raise ValueError(f"{fn}: `directions` must be [D], [B, D] or [B, T, D] "
                     f"with B={b}, T={t}, D={d}, got shape "
                     f"{list(jnp.shape(directions))}")
  return u


def direct_logits(model, terms, final_stream, directions) -> jax.Array:
  """Each stream term's direct effect on the logit along `directions`:
  `[N..., B, T]` from `terms [N..., B, T, D]` (anything added to the
  stream), through the final norm frozen at `final_stream [B, T, D]` (the
  last `resid_post`), dotted with `directions` (`[D]`, `[B, D]` or `[B,
  T, D]`, in the readout's input space: `unembed_directions`).

  Linear in `terms`: the terms of a stream add up to the stream's value,
  which differs from the model's logit (pre soft cap) along the
  direction by the final norm's bias and the readout's bias only.
  """
  fn = "direct_logits"
  _check_model(model, fn, additive=True)
  terms = jnp.asarray(terms, jnp.float32)
  final_stream = jnp.asarray(final_stream)
  if final_stream.ndim != 3 or terms.shape[-3:] != final_stream.shape:
    raise ValueError(f"{fn}: `terms` must be [..., B, T, D] with [B, T, D] "
                     f"= `final_stream`'s shape "
                     f"{list(final_stream.shape)}, got "
                     f"{list(terms.shape)}")
  u = _check_directions(directions, final_stream.shape, fn)
  if model.final_ln is not None:
    linear, _ = residual_stream.frozen_norm(model.final_ln, final_stream)
    terms = linear(terms)
  return jnp.sum(terms * _lift(u, terms), axis=-1)


def head_results(model, inputs, **call_args) -> tuple[jax.Array, jax.Array]:
  """`(terms [L, H, B, T, D], final_stream [B, T, D])`: what each head of
  each layer adds to the residual stream, and the last `resid_post`.

  A head's term is its `result` site (z_h W_O^h, without b_o); in a
  sandwich block, that through the post-norm with its scale frozen at the
  sum of the layer's results and b_o (module docstring). TransformerLens's
  `cache.stack_head_results` (head-major here, layers first).
  """
  fn = "head_results"
  _check_model(model, fn, additive=True)
  c = model.config
  last = f"blocks.{c.num_layers - 1}.resid_post"
  sites = tuple(f"blocks.{l}.attn.result" for l in range(c.num_layers))
  _, acts = model(inputs, capture=sites + (last,), **call_args)
  terms = []
  for l, block in enumerate(model.blocks):
    r = jnp.asarray(acts[sites[l]], jnp.float32)  # [B, T, H, D]
    r = jnp.moveaxis(r, 2, 0)  # [H, B, T, D]
    if c.norm_placement == "sandwich":
      y = jnp.sum(r, axis=0)  # [B, T, D]: the post-norm's input
      if hasattr(block.attn, "b_o"):
        y = y + jnp.asarray(block.attn.b_o[...], jnp.float32)
      r = residual_stream.frozen_norm(block.ln_attn_post, y)[0](r)
    terms.append(r)
  return jnp.stack(terms), acts[last]


def head_logit_attribution(model, inputs, directions,
                           **call_args) -> jax.Array:
  """Each head's direct logit attribution `[L, H, B, T]`: its term in the
  stream (`head_results`) through the final norm frozen at the full
  stream (`direct_logits`), dotted with `directions` (`[D]`, `[B, D]` or
  `[B, T, D]`; `unembed_directions` of the target tokens, or
  `logit_diff_directions`). `inputs [B, T]`; `call_args` reach the model.
  """
  terms, final = head_results(model, inputs, **call_args)
  return direct_logits(model, terms, final, directions)


def _unembed(model):
  """W_U `[D, V]` in float32 (the tied embedding's transpose)."""
  if model.readout is None:
    return jnp.asarray(model.embed.embed.embedding[...], jnp.float32).T
  return jnp.asarray(model.readout.kernel[...], jnp.float32)


def unembed_directions(model, tokens) -> jax.Array:
  """The readout's column of each token: `tokens [...]` int ->
  `[..., D]`; a stream row dotted with it (after the final norm) is that
  token's logit, less the readout's bias."""
  _check_model(model, "unembed_directions")
  tokens = jnp.asarray(tokens)
  v = model.config.vocab_size
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"unembed_directions: `tokens` must be integer ids, "
                     f"got dtype {tokens.dtype}")
  # Indexing would clamp an id out of range silently; checked when the ids
  # are known (not under jit).
  if not isinstance(tokens, jax.core.Tracer) and tokens.size and (
      int(tokens.min()) < 0 or int(tokens.max()) >= v):
    raise ValueError(f"unembed_directions: `tokens` must be ids in [0, V="
                     f"{v}), got min {int(tokens.min())}, max "
                     f"{int(tokens.max())}")
  return jnp.moveaxis(_unembed(model)[:, tokens], 0, -1)


def logit_diff_directions(model, correct, wrong) -> jax.Array:
  """`unembed_directions(correct) - unembed_directions(wrong)` `[..., D]`:
  the direction whose read-out is the logit difference."""
  _check_model(model, "logit_diff_directions")
  if jnp.shape(correct) != jnp.shape(wrong):
    raise ValueError(f"logit_diff_directions: `correct` and `wrong` must "
                     f"have one shape, got {list(jnp.shape(correct))} and "
                     f"{list(jnp.shape(wrong))}")
  return (unembed_directions(model, correct)
          - unembed_directions(model, wrong))
