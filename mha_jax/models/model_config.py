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

POSITIONS = ("learned", "sinusoidal", "rotary", "alibi", "none")


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
  implementation: str = "vmap"  # key of attention.IMPLEMENTATIONS
  # Attention variants (mha_jax.core.score_rules); "alibi" is a `positions`.
  local_window: tuple[int, int] | None = None  # (left, right) sliding window
  logit_soft_cap: float | None = None  # c: scores -> c tanh(s / c)
  attn_scale: float | None = None  # q.k multiplier (None: 1 / sqrt(Dh))
  attention_sinks: bool = False  # a learned sink logit per head
  qk_norm: str | None = None  # None, "rms" or "layer"
  dtype: Any = None  # compute dtype (None: param_dtype)
  param_dtype: Any = jnp.float32  # parameter storage dtype

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
    need(self.implementation in attention.IMPLEMENTATIONS, "implementation",
         f"expected one of {sorted(attention.IMPLEMENTATIONS)}, got "
         f"{self.implementation!r}")
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
    for name in ("dtype", "param_dtype"):
      val = getattr(self, name)
      if val is None and name == "dtype":
        continue
      try:
        ok = jnp.issubdtype(jnp.dtype(val), jnp.floating)
      except TypeError:
        ok = False
      need(ok, name, f"must be a floating dtype, got {val!r}")

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
