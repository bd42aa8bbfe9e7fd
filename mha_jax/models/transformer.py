"""Tiny transformers built from `MultiHeadAttention`: blocks, LM, seq2seq.

Shape letters: B batch, T target/decoder length, S source/encoder length
(or cache slots), D d_model, H heads, L layers, V vocabulary, F input
features (continuous inputs), O output features.

Every model takes one `ModelConfig` (see `mha_jax.models.model_config`) and its
call returns the outputs, followed, in this order and only when asked for,
by: the new cache (`DecoderLM` with `cache=`), the dict of captured
activations (`capture=`), the attention weights (`return_weights=True`).

Hook sites (`mha_jax.hooks`) are addressed by where they sit, mirroring
the module tree: `model.blocks[1].attn`'s pattern is
`"blocks.1.attn.pattern"`; an `EncoderDecoder` has `"encoder.blocks.l..."`
and `"decoder.blocks.l..."` (with `.cross.` for cross-attention).
`model.hook_names()` lists them. `capture=(names...)` returns their values,
`patch={name: array or function}` replaces them, under `jax.jit`,
`jax.grad` and `jax.vmap`.

Attention weights with `return_weights=True` are the captured patterns
stacked over layers:
  * `DecoderLM`:      {"self": [L, B, H, T, T]}
  * `Encoder`:        {"self": [L, B, H, S, S]}
  * `EncoderDecoder`: {"encoder": [L, B, H, S, S], "self": [L, B, H, T, T],
                       "cross": [L, B, H, T, S]}
so `weights["self"][l]` is layer l's `[B, H, Tq, Tk]` (row = query, column =
key, each row sums to 1 unless the query has no allowed key).

Per-head interventions: `head_mask [L, H]` multiplies head h of layer l's
output `z` before W^O (0 ablates it): a patch of the `z` sites. It is a
call argument, not a parameter, so `jax.grad` with respect to it gives
head importance under `jax.jit`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mha_jax.models import activation_cache
from mha_jax.models import blocks as blocks_lib
from mha_jax.models import inputs as inputs_lib
from mha_jax.models import modules
from mha_jax import hooks as hooks_lib
from mha_jax.core import kv_cache
from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.models.blocks import sinusoidal_positions
from mha_jax.models.blocks import TransformerBlock
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.model_config import POSITIONS

PAD_ID = 0  # token 0 is padding in every token task (see tasks.py)
__all__ = ["POSITIONS", "PAD_ID", "ModelConfig", "TransformerBlock",
           "DecoderLM", "Encoder", "EncoderDecoder", "with_implementation",
           "sinusoidal_positions"]


def _layer_rng(key, layer):
  """An independent dropout key per layer (or None without dropout)."""
  return None if key is None else jax.random.fold_in(key, layer)


def _run_blocks(blocks, x, hooks, *, key, cache=None, **kwargs):
  """The blocks in order, each with its hook scope, dropout key (from the
  call's one `key`, or None) and cache. Returns `(x, new caches as a
  tuple, or None without a cache)`."""
  new_cache = []
  for layer, block in enumerate(blocks):
    x, c = block(x, hooks=hooks.scope(f"blocks.{layer}"),
                 cache=None if cache is None else cache[layer],
                 rngs=_layer_rng(key, layer), **kwargs)
    new_cache.append(c)
  return x, None if cache is None else tuple(new_cache)


def _make_hooks(model, capture, patch, head_masks, weight_sites):
  """The call's `Hooks`, checked against `model.hook_names()`.

  `head_masks`: {site prefix of layer l's z (e.g. "blocks."): [L, H] gates
  or None}; `weight_sites`: the pattern names `return_weights` reads.
  """
  capture = (capture,) if isinstance(capture, str) else tuple(capture)
  valid, unavailable = model.hook_sites()
  hooks_lib.check_names(set(capture) | set(patch or {}), valid, unavailable)
  hooks = hooks_lib.Hooks(capture, patch)
  num_layers, num_heads = model.config.num_layers, model.config.num_heads
  for (arg, fmt), gates in head_masks.items():
    if gates is None:
      continue
    if jnp.shape(gates) != (num_layers, num_heads):
      raise ValueError(f"`{arg}` must have shape [L, H]=[{num_layers}, "
                       f"{num_heads}], got {jnp.shape(gates)}")
    hooks = hooks.extend(patch={
        fmt.format(l): hooks_lib.ScaleHeads(gates[l])
        for l in range(num_layers)})
  if weight_sites:
    for site in weight_sites:
      if site in unavailable:
        raise ValueError(f"return_weights=True is not possible: "
                         f"{unavailable[site]}")
    hooks = hooks.extend(capture=weight_sites)
  return hooks, capture


def _make_blocks(config, rngs, **kwargs):
  """The L blocks, each told its layer (for `config.attention_spec`)."""
  return nnx.List([blocks_lib.TransformerBlock(config, layer=l, rngs=rngs,
                                               **kwargs)
                   for l in range(config.num_layers)])


def _block_sites(blocks, prefix=""):
  """Each block's `site_names`, addressed `<prefix>blocks.<l>.`."""
  return [b.site_names(f"{prefix}blocks.{l}.") for l, b in enumerate(blocks)]


class _HookNames:
  """`hook_names()` for a model that defines `hook_sites()`."""

  def hook_names(self) -> tuple[str, ...]:
    """Every hook site of this model, in the order they are reached."""
    return self.hook_sites()[0]


def _outputs(main, *, cache=None, capture=(), hooks=None, weights=None):
  """`main`, then the cache, the captured dict and the weights if asked
  (`hooks.outputs`)."""
  return hooks_lib.outputs(
      main, cache,
      {n: hooks.captured[n] for n in capture} if capture else None,
      None if weights is None else
      {k: jnp.stack([hooks.captured[n] for n in names])
       for k, names in weights.items()})


def _default_positions(inputs):
  b, t = jnp.shape(inputs)[:2]
  return jnp.broadcast_to(jnp.arange(t), (b, t))  # [B, T]


def _patterns(fmt, num_layers):
  return tuple(fmt.format(l) for l in range(num_layers))


class DecoderLM(_HookNames, nnx.Module):
  """Causal decoder: embed -> L causal blocks -> [final LN] -> readout.

  Inputs are token ids `[B, T]`, or features `[B, T, F]` when
  `config.input_dim=F > 0` (a linear input layer replaces the embedding).
  The readout has `config.output_dim` units when > 0, else V (logits).
  The model owns its cache: `init_cache(batch)` gives one `KVCache` per
  block, and a call with `cache=` attends over it and returns the new one.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = blocks_lib.Embedder(config, rngs=rngs)
    self.blocks = _make_blocks(config, rngs, causal=True)
    self.final_ln = (blocks_lib.make_norm(config, rngs)
                     if config.final_ln else None)
    # A tied readout reuses the token embedding (`_tied_readout`).
    self.readout = None if config.tie_embeddings else nnx.Linear(
        config.d_model, config.out_features, use_bias=config.readout_bias,
        **blocks_lib.linear_args(config, rngs))

  def hook_sites(self):
    """`(names, unavailable)`: every hook site of this model in the order
    they are reached, and the sites its implementation does not form,
    each with the reason and the way out."""
    return blocks_lib.merge_site_names(_block_sites(self.blocks))

  def init_cache(self, batch: int, max_len: int | None = None
                 ) -> tuple[kv_cache.KVCache, ...]:
    """One empty `KVCache` per block, `max_len` slots (default: the model's
    `max_len`; a learned or sinusoidal table bounds it)."""
    c = self.config
    max_len = c.max_len if max_len is None else max_len
    if c.positions in ("learned", "sinusoidal") and max_len > c.max_len:
      raise ValueError(f"init_cache: `max_len`={max_len} exceeds the model's "
                       f"{c.positions} position table ({c.max_len} "
                       "positions)")
    return tuple(b.attn.init_cache(batch, max_len) for b in self.blocks)

  def __call__(self, inputs, *, positions=None, mask=None, cache=None,
               lengths=None, head_mask=None, capture=(), patch=None,
               deterministic=True, rngs=None, return_weights=False,
               rules=score_rules.NO_RULES):
    """`inputs [B,T]` (or `[B,T,F]`) -> logits `[B, T, V or O]`.

    `positions [B, T]` default to 0..T-1, or with a `cache` to each row's
    next slots `length[b] + t` (positions are per sequence, so a ragged
    batch decodes as each row alone). `mask` (bool, broadcastable to
    `[B, H, T, T]`, or `[B, H, T, S]` over cache slots) is combined with
    the causal rule. `cache`: from `init_cache`; `lengths [B]` (None: all
    T) counts each row's real tokens, the rest is right padding that is
    never written (its logits are junk). `head_mask [L, H]`; `capture`,
    `patch`: hook sites (see the module docstring). `rules`: a
    `score_rules.ScoreRules` every self-attention layer gets whole, e.g.
    `ScoreRules(q_segment_ids=ids, kv_segment_ids=ids)` with `ids [B, T]`
    (int, no cache) for packed sequences, a token attending only within
    its segment (pass `positions` that restart per segment where the
    position scheme should), or user rules for a model whose config has
    none. `deterministic=False` runs dropout with one key drawn from
    `rngs` (an `nnx.Rngs` or a key; `modules.dropout_key`), folded with
    the layer's index.

    Returns logits, then the new cache, the captured dict and
    `{"self": [L, B, H, T, T or S]}` when asked for (in that order).
    """
    c = self.config
    inputs = inputs_lib.check(inputs, c, fn="DecoderLM")
    hooks, capture = _make_hooks(
        self, capture, patch, {("head_mask", "blocks.{}.attn.z"): head_mask},
        _patterns("blocks.{}.attn.pattern", c.num_layers)
        if return_weights else ())
    table_positions = positions
    if cache is not None:
      if len(cache) != c.num_layers:
        raise ValueError(f"`cache` must hold one KVCache per block "
                         f"({c.num_layers}), got {len(cache)}")
      if positions is None:
        positions = kv_cache.positions(cache[0], jnp.shape(inputs)[1])
      # Only padding rows, or rows past the cache (their output is NaN),
      # can point past a position table; clamp just their lookup.
      table_positions = jnp.minimum(positions, c.max_len - 1)
    elif positions is None:
      positions = table_positions = _default_positions(inputs)
    x = self.embed(inputs, table_positions)
    x, new_cache = _run_blocks(
        self.blocks, x, hooks, positions=positions, mask=mask,
        cache=cache, lengths=lengths, deterministic=deterministic,
        key=modules.dropout_key(rngs, deterministic), rules=rules)
    if self.final_ln is not None:
      x = self.final_ln(x)
    weights = ({"self": _patterns("blocks.{}.attn.pattern", c.num_layers)}
               if return_weights else None)
    return _outputs(self.logits(x), cache=new_cache, capture=capture,
                    hooks=hooks, weights=weights)

  def run_with_cache(self, inputs, names=None, **kwargs):
    """`(logits [B, T, V or O], ActivationCache)` of one forward.

    `names`: None (every site of `hook_names()`), a full site name, a list
    of them, or a filter name -> bool; other keywords as `__call__`
    (`positions`, `mask`, `head_mask`, `patch`, ...). See
    `activation_cache.run_with_cache`.
    """
    return activation_cache.run_with_cache(self, inputs, names, **kwargs)

  def _tied_readout(self, x):
    """`x [B, T, D] @ E^T` with the token embedding `E [V, D]`, as
    `nnx.Embed.attend` computes it (both cast to the embedding's dtype)
    but at the library's matmul precision, which `attend` does not take."""
    emb = self.embed.embed
    table = emb.embedding[...]
    dtype = emb.dtype or jnp.result_type(x, table)
    return precision.einsum("...d,vd->...v", x.astype(dtype),
                            table.astype(dtype))

  def logits(self, x):
    """The readout of the final stream `x [B, T, D]` -> `[B, T, V or O]`:
    the readout layer or the tied embedding, then the final soft cap."""
    c = self.config
    y = self._tied_readout(x) if self.readout is None else self.readout(x)
    if c.final_soft_cap is not None:
      y = c.final_soft_cap * jnp.tanh(y / c.final_soft_cap)
    return y


class Encoder(_HookNames, nnx.Module):
  """Bidirectional encoder over tokens with a key-padding mask.

  Token `PAD_ID` (0) marks padding: no query attends to a padded key,
  unless the call passes its own `mask`. Ends with a norm (unless
  `config.final_ln` is False, as in BERT's post-LN blocks); returns
  `[B, S, D]` (and `{"self": [L,B,H,S,S]}`).
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = blocks_lib.Embedder(config, rngs=rngs)
    self.blocks = _make_blocks(config, rngs)
    self.final_ln = (blocks_lib.make_norm(config, rngs)
                     if config.final_ln else None)

  def hook_sites(self):
    """`(names, unavailable)`, as `DecoderLM.hook_sites`."""
    return blocks_lib.merge_site_names(_block_sites(self.blocks))

  def encode(self, tokens, hooks, *, mask=None, token_types=None,
             deterministic=True, rngs=None):
    """`tokens [B, S]` -> `[B, S, D]` with `hooks` scoped to this encoder;
    `mask [B, S]` (bool, True = a real token; None: tokens != PAD_ID)."""
    positions = _default_positions(tokens)
    if mask is None:
      mask = tokens != PAD_ID
    elif jnp.shape(mask) != jnp.shape(tokens):
      raise ValueError(f"Encoder: `mask` must be [B, S]={jnp.shape(tokens)} "
                       f"(True = a real token), got {jnp.shape(mask)}")
    key_valid = jnp.asarray(mask, bool)[:, None, None, :]  # [B, 1, 1, S]
    x = self.embed(tokens, positions, token_types)
    x, _ = _run_blocks(self.blocks, x, hooks, positions=positions,
                       mask=key_valid, deterministic=deterministic,
                       key=modules.dropout_key(rngs, deterministic))
    return x if self.final_ln is None else self.final_ln(x)

  def __call__(self, tokens, *, mask=None, token_types=None, head_mask=None,
               capture=(), patch=None, deterministic=True, rngs=None,
               return_weights=False):
    """`tokens [B, S]` -> `[B, S, D]`; `mask [B, S]` marks real tokens
    (None: tokens != PAD_ID), `token_types [B, S]` with
    `config.type_vocab_size`; the rest as `DecoderLM`."""
    c = self.config
    tokens = inputs_lib.check(tokens, c, fn="Encoder", name="tokens")
    hooks, capture = _make_hooks(
        self, capture, patch, {("head_mask", "blocks.{}.attn.z"): head_mask},
        _patterns("blocks.{}.attn.pattern", c.num_layers)
        if return_weights else ())
    x = self.encode(tokens, hooks, mask=mask, token_types=token_types,
                    deterministic=deterministic, rngs=rngs)
    weights = ({"self": _patterns("blocks.{}.attn.pattern", c.num_layers)}
               if return_weights else None)
    return _outputs(x, capture=capture, hooks=hooks, weights=weights)


  def run_with_cache(self, tokens, names=None, **kwargs):
    """`([B, S, D], ActivationCache)` of one forward; as
    `DecoderLM.run_with_cache`."""
    return activation_cache.run_with_cache(self, tokens, names, **kwargs)


class Decoder(nnx.Module):
  """The decoder half of `EncoderDecoder`: causal blocks with
  cross-attention over the encoder output, final LN and readout."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    common = blocks_lib.common_args(config, rngs)
    self.embed = blocks_lib.Embedder(config, rngs=rngs)
    self.blocks = _make_blocks(config, rngs, cross_attention=True,
                               causal=True)
    self.final_ln = nnx.LayerNorm(config.d_model, **common)
    self.readout = nnx.Linear(config.d_model, config.out_features,
                              **blocks_lib.linear_args(config, rngs))

  def __call__(self, tgt, context, context_mask, hooks, *,
               deterministic=True, rngs=None):
    positions = _default_positions(tgt)
    tgt_valid = (tgt != PAD_ID)[:, None, None, :]  # [B, 1, 1, T]
    x = self.embed(tgt, positions)
    x, _ = _run_blocks(
        self.blocks, x, hooks, positions=positions, mask=tgt_valid,
        context=context, context_mask=context_mask,
        deterministic=deterministic,
        key=modules.dropout_key(rngs, deterministic))
    return self.readout(self.final_ln(x))


class EncoderDecoder(_HookNames, nnx.Module):
  """Encoder plus a causal decoder with cross-attention (shared vocabulary).

  Padding (`PAD_ID`) is masked on both sides: encoder keys in the encoder
  and in cross-attention, decoder keys in decoder self-attention.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.encoder = Encoder(config, rngs=rngs)
    self.decoder = Decoder(config, rngs=rngs)

  def hook_sites(self):
    """`(names, unavailable)`, as `DecoderLM.hook_sites`."""
    return blocks_lib.merge_site_names(
        _block_sites(self.encoder.blocks, "encoder.")
        + _block_sites(self.decoder.blocks, "decoder."))

  def __call__(self, src, tgt, *, encoder_head_mask=None, head_mask=None,
               cross_head_mask=None, capture=(), patch=None,
               deterministic=True, rngs=None, return_weights=False):
    """`src [B,S]`, decoder input `tgt [B,T]` -> logits `[B, T, V]`.

    Head masks are `[L, H]` for the encoder, decoder self- and
    cross-attention. `rngs` as `DecoderLM`: one draw, split between the
    encoder and the decoder. Returns logits, then the captured dict and
    `{"encoder", "self", "cross"}` weights when asked for.
    """
    n = self.config.num_layers
    src = inputs_lib.check(src, self.config, fn="EncoderDecoder", name="src")
    tgt = inputs_lib.check(tgt, self.config, fn="EncoderDecoder", name="tgt")
    weights = None
    if return_weights:
      weights = {"encoder": _patterns("encoder.blocks.{}.attn.pattern", n),
                 "self": _patterns("decoder.blocks.{}.attn.pattern", n),
                 "cross": _patterns("decoder.blocks.{}.cross.pattern", n)}
    hooks, capture = _make_hooks(
        self, capture, patch,
        {("encoder_head_mask", "encoder.blocks.{}.attn.z"): encoder_head_mask,
         ("head_mask", "decoder.blocks.{}.attn.z"): head_mask,
         ("cross_head_mask", "decoder.blocks.{}.cross.z"): cross_head_mask},
        sum(weights.values(), ()) if weights else ())
    key = modules.dropout_key(rngs, deterministic)
    enc_rng, dec_rng = ((None, None) if key is None
                        else jax.random.split(key))
    context = self.encoder.encode(src, hooks.scope("encoder"),
                                  deterministic=deterministic, rngs=enc_rng)
    src_valid = (src != PAD_ID)[:, None, None, :]  # [B, 1, 1, S]
    logits = self.decoder(tgt, context, src_valid, hooks.scope("decoder"),
                          deterministic=deterministic, rngs=dec_rng)
    return _outputs(logits, capture=capture, hooks=hooks, weights=weights)


def with_implementation(model, implementation: str):
  """The same model (same weights, shared) running another `attend` path,
  e.g. "einsum" to read `pattern` from a model trained with "flash"."""
  config = model.config.replace(implementation=implementation)
  abstract = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(abstract)
  return nnx.merge(graphdef, nnx.state(model))
