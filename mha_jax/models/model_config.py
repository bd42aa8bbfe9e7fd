"""`ModelConfig`: one frozen, validated description of a model.

The models in `mha_jax.models.transformer` take one of these instead of a long
list of keyword arguments: a new option is a field here, a check in
`__post_init__`, and the one place that reads it. `config.model_config`
builds it from an experiment's ConfigDict (the `model` group plus what the
task says about inputs and outputs).

Errors are `ModelConfigError`, a ValueError that names the field, what
was expected and what came; `config.validate_config` reports the same
error as `config.model.<field>`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from mha_jax.core import attention
from mha_jax.core.attention_spec import AttentionSpec

POSITIONS = ("learned", "sinusoidal", "rotary", "alibi", "none")
NORMS = ("layer", "rms")
NORM_PLACEMENTS = ("pre", "post", "sandwich")
ACTIVATIONS = ("gelu_tanh", "gelu_erf", "silu", "relu")
# ("linear", factor) or ("llama3", factor, low_freq_factor,
# high_freq_factor, original_max_len): see `rotary.frequencies`.
ROTARY_SCALINGS = {"linear": 2, "llama3": 5}


class ModelConfigError(ValueError):
  """A bad `ModelConfig` field; `.field` names it."""

  def __init__(self, field: str, message: str):
    super().__init__(f"ModelConfig.{field}: {message}")
    self.field = field
    self.message = message


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The architecture of a `DecoderLM`, `Encoder` or `EncoderDecoder`.

  Sizes use the project's shape letters: V vocabulary, D d_model, L layers,
  H heads, K key/value heads, Dh head width, F MLP width.
  """
  vocab_size: int  # V token ids (0 with continuous inputs)
  d_model: int  # D, residual stream width
  num_layers: int  # L blocks
  num_heads: int  # H query heads per attention layer
  max_len: int  # longest sequence (position table size, default cache)
  num_kv_heads: int | None = None  # K (None: K = H; 1: multi-query)
  head_dim: int | None = None  # Dh (None: D // H)
  mlp_dim: int | None = None  # F (None: 4 D)
  attention_only: bool = False  # drop the MLPs
  positions: str = "learned"  # one of POSITIONS
  rotary_base: float = 10000.0  # RoPE frequency base (positions="rotary")
  input_dim: int = 0  # F_in > 0: continuous inputs [B, T, F_in]
  output_dim: int = 0  # > 0: regression outputs instead of V logits
  final_ln: bool = True  # LayerNorm before the readout (decoder)
  use_bias: bool = False  # biases on the attention projections
  dropout_rate: float = 0.0  # attention-weight dropout when training
  # a key of attention.IMPLEMENTATIONS (or a registered path)
  implementation: str = attention.DEFAULT_IMPLEMENTATION
  # Attention variants (mha_jax.core.score_rules); "alibi" is a `positions`.
  local_window: tuple[int, int] | None = None  # (left, right) sliding window
  logit_soft_cap: float | None = None  # c: scores -> c tanh(s / c)
  attn_scale: float | None = None  # q.k multiplier (None: 1 / sqrt(Dh))
  attention_sinks: bool = False  # a learned sink logit per head
  # User rules of every self-attention layer (score_rules.ScoreRules;
  # docs/score_rules.md): fixed functions of (score,) b, h, q_idx, kv_idx.
  score_mod: Any = None  # (score, b, h, q_idx, kv_idx) -> score
  mask_mod: Any = None  # (b, h, q_idx, kv_idx) -> bool
  qk_norm: str | None = None  # None, "rms" or "layer"; norm_eps, norm_offset
  dtype: Any = None  # compute dtype (None: param_dtype)
  param_dtype: Any = jnp.float32  # parameter storage dtype
  # What pretrained families differ by (mha_jax.pretrained, docs/
  # pretrained.md); every default is the project's own model.
  norm: str = "layer"  # one of NORMS: LayerNorm (with bias) or RMSNorm
  norm_eps: float = 1e-6  # epsilon of every norm (Flax's default)
  norm_offset: float = 0.0  # RMSNorm multiplies by (offset + w) (Gemma: 1)
  norm_placement: str = "pre"  # one of NORM_PLACEMENTS (see blocks.py)
  parallel_block: bool = False  # attention and MLP both read x (GPT-NeoX)
  mlp_activation: str = "gelu_tanh"  # one of ACTIVATIONS
  mlp_gated: bool = False  # act(x W_gate) * (x W_in) (SwiGLU, GeGLU)
  mlp_bias: bool = True  # biases on the MLP's layers
  out_bias: bool | None = None  # b_o (None: use_bias; Qwen2: q, k, v only)
  tie_embeddings: bool = False  # readout = x @ token embedding^T
  readout_bias: bool = True  # a bias on an untied readout
  embed_scale: float | None = None  # token embeddings times this (Gemma)
  embed_norm: bool = False  # a norm after the embeddings (BERT)
  type_vocab_size: int = 0  # > 0: token-type embeddings (BERT's segments)
  rotary_dim: int | None = None  # features rotated per head (None: Dh)
  rotary_scaling: tuple | None = None  # see ROTARY_SCALINGS
  layer_windows: tuple | None = None  # per layer: None or (left, right)
  final_soft_cap: float | None = None  # logits -> c tanh(logits / c)
  # RoPE base of the layers with a sliding window (None: rotary_base).
  # When set, those layers take no rotary_scaling: it applies to the
  # global layers only (Gemma 3). See `rotary_of`.
  local_rotary_base: float | None = None

  def __post_init__(self):
    def need(cond, field, msg):
      if not cond:
        raise ModelConfigError(field, msg)

    for name in ("d_model", "num_layers", "num_heads", "max_len"):
      val = getattr(self, name)
      need(isinstance(val, int) and val >= 1, name,
           f"must be a positive int, got {val!r}")
    for name in ("vocab_size", "input_dim", "output_dim"):
      val = getattr(self, name)
      need(isinstance(val, int) and val >= 0, name,
           f"must be an int >= 0, got {val!r}")
    need(self.input_dim > 0 or self.vocab_size > 0, "vocab_size",
         "must be >= 1 for token inputs (or set input_dim > 0)")
    for name in ("num_kv_heads", "head_dim", "mlp_dim"):
      val = getattr(self, name)
      need(val is None or (isinstance(val, int) and val >= 1), name,
           f"must be None (default) or a positive int, got {val!r}")
    if self.head_dim is None:
      need(self.d_model % self.num_heads == 0, "d_model",
           f"d_model={self.d_model} is not divisible by num_heads="
           f"{self.num_heads} (or set head_dim)")
    if self.num_kv_heads is not None:
      need(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
           f"num_kv_heads={self.num_kv_heads} must divide num_heads="
           f"{self.num_heads}")
    need(self.positions in POSITIONS, "positions",
         f"expected one of {POSITIONS}, got {self.positions!r}")
    if self.positions == "rotary":
      need(self.head_width % 2 == 0, "head_dim",
           f"rotary positions need an even head width, got "
           f"{self.head_width}")
    need(self.rotary_base > 0, "rotary_base",
         f"must be > 0, got {self.rotary_base}")
    need(0.0 <= self.dropout_rate < 1.0, "dropout_rate",
         f"must be in [0, 1), got {self.dropout_rate}")
    problem = attention.implementation_problem(self.implementation)
    need(problem is None, "implementation", problem)
    if self.local_window is not None:
      w = self.local_window
      need(isinstance(w, tuple) and len(w) == 2 and all(
          isinstance(x, int) and x >= 0 for x in w), "local_window",
           f"must be None or a pair (left, right) of ints >= 0, got {w!r}")
    for name in ("logit_soft_cap", "attn_scale"):
      val = getattr(self, name)
      need(val is None or (isinstance(val, (int, float)) and val > 0), name,
           f"must be None or a number > 0, got {val!r}")
    need(self.qk_norm in (None, "rms", "layer"), "qk_norm",
         f"expected None, 'rms' or 'layer', got {self.qk_norm!r}")
    if self.positions == "alibi":
      h = self.num_heads
      need(h & (h - 1) == 0, "num_heads",
           f"ALiBi's slopes are defined for a power-of-two head count, got "
           f"{h}")
    if self.implementation in ("xla", "cudnn"):
      refused = [n for n, on in (
          ("logit_soft_cap", self.logit_soft_cap is not None),
          ("attention_sinks", self.attention_sinks),
          ("positions", self.positions == "alibi")) if on]
      need(not refused, "implementation",
           f"{self.implementation!r} (jax.nn.dot_product_attention) cannot "
           f"run {refused}; use 'flash', 'einsum' or 'vmap'")
    self._check_family_fields(need)
    for name in ("dtype", "param_dtype"):
      val = getattr(self, name)
      if val is None and name == "dtype":
        continue
      try:
        ok = jnp.issubdtype(jnp.dtype(val), jnp.floating)
      except TypeError:
        ok = False
      need(ok, name, f"must be a floating dtype, got {val!r}")

  def _check_family_fields(self, need):
    """The fields pretrained families need, each named when wrong."""
    for name, options in (("norm", NORMS),
                          ("norm_placement", NORM_PLACEMENTS),
                          ("mlp_activation", ACTIVATIONS)):
      val = getattr(self, name)
      need(val in options, name, f"expected one of {options}, got {val!r}")
    need(isinstance(self.norm_eps, (int, float)) and self.norm_eps > 0,
         "norm_eps", f"must be a number > 0, got {self.norm_eps!r}")
    need(isinstance(self.norm_offset, (int, float)), "norm_offset",
         f"must be a number, got {self.norm_offset!r}")
    need(self.norm_offset == 0 or self.norm == "rms", "norm_offset",
         f"applies to norm='rms' only, got {self.norm_offset} with "
         f"norm={self.norm!r}")
    need(not (self.parallel_block and self.norm_placement != "pre"),
         "parallel_block", "needs norm_placement='pre', got "
         f"{self.norm_placement!r}")
    need(not (self.attention_only and (self.parallel_block
                                       or self.mlp_gated)),
         "attention_only", "a model without MLPs cannot have "
         "parallel_block or mlp_gated")
    need(self.out_bias is None or isinstance(self.out_bias, bool),
         "out_bias", f"must be None or a bool, got {self.out_bias!r}")
    need(not (self.out_bias and not self.use_bias), "out_bias",
         "b_o alone is not a layout; set use_bias=True (q, k, v and o) or "
         "out_bias=None")
    if self.tie_embeddings:
      need(self.input_dim == 0 and self.output_dim == 0, "tie_embeddings",
           f"needs token inputs and vocabulary outputs, got input_dim="
           f"{self.input_dim}, output_dim={self.output_dim}")
      need(not self.readout_bias, "readout_bias",
           "a tied readout has no bias; set readout_bias=False")
    need(self.embed_scale is None or (isinstance(
        self.embed_scale, (int, float)) and self.embed_scale > 0),
         "embed_scale", f"must be None or a number > 0, got "
         f"{self.embed_scale!r}")
    need(isinstance(self.type_vocab_size, int) and self.type_vocab_size >= 0,
         "type_vocab_size", f"must be an int >= 0, got "
         f"{self.type_vocab_size!r}")
    r = self.rotary_dim
    need(r is None or (isinstance(r, int) and 2 <= r <= self.head_width
                       and r % 2 == 0), "rotary_dim",
         f"must be None or an even int in [2, Dh={self.head_width}], got "
         f"{r!r}")
    s = self.rotary_scaling
    if s is not None:
      ok = (isinstance(s, tuple) and s and s[0] in ROTARY_SCALINGS
            and len(s) == ROTARY_SCALINGS[s[0]]
            and all(isinstance(v, (int, float)) and v > 0 for v in s[1:]))
      need(ok, "rotary_scaling", f"expected None, ('linear', factor) or "
           "('llama3', factor, low_freq_factor, high_freq_factor, "
           f"original_max_len) with numbers > 0, got {s!r}")
    b = self.local_rotary_base
    need(b is None or (isinstance(b, (int, float)) and not isinstance(
        b, bool) and b > 0), "local_rotary_base",
         f"must be None or a number > 0, got {b!r}")
    for name in ("rotary_dim", "rotary_scaling", "local_rotary_base"):
      need(getattr(self, name) is None or self.positions == "rotary", name,
           f"needs positions='rotary', got {self.positions!r}")
    w = self.layer_windows
    if w is not None:
      ok = (isinstance(w, tuple) and len(w) == self.num_layers and all(
          x is None or (isinstance(x, tuple) and len(x) == 2 and all(
              isinstance(i, int) and i >= 0 for i in x)) for x in w))
      need(ok, "layer_windows", f"must be None or one entry per layer "
           f"({self.num_layers}), each None or (left, right) ints >= 0, "
           f"got {w!r}")
    need(self.final_soft_cap is None or (isinstance(
        self.final_soft_cap, (int, float)) and self.final_soft_cap > 0),
         "final_soft_cap", f"must be None or a number > 0, got "
         f"{self.final_soft_cap!r}")

  def window_of(self, layer: int):
    """Layer `layer`'s sliding window: `layer_windows[layer]` when given,
    else `local_window`."""
    if self.layer_windows is not None:
      return self.layer_windows[layer]
    return self.local_window

  def rotary_of(self, layer: int) -> tuple:
    """Layer `layer`'s RoPE `(base, scaling)`: `(local_rotary_base, None)`
    on a layer with a sliding window when `local_rotary_base` is set (Gemma
    3's local layers), else `(rotary_base, rotary_scaling)`."""
    if self.local_rotary_base is not None and (
        self.window_of(layer) is not None):
      return self.local_rotary_base, None
    return self.rotary_base, self.rotary_scaling

  def attention_spec(self, layer: int = 0, *, causal: bool = False,
                     cross: bool = False) -> AttentionSpec:
    """Layer `layer`'s `AttentionSpec`: the one place where the config's
    attention fields become a layer's options. `causal`: a decoder's
    self-attention. `cross`: cross-attention, whose queries and keys live
    in different sequences, so rotating, windowing or ALiBi by their
    positions would be meaningless; it takes none of them. QK-norm is the
    model's own norm applied per head: same eps and (offset + w)."""
    positional = not cross
    rotary = positional and self.positions == "rotary"
    base, scaling = self.rotary_of(layer)
    return AttentionSpec(
        d_model=self.d_model, num_heads=self.num_heads,
        num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
        use_bias=self.use_bias, out_bias=self.has_out_bias,
        implementation=self.implementation, causal=causal,
        dropout_rate=self.dropout_rate,
        local_window=self.window_of(layer) if positional else None,
        soft_cap=self.logit_soft_cap, scale=self.attn_scale,
        sinks=self.attention_sinks,
        alibi=positional and self.positions == "alibi",
        qk_norm=self.qk_norm, qk_norm_eps=self.norm_eps,
        qk_norm_offset=self.norm_offset,
        rotary_base=base if rotary else None,
        rotary_dim=self.rotary_dim if rotary else None,
        rotary_scaling=scaling if rotary else None,
        score_mod=self.score_mod if positional else None,
        mask_mod=self.mask_mod if positional else None)

  @property
  def has_out_bias(self) -> bool:
    """Whether attention layers have b_o."""
    return self.use_bias if self.out_bias is None else self.out_bias

  @property
  def head_width(self) -> int:
    """Dh."""
    return self.head_dim or self.d_model // self.num_heads

  @property
  def mlp_width(self) -> int:
    """F."""
    return self.mlp_dim or 4 * self.d_model

  @property
  def out_features(self) -> int:
    """Readout width: `output_dim` if > 0, else the vocabulary."""
    return self.output_dim or self.vocab_size

  def replace(self, **changes) -> ModelConfig:
    """A validated copy with some fields changed."""
    return dataclasses.replace(self, **changes)
