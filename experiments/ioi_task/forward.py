"""A decoder's forward pass read at each prompt's END only, with hooks.

Shape letters: N prompts, T tokens, L layers, H query heads (K key/value
heads), Dv per-head value width, D d_model, V vocabulary.

`DecoderLM.__call__` returns logits at every position; the IOI metric
reads one position per prompt, and Gemma 3's readout (262,144 tokens) is
more than half of its forward cost, so `end_logits` runs the same
modules (embedding, blocks with their hook scopes, final norm, readout)
and reads out the END rows alone. `tests/experiments/test_ioi.py` checks
it against the model's own call. Right padding is never read: attention
is causal and END is each prompt's last real token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax import hooks as hooks_lib
from mha_jax.models import residual_stream


def positions_of(tokens: jax.Array) -> jax.Array:
  """`[N, T]`: 0 .. T-1 for every prompt."""
  n, t = tokens.shape
  return jnp.broadcast_to(jnp.arange(t), (n, t))


def end_logits(model, tokens, end, *, capture=(), patch=None, start=0,
               stream=None):
  """`(logits [N, V] at END, captured {site: value})` of `tokens [N, T]`,
  `end [N]`; `capture`, `patch` as the model's call takes them.

  `start > 0` runs blocks `start` .. L-1 only, from `stream [N, T, D]`
  (block `start`'s `resid_pre` in a run of `tokens`): a patch at or after
  that block costs only the blocks it can change."""
  hooks = hooks_lib.Hooks(tuple(capture), patch)
  pos = positions_of(tokens)
  if start == 0:
    x = model.embed(tokens, pos)
  elif stream is None:
    raise ValueError(f"end_logits: `start`={start} needs the `stream` "
                     "entering that block, got None")
  else:
    x = stream
  for layer in range(start, len(model.blocks)):
    x, _ = model.blocks[layer](x, hooks=hooks.scope(f"blocks.{layer}"),
                               positions=pos)
  x = x[jnp.arange(tokens.shape[0]), end]  # [N, D]
  if model.final_ln is not None:
    x = model.final_ln(x)
  return model.logits(x[:, None])[:, 0], hooks.captured


def block_sites(model, layer, x, sites, *, patch=None) -> dict:
  """Block `layer` alone on its input stream `x [N, T, D]` (its
  `resid_pre`): `{site: value}` for its own `sites` ("attn.q", ...)."""
  hooks = hooks_lib.Hooks(tuple(sites), patch)
  model.blocks[layer](x, hooks=hooks, positions=positions_of(x[..., 0]))
  return {s: hooks.captured[s] for s in sites}


def post_scale(model, layer, z) -> jax.Array:
  """`[..., D]` (or a scalar 1): what block `layer` multiplies its
  attention's output by before adding it to the stream, frozen at the run
  whose heads' outputs are `z [..., H, Dv]`.

  A pre-norm block adds o = sum_h z_h W_O^h + b_o as it is (1). A
  sandwich block (Gemma 2 and 3) adds its post-norm of o, o (offset + w) /
  rms(o): linear in o once rms(o) is frozen at this run, so each head's
  term z_h W_O^h times this scale is its share, and the shares (with the
  bias's) sum to the block's `attn_out`."""
  block = model.blocks[layer]
  placement = model.config.norm_placement
  if placement == "pre":
    return jnp.ones((), jnp.float32)
  if placement != "sandwich" or model.config.norm != "rms":
    raise ValueError(f"post_scale: a head's share of the stream is written "
                     f"for pre-norm blocks and RMS sandwich blocks; the model "
                     f"has norm_placement={placement!r}, norm="
                     f"{model.config.norm!r}")
  return _rms_scale(block.ln_attn_post, attention_output(block.attn, z))


def attention_output(attn, z) -> jax.Array:
  """`[..., D]`: the attention module's output from its heads' `z [..., H,
  Dv]`: sum_h z_h W_O^h + b_o (the output projection alone)."""
  o = jnp.einsum("...he,hed->...d", z, attn.w_o[...])
  return o + attn.b_o[...] if hasattr(attn, "b_o") else o


def _rms_scale(ln, x) -> jax.Array:
  """`[..., D]`: what RMSNorm `ln` multiplies `x [..., D]` by, (offset +
  w) / rms(x): the library's frozen norm applied to ones."""
  linear, _ = residual_stream.frozen_norm(ln, x)
  return linear(jnp.ones_like(x, jnp.float32))


def logit_diff(logits, io, s) -> jax.Array:
  """`[N]`: logit of the indirect object minus the subject's."""
  rows = jnp.arange(logits.shape[0])
  logits = logits.astype(jnp.float32)
  return logits[rows, io] - logits[rows, s]


def unembed(model, ids) -> jax.Array:
  """`[len(ids), D]`: the readout's direction of each token id (its
  embedding where the model ties them)."""
  ids = jnp.asarray(ids)
  if model.readout is None:
    return model.embed.embed.embedding[...][ids]
  return model.readout.kernel[...][:, ids].T


def final_scale(model, x_end) -> jax.Array:
  """`[N, D]`: what the final norm multiplies `x_end [N, D]` (the END
  stream) by, frozen at this run: the per-prompt 1 / rms times the
  norm's (offset +) scale, so a term's direct logit effect is linear."""
  ln = model.final_ln
  if ln is None:
    return jnp.ones_like(x_end)
  if model.config.norm != "rms":
    raise ValueError(f"final_scale: the direct effect is written for RMSNorm"
                     f" models, got norm={model.config.norm!r}")
  return _rms_scale(ln, x_end)
