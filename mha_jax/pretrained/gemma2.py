"""Gemma 2: Llama's table plus a norm after each sublayer, and its numerics.

Differences from Llama: RMSNorm multiplies by (1 + w) (`norm_offset=1`,
the checkpoint's w loads as is); token embeddings times sqrt(D), rounded
to the compute dtype; GeGLU (gelu tanh); a norm before and after each
sublayer (`norm_placement="sandwich"`: Hugging Face's
`post_attention_layernorm` is the norm after attention, not before the
MLP); scores scaled by query_pre_attn_scalar^-1/2 and soft-capped; final
logits soft-capped; sliding and global layers alternating
(`layer_types`); tied embeddings.
"""

from __future__ import annotations

import math

from mha_jax.pretrained import family as F
from mha_jax.pretrained import llama
from mha_jax.pretrained.family import Rule

_L = "layers.{l}."
_B = "blocks.{l}."
# Hugging Face's name, ours, llama.cpp's: its `ffn_norm` is the norm
# before the MLP, which in Gemma is pre_feedforward_layernorm.
_NORMS = (("post_attention_layernorm", "ln_attn_post", "post_attention_norm"),
          ("pre_feedforward_layernorm", "ln_mlp", "ffn_norm"),
          ("post_feedforward_layernorm", "ln_mlp_post", "post_ffw_norm"))

RULES = tuple(r for r in llama.RULES
              if "post_attention_layernorm" not in r.source) + tuple(
                  Rule(f"{_L}{hf}.weight", "m", f"{_B}{ours}.scale", "m",
                       gguf=f"blk.{{l}}.{gguf}.weight")
                  for hf, ours, gguf in _NORMS)


def _from_hf(hf):
  n, d = hf.need("num_hidden_layers"), hf.need("hidden_size")
  hf.only("use_bidirectional_attention", (None, False))
  if hf.get("sliding_window_size") not in (None, hf.get("sliding_window")):
    hf.fail("sliding_window_size", "an older name of sliding_window; "
            f"expected {hf.get('sliding_window')!r}, got "
            f"{hf.get('sliding_window_size')!r}")
  act = ("hidden_activation" if "hidden_activation" in hf else "hidden_act")
  if act == "hidden_activation":
    hf.get("hidden_act")
  return dict(
      llama.common_from_hf(hf), use_bias=bool(hf.get("attention_bias", False)),
      mlp_activation=F.activation(hf, act, "gelu_pytorch_tanh"),
      norm_offset=1.0, norm_placement="sandwich", embed_scale=math.sqrt(d),
      tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
      attn_scale=float(hf.need("query_pre_attn_scalar", (int, float))) ** -0.5,
      logit_soft_cap=hf.get("attn_logit_softcapping"),
      final_soft_cap=hf.get("final_logit_softcapping"),
      # Older configs have no layer_types: even layers slide.
      layer_windows=F.windows(hf, n, lambda l: l % 2 == 0))


def _to_hf(c):
  return dict(llama.common_to_hf(c), attention_bias=c.use_bias,
              hidden_activation=F.ACTIVATION_NAMES[c.mlp_activation],
              query_pre_attn_scalar=scalar(c.attn_scale),
              attn_logit_softcapping=c.logit_soft_cap,
              final_logit_softcapping=c.final_soft_cap,
              **F.windows_to_hf(c))


def scalar(scale):
  """query_pre_attn_scalar from the score scale s = scalar^-1/2 (Gemma 2
  and 3)."""
  if scale is None:
    raise ValueError("attn_scale: Gemma needs query_pre_attn_scalar")
  scalar = scale ** -2
  return round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar


GEMMA2 = F.Family(name="gemma2", model_types=("gemma2",),
                  architecture="Gemma2ForCausalLM", model="decoder",
                  prefix="model.", rules=RULES, ignored=llama.IGNORED,
                  from_hf=_from_hf, to_hf=_to_hf)
