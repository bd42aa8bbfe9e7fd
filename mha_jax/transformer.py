"""Tiny transformers built from `MultiHeadAttention`: blocks, LM, seq2seq.

Shape letters: B batch, T target/decoder length, S source/encoder length,
D d_model, H heads, L layers, V vocabulary, F input features (continuous
inputs), O output features.

Attention weights, when a model is called with `return_weights=True`, come
back as a dict of arrays stacked over layers:
  * `DecoderLM`:      {"self": [L, B, H, T, T]}
  * `Encoder`:        {"self": [L, B, H, S, S]}
  * `EncoderDecoder`: {"encoder": [L, B, H, S, S], "self": [L, B, H, T, T],
                       "cross": [L, B, H, T, S]}
so `weights["self"][l]` is layer l's `[B, H, Tq, Tk]` (row = query, column =
key, each row sums to 1 unless the query has no allowed key).

Per-head interventions: `head_mask [L, H]` multiplies head h of layer l's
output before W^O (0 ablates it). It is a call argument, not a parameter, so
`jax.grad` with respect to it gives head importance under `jax.jit`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from mha_jax import attention
from mha_jax import generate as generate_lib
from mha_jax import modules

POSITIONS = ("learned", "sinusoidal", "rotary", "none")
PAD_ID = 0  # token 0 is padding in every token task (see tasks.py)


def sinusoidal_positions(length: int, d_model: int) -> jax.Array:
  """Fixed sin/cos position table `[T, D]` (Vaswani et al.)."""
  pos = jnp.arange(length, dtype=jnp.float32)[:, None]  # [T, 1]
  i = jnp.arange(0, d_model, 2, dtype=jnp.float32)  # [ceil(D/2)]
  angle = pos * jnp.exp(-math.log(10000.0) * i / d_model)[None, :]  # [T, D/2]
  table = jnp.zeros((length, d_model), jnp.float32)
  table = table.at[:, 0::2].set(jnp.sin(angle))
  return table.at[:, 1::2].set(jnp.cos(angle[:, :d_model // 2]))


def _layer_rng(rng, layer):
  """An independent dropout key per layer (or None without dropout)."""
  return None if rng is None else jax.random.fold_in(rng, layer)


def _attend(attn, *args, **kwargs):
  """`(y, weights)` of an attention call; weights None on the paths that
  never form them ("flash", "xla", ...), which cannot return any."""
  if attn.implementation in attention.WEIGHTLESS:
    return attn(*args, **kwargs), None
  return attn(*args, return_weights=True, **kwargs)


def _stack(ws):
  # Weightless implementations ("flash", "xla", ...) return None per layer.
  return jnp.stack(ws) if ws and ws[0] is not None else None


class TransformerBlock(nnx.Module):
  """Pre-LayerNorm block: x + Attn(LN x) [+ x + Cross(LN x, ctx)] + MLP(LN x).

  `attention_only=True` drops the MLP (as in circuit studies of induction
  heads), `cross_attention=True` adds attention over an encoder output.
  `attn_kwargs` go to both `MultiHeadAttention`s.
  """

  def __init__(self, d_model: int, num_heads: int, *, mlp_dim: int,
               attention_only: bool = False, cross_attention: bool = False,
               dropout_rate: float = 0.0, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs, **attn_kwargs):
    common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.ln_attn = nnx.LayerNorm(d_model, **common)
    self.attn = modules.MultiHeadAttention(
        d_model, num_heads, dropout_rate=dropout_rate, **attn_kwargs,
        **common)
    self.cross_attention = cross_attention
    if cross_attention:
      self.ln_cross = nnx.LayerNorm(d_model, **common)
      # Cross-attention queries and keys live in different sequences, so
      # rotating them by their own positions would be meaningless.
      cross_kwargs = dict(attn_kwargs, rotary=False)
      self.cross = modules.MultiHeadAttention(
          d_model, num_heads, dropout_rate=dropout_rate, **cross_kwargs,
          **common)
    self.attention_only = attention_only
    if not attention_only:
      self.ln_mlp = nnx.LayerNorm(d_model, **common)
      self.mlp_in = nnx.Linear(d_model, mlp_dim, **common)
      self.mlp_out = nnx.Linear(mlp_dim, d_model, **common)

  def __call__(self, x, *, mask=None, is_causal=False, positions=None,
               context=None, context_mask=None, head_mask=None,
               cross_head_mask=None, deterministic=True, dropout_rng=None):
    """`x [B,T,D]` -> `(y [B,T,D], self_weights, cross_weights or None)`."""
    rng = (lambda i: None if dropout_rng is None
           else jax.random.fold_in(dropout_rng, i))
    y, w_self = _attend(
        self.attn, self.ln_attn(x), mask=mask, is_causal=is_causal,
        positions=positions, head_mask=head_mask,
        deterministic=deterministic, dropout_rng=rng(0))
    x = x + y
    w_cross = None
    if self.cross_attention:
      if context is None:
        raise ValueError("TransformerBlock: a cross-attention block needs "
                         "`context` [B, S, D]")
      y, w_cross = _attend(
          self.cross, self.ln_cross(x), context, mask=context_mask,
          head_mask=cross_head_mask, deterministic=deterministic,
          dropout_rng=rng(1))
      x = x + y
    return self.feed_forward(x), w_self, w_cross

  def feed_forward(self, x):
    """The MLP sublayer with its residual; identity when attention-only.

    Shared with the cached decoding path (`mha_jax.generate`), which runs
    the attention sublayer through `kv_cache.cached_attention` instead.
    """
    if self.attention_only:
      return x
    return x + self.mlp_out(jax.nn.gelu(self.mlp_in(self.ln_mlp(x))))


class _Stack(nnx.Module):
  """Input layer, position scheme and L blocks, shared by all models."""

  def __init__(self, *, vocab_size: int, d_model: int, num_layers: int,
               num_heads: int, max_len: int, positions: str = "learned",
               input_dim: int = 0, mlp_dim: int | None = None,
               attention_only: bool = False, cross_attention: bool = False,
               dropout_rate: float = 0.0, num_kv_heads: int | None = None,
               head_dim: int | None = None, use_bias: bool = False,
               implementation: str = "vmap", dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if positions not in POSITIONS:
      raise ValueError(f"`positions` must be one of {POSITIONS}, got "
                       f"{positions!r}")
    common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.input_dim = input_dim
    if input_dim > 0:  # continuous inputs [B, T, F]
      self.embed = nnx.Linear(input_dim, d_model, **common)
    else:
      self.embed = nnx.Embed(vocab_size, d_model, **common)
    self.positions = positions
    self.max_len = max_len
    if positions == "learned":
      self.pos_embed = nnx.Embed(max_len, d_model, **common)
    self.blocks = nnx.List([
        TransformerBlock(
            d_model, num_heads, mlp_dim=mlp_dim or 4 * d_model,
            attention_only=attention_only, cross_attention=cross_attention,
            dropout_rate=dropout_rate, num_kv_heads=num_kv_heads,
            head_dim=head_dim, use_bias=use_bias,
            rotary=positions == "rotary", implementation=implementation,
            **common)
        for _ in range(num_layers)])
    self.num_heads = num_heads
    self.d_model = d_model

  def embed_inputs(self, inputs, positions):
    """Inputs `[B,T]` tokens or `[B,T,F]` features -> `[B,T,D]`."""
    inputs = jnp.asarray(inputs)
    expect_rank = 3 if self.input_dim > 0 else 2
    if inputs.ndim != expect_rank:
      kind = (f"features [B, T, {self.input_dim}]" if self.input_dim > 0
              else "integer tokens [B, T]")
      raise ValueError(f"`inputs` must be {kind}, got shape {inputs.shape}")
    if inputs.shape[1] > self.max_len:
      raise ValueError(f"`inputs` length {inputs.shape[1]} exceeds the "
                       f"model's `max_len`={self.max_len}")
    x = self.embed(inputs)  # [B, T, D]
    if self.positions == "learned":
      x = x + self.pos_embed(positions)
    elif self.positions == "sinusoidal":
      table = sinusoidal_positions(self.max_len, self.d_model)
      x = x + table[positions].astype(x.dtype)
    return x

  def run(self, x, *, positions, mask=None, is_causal=False, context=None,
          context_mask=None, head_mask=None, cross_head_mask=None,
          deterministic=True, dropout_rng=None):
    """Blocks over `x [B,T,D]`; returns `(x, self [L,...], cross [L,...])`."""
    n = len(self.blocks)
    for name, hm in (("head_mask", head_mask),
                     ("cross_head_mask", cross_head_mask)):
      if hm is not None and jnp.shape(hm) != (n, self.num_heads):
        raise ValueError(f"`{name}` must have shape [L, H]=[{n}, "
                         f"{self.num_heads}], got {jnp.shape(hm)}")
    w_self, w_cross = [], []
    for layer, block in enumerate(self.blocks):
      x, ws, wc = block(
          x, mask=mask, is_causal=is_causal, positions=positions,
          context=context, context_mask=context_mask,
          head_mask=None if head_mask is None else head_mask[layer],
          cross_head_mask=(None if cross_head_mask is None
                           else cross_head_mask[layer]),
          deterministic=deterministic,
          dropout_rng=_layer_rng(dropout_rng, layer))
      w_self.append(ws)
      if wc is not None:
        w_cross.append(wc)
    return x, _stack(w_self), _stack(w_cross)


def _default_positions(inputs):
  b, t = jnp.shape(inputs)[:2]
  return jnp.broadcast_to(jnp.arange(t), (b, t))  # [B, T]


class DecoderLM(nnx.Module):
  """Causal decoder: embed -> L causal blocks -> [final LN] -> readout.

  Inputs are token ids `[B, T]`, or features `[B, T, F]` when
  `input_dim=F > 0` (a linear input layer replaces the embedding). The
  readout has `output_dim` units when > 0, else `vocab_size` (logits).
  Other keyword arguments (num_kv_heads, head_dim, mlp_dim, attention_only,
  positions, use_bias, dropout_rate, implementation, dtype, param_dtype)
  configure the blocks; see `TransformerBlock` and `MultiHeadAttention`.
  """

  def __init__(self, *, vocab_size: int, d_model: int, num_layers: int,
               num_heads: int, max_len: int, output_dim: int = 0,
               final_ln: bool = True, rngs: nnx.Rngs, **kwargs):
    self.stack = _Stack(vocab_size=vocab_size, d_model=d_model,
                        num_layers=num_layers, num_heads=num_heads,
                        max_len=max_len, rngs=rngs, **kwargs)
    common = dict(dtype=kwargs.get("dtype"),
                  param_dtype=kwargs.get("param_dtype", jnp.float32),
                  rngs=rngs)
    self.final_ln = nnx.LayerNorm(d_model, **common) if final_ln else None
    self.readout = nnx.Linear(d_model, output_dim or vocab_size, **common)

  def __call__(self, inputs, *, positions=None, mask=None, head_mask=None,
               deterministic=True, dropout_rng=None, return_weights=False):
    """`inputs [B,T]` (or `[B,T,F]`) -> logits `[B, T, V or O]`.

    `positions [B, T]` default to 0..T-1; `mask` (bool, broadcastable to
    `[B, H, T, T]`) is combined with the causal rule; `head_mask [L, H]`.
    With `return_weights`: `(logits, {"self": [L, B, H, T, T]})`.
    """
    positions = _default_positions(inputs) if positions is None else positions
    x = self.stack.embed_inputs(inputs, positions)
    x, w_self, _ = self.stack.run(
        x, positions=positions, mask=mask, is_causal=True,
        head_mask=head_mask, deterministic=deterministic,
        dropout_rng=dropout_rng)
    if self.final_ln is not None:
      x = self.final_ln(x)
    logits = self.readout(x)
    return (logits, {"self": w_self}) if return_weights else logits

  def generate(self, prompt, max_new_tokens: int, *, prompt_lengths=None,
               temperature: float = 0.0, rng=None, **kwargs):
    """Continue right-padded prompts `[B, P]` with a KV cache per layer.

    Greedy at `temperature` 0, else sampled with `rng`; `prompt_lengths [B]`
    for prompts of unequal length. Returns new tokens `[B, N]`; see
    `mha_jax.generate.generate` for the other options.
    """
    return generate_lib.generate(
        self, prompt, max_new_tokens, prompt_lengths=prompt_lengths,
        temperature=temperature, rng=rng, **kwargs)


class Encoder(nnx.Module):
  """Bidirectional encoder over tokens with a key-padding mask.

  Token `PAD_ID` (0) marks padding: no query attends to a padded key.
  Ends with a LayerNorm; returns `[B, S, D]` (and `{"self": [L,B,H,S,S]}`).
  """

  def __init__(self, *, vocab_size: int, d_model: int, num_layers: int,
               num_heads: int, max_len: int, rngs: nnx.Rngs, **kwargs):
    self.stack = _Stack(vocab_size=vocab_size, d_model=d_model,
                        num_layers=num_layers, num_heads=num_heads,
                        max_len=max_len, rngs=rngs, **kwargs)
    self.final_ln = nnx.LayerNorm(d_model, dtype=kwargs.get("dtype"),
                                  param_dtype=kwargs.get("param_dtype",
                                                         jnp.float32),
                                  rngs=rngs)

  def __call__(self, tokens, *, head_mask=None, deterministic=True,
               dropout_rng=None, return_weights=False):
    positions = _default_positions(tokens)
    key_valid = (tokens != PAD_ID)[:, None, None, :]  # [B, 1, 1, S]
    x = self.stack.embed_inputs(tokens, positions)
    x, w_self, _ = self.stack.run(
        x, positions=positions, mask=key_valid, head_mask=head_mask,
        deterministic=deterministic, dropout_rng=dropout_rng)
    x = self.final_ln(x)
    return (x, {"self": w_self}) if return_weights else x


class EncoderDecoder(nnx.Module):
  """Encoder plus a causal decoder with cross-attention (shared vocabulary).

  Padding (`PAD_ID`) is masked on both sides: encoder keys in the encoder
  and in cross-attention, decoder keys in decoder self-attention.
  """

  def __init__(self, *, vocab_size: int, d_model: int, num_layers: int,
               num_heads: int, max_len: int, output_dim: int = 0,
               rngs: nnx.Rngs, **kwargs):
    kwargs.pop("final_ln", None)  # both halves always end with a LayerNorm
    self.encoder = Encoder(vocab_size=vocab_size, d_model=d_model,
                           num_layers=num_layers, num_heads=num_heads,
                           max_len=max_len, rngs=rngs, **kwargs)
    self.decoder = _Stack(vocab_size=vocab_size, d_model=d_model,
                          num_layers=num_layers, num_heads=num_heads,
                          max_len=max_len, cross_attention=True, rngs=rngs,
                          **kwargs)
    common = dict(dtype=kwargs.get("dtype"),
                  param_dtype=kwargs.get("param_dtype", jnp.float32),
                  rngs=rngs)
    self.final_ln = nnx.LayerNorm(d_model, **common)
    self.readout = nnx.Linear(d_model, output_dim or vocab_size, **common)

  def __call__(self, src, tgt, *, encoder_head_mask=None, head_mask=None,
               cross_head_mask=None, deterministic=True, dropout_rng=None,
               return_weights=False):
    """`src [B,S]`, decoder input `tgt [B,T]` -> logits `[B, T, V]`.

    Head masks are `[L, H]` for the encoder, decoder self- and
    cross-attention. With `return_weights`: `(logits, {"encoder", "self",
    "cross"})` as described in the module docstring.
    """
    enc_rng, dec_rng = ((None, None) if dropout_rng is None
                        else jax.random.split(dropout_rng))
    context, w_enc = self.encoder(
        src, head_mask=encoder_head_mask, deterministic=deterministic,
        dropout_rng=enc_rng, return_weights=True)
    src_valid = (src != PAD_ID)[:, None, None, :]  # [B, 1, 1, S]
    tgt_valid = (tgt != PAD_ID)[:, None, None, :]  # [B, 1, 1, T]
    positions = _default_positions(tgt)
    x = self.decoder.embed_inputs(tgt, positions)
    x, w_self, w_cross = self.decoder.run(
        x, positions=positions, is_causal=True,
        mask=tgt_valid, context=context,
        context_mask=src_valid, head_mask=head_mask,
        cross_head_mask=cross_head_mask, deterministic=deterministic,
        dropout_rng=dec_rng)
    logits = self.readout(self.final_ln(x))
    if return_weights:
      return logits, {"encoder": w_enc["self"], "self": w_self,
                      "cross": w_cross}
    return logits
