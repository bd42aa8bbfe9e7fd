"""Qwen3 (dense): Qwen2's block without the q, k, v biases, with QK-norm.

q and k are normalised per head, before rotary, by an RMSNorm of the
head width with the model's rms_norm_eps and a plain weight w (no
1 + w): `qk_norm="rms"` takes the model's eps and offset (0), so
`self_attn.q_norm` / `k_norm` load as they are. The head width is its
own field (`head_dim`, 128 where hidden_size / heads is 64 in
Qwen3-0.6B). Sliding windows as Qwen2 (off in the released models).
"""

from __future__ import annotations

from mha_jax.pretrained import family as F
from mha_jax.pretrained import llama
from mha_jax.pretrained.family import Rule

RULES = llama.RULES + (
    Rule("layers.{l}.self_attn.q_norm.weight", "d", "blocks.{l}.attn.q_norm",
         "d", gguf="blk.{l}.attn_q_norm.weight"),
    Rule("layers.{l}.self_attn.k_norm.weight", "d", "blocks.{l}.attn.k_norm",
         "d", gguf="blk.{l}.attn_k_norm.weight"),
)


def _from_hf(hf):
  bias = bool(hf.get("attention_bias", False))
  return dict(llama.common_from_hf(hf), use_bias=bias, out_bias=bias,
              qk_norm="rms", layer_windows=llama.qwen_windows(hf),
              mlp_activation=F.activation(hf, "hidden_act", "silu"))


def _to_hf(c):
  return dict(llama.qwen_to_hf(c), attention_bias=c.use_bias)


QWEN3 = F.Family(name="qwen3", model_types=("qwen3",),
                 architecture="Qwen3ForCausalLM", model="decoder",
                 prefix="model.", rules=RULES, ignored=llama.IGNORED,
                 from_hf=_from_hf, to_hf=_to_hf)
