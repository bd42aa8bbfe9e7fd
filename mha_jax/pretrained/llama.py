"""Llama, Mistral and Qwen2: RMSNorm, SwiGLU, rotary, GQA.

They share one weight table (torch `Linear` weights are `[out, in]`);
the configs differ: Mistral slides a window over every layer, Qwen2 adds
biases to q, k and v (not o), Llama 3 rescales the rotary frequencies.
Rotary needs no permutation: Hugging Face stores q and k for the
rotate-half pairing that `mha_jax.core.rotary` uses.
"""

from __future__ import annotations

from mha_jax.pretrained import family as F
from mha_jax.pretrained.family import Rule

_L = "layers.{l}."
_B = "blocks.{l}."

RULES = (
    Rule("embed_tokens.weight", "v m", "embed.embed.embedding", "v m",
         gguf="token_embd.weight"),
    Rule(_L + "input_layernorm.weight", "m", _B + "ln_attn.scale", "m",
         gguf="blk.{l}.attn_norm.weight"),
    Rule(_L + "self_attn.q_proj.weight", "(h d) m", _B + "attn.w_q", "m h d",
         gguf="blk.{l}.attn_q.weight"),
    Rule(_L + "self_attn.k_proj.weight", "(k d) m", _B + "attn.w_k", "m k d",
         gguf="blk.{l}.attn_k.weight"),
    Rule(_L + "self_attn.v_proj.weight", "(k d) m", _B + "attn.w_v", "m k d",
         gguf="blk.{l}.attn_v.weight"),
    Rule(_L + "self_attn.o_proj.weight", "m (h d)", _B + "attn.w_o", "h d m",
         gguf="blk.{l}.attn_output.weight"),
    Rule(_L + "self_attn.q_proj.bias", "(h d)", _B + "attn.b_q", "h d",
         gguf="blk.{l}.attn_q.bias"),
    Rule(_L + "self_attn.k_proj.bias", "(k d)", _B + "attn.b_k", "k d",
         gguf="blk.{l}.attn_k.bias"),
    Rule(_L + "self_attn.v_proj.bias", "(k d)", _B + "attn.b_v", "k d",
         gguf="blk.{l}.attn_v.bias"),
    Rule(_L + "self_attn.o_proj.bias", "m", _B + "attn.b_o", "m",
         gguf="blk.{l}.attn_output.bias"),
    Rule(_L + "post_attention_layernorm.weight", "m", _B + "ln_mlp.scale", "m",
         gguf="blk.{l}.ffn_norm.weight"),
    Rule(_L + "mlp.gate_proj.weight", "f m", _B + "mlp_gate.kernel", "m f",
         gguf="blk.{l}.ffn_gate.weight"),
    Rule(_L + "mlp.up_proj.weight", "f m", _B + "mlp_in.kernel", "m f",
         gguf="blk.{l}.ffn_up.weight"),
    Rule(_L + "mlp.down_proj.weight", "m f", _B + "mlp_out.kernel", "f m",
         gguf="blk.{l}.ffn_down.weight"),
    Rule(_L + "mlp.gate_proj.bias", "f", _B + "mlp_gate.bias", "f",
         gguf="blk.{l}.ffn_gate.bias"),
    Rule(_L + "mlp.up_proj.bias", "f", _B + "mlp_in.bias", "f",
         gguf="blk.{l}.ffn_up.bias"),
    Rule(_L + "mlp.down_proj.bias", "m", _B + "mlp_out.bias", "m",
         gguf="blk.{l}.ffn_down.bias"),
    Rule("norm.weight", "m", "final_ln.scale", "m",
         gguf="output_norm.weight"),
    Rule("lm_head.weight", "v m", "readout.kernel", "m v",
         gguf="output.weight"),
)
IGNORED = ((r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",
            "a buffer of the rotary frequencies, recomputed from the config"),)


def common_from_hf(hf: F.HFConfig) -> dict:
  """The fields the decoder families with RMSNorm and rotary read."""
  d, h = hf.need("hidden_size"), hf.need("num_attention_heads")
  theta, scaling, _ = F.rope(hf)
  return dict(
      vocab_size=hf.need("vocab_size"), d_model=d,
      num_layers=hf.need("num_hidden_layers"), num_heads=h,
      num_kv_heads=hf.get("num_key_value_heads", h),
      head_dim=hf.get("head_dim", d // h),
      mlp_dim=hf.need("intermediate_size"),
      max_len=hf.need("max_position_embeddings"),
      positions="rotary", rotary_base=theta, rotary_scaling=scaling,
      norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      mlp_gated=True, mlp_bias=False, readout_bias=False,
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)))


def common_to_hf(c) -> dict:
  return dict(
      vocab_size=c.vocab_size, hidden_size=c.d_model,
      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
      num_key_value_heads=c.num_kv_heads or c.num_heads,
      head_dim=c.head_width, intermediate_size=c.mlp_width,
      max_position_embeddings=c.max_len, rms_norm_eps=c.norm_eps,
      tie_word_embeddings=c.tie_embeddings,
      hidden_act=F.ACTIVATION_NAMES[c.mlp_activation], **F.rope_to_hf(c))


def _llama_from_hf(hf):
  bias = bool(hf.get("attention_bias", False))
  hf.get("pretraining_tp")  # a sliced but equal matmul
  return dict(common_from_hf(hf), use_bias=bias,
              mlp_bias=bool(hf.get("mlp_bias", False)),
              mlp_activation=F.activation(hf, "hidden_act", "silu"))


def _llama_to_hf(c):
  return dict(common_to_hf(c), attention_bias=c.use_bias,
              mlp_bias=c.mlp_bias)


def _mistral_from_hf(hf):
  n = hf.need("num_hidden_layers")
  return dict(common_from_hf(hf), layer_windows=F.windows(hf, n),
              mlp_activation=F.activation(hf, "hidden_act", "silu"))


def _mistral_to_hf(c):
  w = F.windows_to_hf(c)
  return dict(common_to_hf(c), sliding_window=w["sliding_window"])


def qwen_windows(hf: F.HFConfig):
  """Qwen2's and Qwen3's per-layer windows: with use_sliding_window, the
  layers from max_window_layers on slide (unless layer_types says
  otherwise); without it sliding_window is moot."""
  n = hf.need("num_hidden_layers")
  first = hf.get("max_window_layers", n)
  windows = (F.windows(hf, n, lambda l: l >= first)
             if hf.get("use_sliding_window", False) else None)
  if windows is None:
    hf.get("sliding_window"), hf.get("layer_types")
  return windows


def _qwen2_from_hf(hf):
  return dict(common_from_hf(hf), use_bias=True, out_bias=False,
              layer_windows=qwen_windows(hf),
              mlp_activation=F.activation(hf, "hidden_act", "silu"))


def qwen_to_hf(c):
  out = dict(common_to_hf(c), use_sliding_window=c.layer_windows is not None)
  if c.layer_windows is not None:
    out.update(F.windows_to_hf(c), max_window_layers=c.num_layers)
  return out


def _decoder(name, arch, from_hf, to_hf):
  return F.Family(name=name, model_types=(name,), architecture=arch,
                  model="decoder", prefix="model.", rules=RULES,
                  ignored=IGNORED, from_hf=from_hf, to_hf=to_hf)


LLAMA = _decoder("llama", "LlamaForCausalLM", _llama_from_hf, _llama_to_hf)
MISTRAL = _decoder("mistral", "MistralForCausalLM", _mistral_from_hf,
                   _mistral_to_hf)
QWEN2 = _decoder("qwen2", "Qwen2ForCausalLM", _qwen2_from_hf, qwen_to_hf)
