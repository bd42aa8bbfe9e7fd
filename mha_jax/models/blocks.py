"""Transformer building blocks: the input embedding, norms, MLP and block.

Shape letters: B batch, T length, D d_model, F MLP width (inputs: F_in
features per position), V vocabulary.

All take a `ModelConfig`; the models in `mha_jax.models.transformer`
stack them.
`TransformerBlock` is where the block-level hook sites live (`resid_pre`,
`attn_out`, `cross_out`, `resid_mid`, `mlp_out`, `resid_post`; see
`mha_jax.hooks`) and where each layer's KV cache passes through.

The block's wiring follows `config.norm_placement` and
`config.parallel_block` (f is attention, g the MLP, N a norm):
  pre (default, GPT-2, Llama):  x = x + f(N x);  x = x + g(N x)
  post (BERT):                  x = N(x + f(x)); x = N(x + g(x))
  sandwich (Gemma 2):           x = x + N'(f(N x)); x = x + N'(g(N x))
  parallel (GPT-NeoX):          x = x + f(N x) + g(N' x)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from mha_jax import hooks as hooks_lib
from mha_jax.models import inputs as inputs_lib
from mha_jax.models import modules
from mha_jax.core import multi_head
from mha_jax.core import score_rules
from mha_jax.core import weight_product
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


def linear_args(config, rngs):
  """`common_args` for an `nnx.Linear`, whose dots then follow the
  library's matmul precision (`core/precision.py`) instead of JAX's
  default, which is TF32 on NVIDIA GPUs, and whose weight gradients take
  XLA's fast CPU matmul (`core/weight_product.py`)."""
  return dict(common_args(config, rngs),
              dot_general=weight_product.dot_general)


class RMSNorm(nnx.Module):
  """x / rms(x) * (offset + scale), statistics and product in float32.

  `offset` 1 with `scale` starting at 0 is Gemma's (1 + w); 0 with
  `scale` at 1 is Llama's. The result is cast back to x's dtype once.
  """

  def __init__(self, d_model: int, *, eps: float, offset: float = 0.0,
               dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    del rngs  # the scale starts at a constant
    self.scale = nnx.Param(jnp.full((d_model,), 1.0 - offset, param_dtype))
    self.eps, self.offset, self.dtype = eps, offset, dtype

  def __call__(self, x):  # [..., D] -> [..., D]
    scale = self.offset + self.scale[...].astype(jnp.float32)  # [D]
    return multi_head.normalize(x, scale, "rms", eps=self.eps,
                                dtype=self.dtype)


def make_norm(config: ModelConfig, rngs: nnx.Rngs):
  """The config's norm over D: LayerNorm (scale and bias) or RMSNorm."""
  common = common_args(config, rngs)
  if config.norm == "rms":
    return RMSNorm(config.d_model, eps=config.norm_eps,
                   offset=config.norm_offset, **common)
  return nnx.LayerNorm(config.d_model, epsilon=config.norm_eps, **common)


_ACTIVATIONS = {
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_erf": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
    "relu": jax.nn.relu,
}


class Embedder(nnx.Module):
  """Inputs -> `[B, T, D]`: token embedding (or a linear layer on features)
  plus the position scheme's table (rotary acts in attention instead)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    common = common_args(config, rngs)
    self.config = config
    if config.input_dim > 0:  # continuous inputs [B, T, F]
      self.embed = nnx.Linear(config.input_dim, config.d_model,
                              **linear_args(config, rngs))
    else:
      self.embed = nnx.Embed(config.vocab_size, config.d_model, **common)
    if config.positions == "learned":
      self.pos_embed = nnx.Embed(config.max_len, config.d_model, **common)
    if config.type_vocab_size > 0:
      self.type_embed = nnx.Embed(config.type_vocab_size, config.d_model,
                                  **common)
    if config.embed_norm:
      self.embed_norm = make_norm(config, rngs)

  def __call__(self, inputs, positions, token_types=None):
    """`inputs [B,T]` tokens or `[B,T,F]` features at `positions [B, T]`;
    `token_types [B, T]` (None: all 0) with `config.type_vocab_size`."""
    c = self.config
    # The models check the ids' range at their entry (`inputs_lib.check`).
    inputs = inputs_lib.check(inputs, c, fn="Embedder", check_ids=False)
    if inputs.shape[1] > c.max_len:
      raise ValueError(f"`inputs` length {inputs.shape[1]} exceeds the "
                       f"model's `max_len`={c.max_len}")
    x = self.embed(inputs)  # [B, T, D]
    if c.embed_scale is not None:
      # In x's dtype, as Gemma's own code rounds sqrt(D) to it.
      x = x * jnp.asarray(c.embed_scale, x.dtype)
    if c.positions == "learned":
      x = x + self.pos_embed(positions)
    elif c.positions == "sinusoidal":
      table = sinusoidal_positions(c.max_len, c.d_model)
      x = x + table[positions].astype(x.dtype)
    if c.type_vocab_size > 0:
      types = (jnp.zeros(inputs.shape[:2], jnp.int32) if token_types is None
               else jnp.asarray(token_types))
      if types.shape != inputs.shape[:2]:
        raise ValueError(f"`token_types` must be [B, T]={inputs.shape[:2]}, "
                         f"got {types.shape}")
      x = x + self.type_embed(types)
    elif token_types is not None:
      raise ValueError("`token_types` given, but the model has no token-type "
                       "embeddings (ModelConfig.type_vocab_size=0)")
    if c.embed_norm:
      x = self.embed_norm(x)
    return x


class TransformerBlock(nnx.Module):
  """One block: attention [+ cross-attention] [+ MLP], wired as
  `config.norm_placement` and `config.parallel_block` say (the module
  docstring); by default pre-LN, x + Attn(LN x) [+ Cross] + MLP(LN x).

  `config.attention_only` drops the MLP (as in circuit studies of induction
  heads); `cross_attention=True` adds attention over an encoder output
  (pre-LN blocks only). `layer` picks this block's sliding window and
  rotary base, `causal` makes its self-attention causal (a decoder's):
  both through `config.attention_spec`. Hook sites,
  all `[B, T, D]`: `resid_pre`, `attn_out` (what the attention adds to the
  stream: after b_o, and after the post-norm of a sandwich block),
  `cross_out` (with cross-attention),
  `resid_mid` (sequential blocks with an MLP: the stream between the
  sublayers) and `mlp_out` (with an MLP), `resid_post`; and those of
  `attn` (and `cross`).
  """

  def __init__(self, config: ModelConfig, *, cross_attention: bool = False,
               layer: int = 0, causal: bool = False, rngs: nnx.Rngs):
    common = common_args(config, rngs)
    self.placement = config.norm_placement
    self.parallel = config.parallel_block
    self.ln_attn = make_norm(config, rngs)
    self.attn = modules.MultiHeadAttention(
        config.attention_spec(layer, causal=causal), **common)
    if self.placement == "sandwich":
      self.ln_attn_post = make_norm(config, rngs)
    self.cross_attention = cross_attention
    if cross_attention:
      if self.placement != "pre" or self.parallel:
        raise ValueError("TransformerBlock: cross-attention blocks are "
                         "pre-LN and sequential; got norm_placement="
                         f"{self.placement!r}, parallel_block="
                         f"{self.parallel}")
      self.ln_cross = nnx.LayerNorm(config.d_model, **common)
      self.cross = modules.MultiHeadAttention(
          config.attention_spec(layer, cross=True), **common)
    self.attention_only = config.attention_only
    if not config.attention_only:
      self.ln_mlp = make_norm(config, rngs)
      # The MLP's layers sit on the block itself (`blocks.l.mlp_in`): the
      # paths of the project's saved models.
      mlp = dict(linear_args(config, rngs), use_bias=config.mlp_bias)
      self.mlp_in = nnx.Linear(config.d_model, config.mlp_width, **mlp)
      if config.mlp_gated:
        self.mlp_gate = nnx.Linear(config.d_model, config.mlp_width, **mlp)
      self.mlp_out = nnx.Linear(config.mlp_width, config.d_model, **mlp)
      self.activation = config.mlp_activation
      if self.placement == "sandwich":
        self.ln_mlp_post = make_norm(config, rngs)

  def _mlp(self, x):
    """`[B, T, D] -> [B, T, D]`: W_out act(x W_in), or gated W_out
    (act(x W_gate) * x W_in) (SwiGLU with silu, GeGLU with gelu)."""
    act = _ACTIVATIONS[self.activation]
    if not hasattr(self, "mlp_gate"):
      return self.mlp_out(act(self.mlp_in(x)))
    return self.mlp_out(act(self.mlp_gate(x)) * self.mlp_in(x))

  def site_names(self, prefix: str = ""):
    """`(valid, unavailable)` hook names of this block under `prefix`, in
    the order the call reaches them."""
    def attn_sites(name, attn):
      return multi_head.site_names(attn.spec.implementation,
                                   f"{prefix}{name}.")

    parts = [([f"{prefix}resid_pre"], {}), attn_sites("attn", self.attn),
             ([f"{prefix}attn_out"], {})]
    if self.cross_attention:
      parts += [attn_sites("cross", self.cross), ([f"{prefix}cross_out"], {})]
    if not self.attention_only:
      mid = [] if self.parallel else [f"{prefix}resid_mid"]
      parts.append((mid + [f"{prefix}mlp_out"], {}))
    parts.append(([f"{prefix}resid_post"], {}))
    return merge_site_names(parts)

  def __call__(self, x, *, positions=None, mask=None, context=None,
               context_mask=None, cache=None, lengths=None,
               hooks=hooks_lib.NO_HOOKS, deterministic=True, rngs=None,
               rules=score_rules.NO_RULES):
    """`x [B,T,D]` -> `(y [B,T,D], new cache or None)`.

    `rules`: the self-attention's `ScoreRules` of this call (segment ids
    `[B, T]` keep packed sequences apart; user rules), passed on whole;
    cross-attention takes none. `rngs` (`modules.dropout_key`): one draw,
    folded with 0 for the self-attention and 1 for the cross-attention.
    """
    key = modules.dropout_key(rngs, deterministic)
    rng = lambda i: None if key is None else jax.random.fold_in(key, i)
    post = self.placement == "post"
    x = hooks("resid_pre", x)
    y, cache = self.attn(
        x if post else self.ln_attn(x), mask=mask, positions=positions,
        cache=cache, lengths=lengths, hooks=hooks.scope("attn"),
        deterministic=deterministic, rngs=rng(0), rules=rules)
    if self.placement == "sandwich":
      y = self.ln_attn_post(y)
    if self.parallel:  # both sublayers read the block's input
      y = hooks("attn_out", y)
      return hooks("resid_post", x + y + hooks(
          "mlp_out", self._mlp(self.ln_mlp(x)))), cache
    x = x + hooks("attn_out", y)
    if post:
      x = self.ln_attn(x)
    if self.cross_attention:
      if context is None:
        raise ValueError("TransformerBlock: a cross-attention block needs "
                         "`context` [B, S, D]")
      y, _ = self.cross(self.ln_cross(x), context, mask=context_mask,
                     hooks=hooks.scope("cross"),
                     deterministic=deterministic, rngs=rng(1))
      x = x + hooks("cross_out", y)
    if not self.attention_only:
      x = hooks("resid_mid", x)
      y = self._mlp(x if post else self.ln_mlp(x))
      if self.placement == "sandwich":
        y = self.ln_mlp_post(y)
      x = x + hooks("mlp_out", y)
      if post:
        x = self.ln_mlp(x)
    return hooks("resid_post", x), cache


def merge_site_names(parts):
  """Merge several `(valid, unavailable)` pairs, in order."""
  valid, unavailable = [], {}
  for v, u in parts:
    valid += v
    unavailable.update(u)
  return tuple(valid), unavailable
