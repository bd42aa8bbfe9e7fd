"""`AttentionSpec`: everything one attention layer is, in one frozen object.

Shape letters: D d_model, H query heads, K key/value heads, Dh per-head
width.

A layer's options used to travel as twenty keywords from the model config
through the block and the NNX module to `multi_head.attention_layer`, each
hop copying them and some checking them. Now `ModelConfig.attention_spec`
builds one `AttentionSpec` per layer, it is validated here once, and the
module and `attention_layer` read it: a new option is a field below, a check
in `__post_init__` and the one place in `attention_layer` that reads it.
What changes from call to call (arrays: masks, positions, segment ids, the
cache) stays a call argument.

Following `window` from config to kernel: `ModelConfig.local_window` (or
`layer_windows[l]`) -> `ModelConfig.attention_spec(l).local_window` ->
`MultiHeadAttention.spec` -> `attention_layer` merges it into the call's
`ScoreRules` -> `attention.attend(rules=)` -> the kernel's
`score_rules.allowed`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from mha_jax.core import attention
from mha_jax.core import score_rules

QK_NORMS = ("rms", "layer")
NORM_EPS = 1e-6  # Flax's LayerNorm/RMSNorm default


def _fail(field, message):
  raise ValueError(f"AttentionSpec: `{field}` {message}")


def _positive_int(field, value):
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    _fail(field, f"must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """One attention layer: its widths, its path and its score rules.

  Hashable (static under `jax.jit`, an NNX module's static attribute), so
  it holds numbers and names only; arrays come with each call.

  Attributes:
    d_model: D, the input and output width.
    num_heads: H query heads.
    num_kv_heads: K key/value heads (None: H; K < H grouped-query, 1
      multi-query); stored resolved.
    head_dim: Dh (None: D // H); stored resolved.
    use_bias: b_q, b_k, b_v, b_o. out_bias: with `use_bias`, False drops
      b_o (Qwen2's q, k, v biases).
    implementation: the `attend` path (`attention.IMPLEMENTATIONS` or a
      registered one); only "vmap" and "einsum" form the weights.
    causal: the bottom-right causal rule (a decoder's self-attention).
    dropout_rate: attention-weight dropout of a call that is not
      deterministic.
    local_window: `(left, right)` sliding window (None: every key).
    soft_cap: c > 0: scores become `c tanh(s / c)` (Gemma 2).
    scale: the multiplier of q.k (None: 1 / sqrt(Dh)).
    sinks: a learned sink logit per head (`params["sinks"] [H]`, gpt-oss).
    alibi: ALiBi's `-slope_h |i - j|` with the paper's slopes (H a power of
      two).
    qk_norm: None, "rms" (OLMo 2, Gemma 3) or "layer" (Flax's
      `normalize_qk`) on q and k per head, scales `q_norm`, `k_norm [Dh]`.
    qk_norm_eps, qk_norm_offset: that norm's epsilon and the offset added
      to its scales (Gemma 3's (1 + w): 1).
    rotary_base: rotate q and k by their positions with this RoPE base
      (None: no rotation). rotary_dim, rotary_scaling: as in
      `rotary.apply_rotary` (GPT-NeoX's partial rotary, Llama 3's
      frequencies).
    score_mod, mask_mod, block_mask: the layer's user rules
      (`score_rules.ScoreRules`; docs/score_rules.md), fixed functions.
      A rule that reads per-call arrays (document ids of the batch) or
      trains (a learned bias) is passed with each call instead
      (`attention_layer(rules=)`, the NNX module's call arguments), where
      it closes over the call's traced values.
  """
  d_model: int
  num_heads: int
  num_kv_heads: int | None = None
  head_dim: int | None = None
  use_bias: bool = False
  out_bias: bool = True
  implementation: str = attention.DEFAULT_IMPLEMENTATION
  causal: bool = False
  dropout_rate: float = 0.0
  local_window: tuple[int, int] | None = None
  soft_cap: float | None = None
  scale: float | None = None
  sinks: bool = False
  alibi: bool = False
  qk_norm: str | None = None
  qk_norm_eps: float = NORM_EPS
  qk_norm_offset: float = 0.0
  rotary_base: float | None = None
  rotary_dim: int | None = None
  rotary_scaling: tuple | None = None
  score_mod: Callable | None = None
  mask_mod: Callable | None = None
  block_mask: Any = None

  def __post_init__(self):
    _positive_int("d_model", self.d_model)
    _positive_int("num_heads", self.num_heads)
    kv = self.num_heads if self.num_kv_heads is None else self.num_kv_heads
    _positive_int("num_kv_heads", kv)
    if self.num_heads % kv:
      _fail("num_kv_heads", f"K={kv} must divide num_heads H="
            f"{self.num_heads}")
    if self.head_dim is None and self.d_model % self.num_heads:
      _fail("head_dim", f"is None but d_model={self.d_model} is not "
            f"divisible by num_heads={self.num_heads}")
    dh = self.d_model // self.num_heads if self.head_dim is None \
        else self.head_dim
    _positive_int("head_dim", dh)
    # Stored resolved, so that two specs of one layer compare equal.
    object.__setattr__(self, "num_kv_heads", kv)
    object.__setattr__(self, "head_dim", dh)
    attention.check_implementation(self.implementation, "AttentionSpec")
    if not 0.0 <= self.dropout_rate < 1.0:
      _fail("dropout_rate", f"must be in [0, 1), got {self.dropout_rate}")
    if self.qk_norm is not None and self.qk_norm not in QK_NORMS:
      _fail("qk_norm", f"must be None or one of {QK_NORMS}, got "
            f"{self.qk_norm!r}")
    if self.local_window is not None:
      object.__setattr__(self, "local_window", tuple(self.local_window))
    # A block mask fits one call's shape; `attend` checks it there.
    score_rules.check(self.rules().replace(block_mask=None), batch=1,
                      q_len=1, kv_len=1, num_heads=self.num_heads,
                      fn="AttentionSpec")
    if self.rotary_base is not None:
      if not self.rotary_base > 0:
        _fail("rotary_base", f"must be None or > 0, got {self.rotary_base}")
      if dh % 2:
        _fail("head_dim", f"rotary positions need an even head width, got "
              f"{dh}")

  def rules(self, segment_ids=None,
            kv_segment_ids=None) -> score_rules.ScoreRules:
    """This layer's `ScoreRules` for one call: the static rules, ALiBi's
    slopes and the call's segment ids (`kv_segment_ids` default to
    `segment_ids`). The sink logits are parameters: `attention_layer`
    adds them from `params`."""
    if segment_ids is not None and kv_segment_ids is None:
      kv_segment_ids = segment_ids
    return score_rules.ScoreRules(
        local_window=self.local_window, soft_cap=self.soft_cap,
        scale=self.scale, q_segment_ids=segment_ids,
        kv_segment_ids=kv_segment_ids,
        alibi_slopes=(score_rules.alibi_slopes(self.num_heads)
                      if self.alibi else None),
        score_mod=self.score_mod, mask_mod=self.mask_mod,
        block_mask=self.block_mask)

  @property
  def forms_weights(self) -> bool:
    """Whether this layer's path forms `scores` and `pattern`."""
    return attention.forms_weights(self.implementation)

  def replace(self, **changes) -> AttentionSpec:
    """A validated copy with some fields changed."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def of_params(cls, params, **options) -> AttentionSpec:
    """The spec of a plain params dict (`init_mha_params` layout): widths,
    biases, sinks and QK-norm read from the arrays present; `options` are
    the rest (`qk_norm` names the kind used when `params` hold `q_norm`,
    default "rms")."""
    d, h, dh = params["w_q"].shape
    kind = options.pop("qk_norm", None) or "rms"
    return cls(
        d_model=d, num_heads=h, num_kv_heads=params["w_k"].shape[1],
        head_dim=dh, use_bias="b_q" in params, out_bias="b_o" in params,
        sinks="sinks" in params,
        qk_norm=kind if "q_norm" in params else None, **options)
