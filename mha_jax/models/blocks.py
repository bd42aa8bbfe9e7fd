"""Transformer building blocks: the input embedding and the pre-LN block.

Shape letters: B batch, T length, D d_model, F MLP width (inputs: F_in
features per position), V vocabulary.

Both take a `ModelConfig`; the models in `mha_jax.models.transformer` stack them.
`TransformerBlock` is where the block-level hook sites live (`resid_pre`,
`attn_out`, `cross_out`, `resid_mid`, `mlp_out`, `resid_post`; see
`mha_jax.hooks`) and where each layer's KV cache passes through.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from mha_jax import hooks as hooks_lib
from mha_jax.models import modules
from mha_jax.core import multi_head
from mha_jax.models.model_config import ModelConfig


def sinusoidal_positions(length: int, d_model: int) -> jax.Array:
  """Fixed sin/cos position table `[T, D]` (Vaswani et al.)."""
  pos = jnp.arange(length, dtype=jnp.float32)[:, None]  # [T, 1]
  i = jnp.arange(0, d_model, 2, dtype=jnp.float32)  # [ceil(D/2)]
  angle = pos * jnp.exp(-math.log(10000.0) * i / d_model)[None, :]  # [T, D/2]
  table = jnp.zeros((length, d_model), jnp.float32)
  table = table.at[:, 0::2].set(jnp.sin(angle))
  return table.at[:, 1::2].set(jnp.cos(angle[:, :d_model // 2]))


def common_args(config, rngs):
  return dict(dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)


class Embedder(nnx.Module):
  """Inputs -> `[B, T, D]`: token embedding (or a linear layer on features)
  plus the position scheme's table (rotary acts in attention instead)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    common = common_args(config, rngs)
    self.config = config
    if config.input_dim > 0:  # continuous inputs [B, T, F]
      self.embed = nnx.Linear(config.input_dim, config.d_model, **common)
    else:
      self.embed = nnx.Embed(config.vocab_size, config.d_model, **common)
    if config.positions == "learned":
      self.pos_embed = nnx.Embed(config.max_len, config.d_model, **common)

  def __call__(self, inputs, positions):
    """`inputs [B,T]` tokens or `[B,T,F]` features at `positions [B, T]`."""
    c = self.config
    inputs = jnp.asarray(inputs)
    expect_rank = 3 if c.input_dim > 0 else 2
    if inputs.ndim != expect_rank:
      kind = (f"features [B, T, {c.input_dim}]" if c.input_dim > 0
              else "integer tokens [B, T]")
      raise ValueError(f"`inputs` must be {kind}, got shape {inputs.shape}")
    if inputs.shape[1] > c.max_len:
      raise ValueError(f"`inputs` length {inputs.shape[1]} exceeds the "
                       f"model's `max_len`={c.max_len}")
    x = self.embed(inputs)  # [B, T, D]
    if c.positions == "learned":
      x = x + self.pos_embed(positions)
    elif c.positions == "sinusoidal":
      table = sinusoidal_positions(c.max_len, c.d_model)
      x = x + table[positions].astype(x.dtype)
    return x


class TransformerBlock(nnx.Module):
  """Pre-LayerNorm block: x + Attn(LN x) [+ x + Cross(LN x, ctx)] + MLP(LN x).

  `config.attention_only` drops the MLP (as in circuit studies of induction
  heads); `cross_attention=True` adds attention over an encoder output.
  Hook sites, all `[B, T, D]`: `resid_pre`, `attn_out`, `cross_out` (with
  cross-attention), `resid_mid` and `mlp_out` (with an MLP), `resid_post`;
  and those of `attn` (and `cross`).
  """

  def __init__(self, config: ModelConfig, *, cross_attention: bool = False,
               rngs: nnx.Rngs):
    common = common_args(config, rngs)
    attn_kwargs = dict(
        num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        use_bias=config.use_bias, dropout_rate=config.dropout_rate,
        rotary_base=config.rotary_base,
        implementation=config.implementation, soft_cap=config.logit_soft_cap,
        scale=config.attn_scale, sinks=config.attention_sinks,
        qk_norm=config.qk_norm, **common)
    self.ln_attn = nnx.LayerNorm(config.d_model, **common)
    self.attn = modules.MultiHeadAttention(
        config.d_model, config.num_heads,
        rotary=config.positions == "rotary",
        alibi=config.positions == "alibi",
        local_window=config.local_window, **attn_kwargs)
    self.cross_attention = cross_attention
    if cross_attention:
      self.ln_cross = nnx.LayerNorm(config.d_model, **common)
      # Cross-attention queries and keys live in different sequences, so
      # rotating them by their own positions (or windowing or ALiBi by
      # them) would be meaningless.
      self.cross = modules.MultiHeadAttention(
          config.d_model, config.num_heads, rotary=False, **attn_kwargs)
    self.attention_only = config.attention_only
    if not config.attention_only:
      self.ln_mlp = nnx.LayerNorm(config.d_model, **common)
      self.mlp_in = nnx.Linear(config.d_model, config.mlp_width, **common)
      self.mlp_out = nnx.Linear(config.mlp_width, config.d_model, **common)

  def site_names(self, prefix: str = ""):
    """`(valid, unavailable)` hook names of this block under `prefix`, in
    the order the call reaches them."""
    def attn_sites(name, attn):
      return multi_head.site_names(attn.implementation, f"{prefix}{name}.")

    parts = [([f"{prefix}resid_pre"], {}), attn_sites("attn", self.attn),
             ([f"{prefix}attn_out"], {})]
    if self.cross_attention:
      parts += [attn_sites("cross", self.cross), ([f"{prefix}cross_out"], {})]
    if not self.attention_only:
      parts.append(([f"{prefix}resid_mid", f"{prefix}mlp_out"], {}))
    parts.append(([f"{prefix}resid_post"], {}))
    return merge_site_names(parts)

  def __call__(self, x, *, positions=None, mask=None, is_causal=False,
               context=None, context_mask=None, cache=None, lengths=None,
               hooks=hooks_lib.NO_HOOKS, deterministic=True,
               dropout_rng=None, segment_ids=None):
    """`x [B,T,D]` -> `(y [B,T,D], new cache or None)`; `segment_ids
    [B, T]` keep packed sequences apart in self-attention."""
    rng = (lambda i: None if dropout_rng is None
           else jax.random.fold_in(dropout_rng, i))
    x = hooks("resid_pre", x)
    out = self.attn(
        self.ln_attn(x), mask=mask, is_causal=is_causal, positions=positions,
        cache=cache, lengths=lengths, hooks=hooks.scope("attn"),
        deterministic=deterministic, dropout_rng=rng(0),
        segment_ids=segment_ids)
    y, cache = out if cache is not None else (out, None)
    x = x + hooks("attn_out", y)
    if self.cross_attention:
      if context is None:
        raise ValueError("TransformerBlock: a cross-attention block needs "
                         "`context` [B, S, D]")
      y = self.cross(self.ln_cross(x), context, mask=context_mask,
                     hooks=hooks.scope("cross"),
                     deterministic=deterministic, dropout_rng=rng(1))
      x = x + hooks("cross_out", y)
    if not self.attention_only:
      x = hooks("resid_mid", x)
      y = self.mlp_out(jax.nn.gelu(self.mlp_in(self.ln_mlp(x))))
      x = x + hooks("mlp_out", y)
    return hooks("resid_post", x), cache


def merge_site_names(parts):
  """Merge several `(valid, unavailable)` pairs, in order."""
  valid, unavailable = [], {}
  for v, u in parts:
    valid += v
    unavailable.update(u)
  return tuple(valid), unavailable
