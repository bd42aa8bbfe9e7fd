"""Phi-3 and Phi-4-mini: Llama's block with fused q/k/v and gate/up.

`self_attn.qkv_proj.weight` is a torch `Linear` `[(H + 2K) Dh, D]`: all
of q's rows, then k's, then v's ("(h d | k d | k d) m", unequal parts
under GQA); `mlp.gate_up_proj.weight` `[2F, D]` is the gate's rows, then
up's ("(two f) m"). No biases. The head width is hidden_size / heads.
Rotary turns the first `partial_rotary_factor` of each head's features
(Phi-4-mini: 0.75, `rotary_dim`). `sliding_window`, when set, slides
over every layer (Phi-3-mini-4k: 2047). The long-context variants'
"longrope" scaling is refused by name (`family.rope`).
"""

from __future__ import annotations

from mha_jax.pretrained import family as F
from mha_jax.pretrained import llama
from mha_jax.pretrained.family import Rule

_L = "layers.{l}."
_B = "blocks.{l}."

RULES = (
    Rule("embed_tokens.weight", "v m", "embed.embed.embedding", "v m",
         gguf="token_embd.weight"),
    Rule(_L + "input_layernorm.weight", "m", _B + "ln_attn.scale", "m",
         gguf="blk.{l}.attn_norm.weight"),
    Rule(_L + "self_attn.qkv_proj.weight", "(h d | k d | k d) m",
         (_B + "attn.w_q", _B + "attn.w_k", _B + "attn.w_v"),
         "m h d | m k d | m k d", gguf="blk.{l}.attn_qkv.weight"),
    Rule(_L + "self_attn.o_proj.weight", "m (h d)", _B + "attn.w_o", "h d m",
         gguf="blk.{l}.attn_output.weight"),
    Rule(_L + "post_attention_layernorm.weight", "m", _B + "ln_mlp.scale", "m",
         gguf="blk.{l}.ffn_norm.weight"),
    Rule(_L + "mlp.gate_up_proj.weight", "(two f) m",
         (_B + "mlp_gate.kernel", _B + "mlp_in.kernel"), "m f",
         gguf="blk.{l}.ffn_up.weight"),
    Rule(_L + "mlp.down_proj.weight", "m f", _B + "mlp_out.kernel", "f m",
         gguf="blk.{l}.ffn_down.weight"),
    Rule("norm.weight", "m", "final_ln.scale", "m",
         gguf="output_norm.weight"),
    Rule("lm_head.weight", "v m", "readout.kernel", "m v",
         gguf="output.weight"),
)


def _from_hf(hf):
  d, h = hf.need("hidden_size"), hf.need("num_attention_heads")
  dh = d // h
  if hf.get("head_dim", dh) != dh:
    hf.fail("head_dim", f"Phi-3 heads are hidden_size / heads = {dh} wide; "
            f"got {hf.get('head_dim')}")
  _, _, partial = F.rope(hf, partial_field="partial_rotary_factor")
  rotary_dim = int(dh * partial)
  if rotary_dim % 2 or rotary_dim < 2:
    hf.fail("partial_rotary_factor", f"gives {rotary_dim} rotated features "
            f"of Dh={dh}; expected an even number >= 2")
  # Read by longrope scaling only, which `family.rope` refuses.
  hf.get("original_max_position_embeddings")
  return dict(llama.common_from_hf(hf), head_dim=dh,
              rotary_dim=None if rotary_dim == dh else rotary_dim,
              layer_windows=F.windows(hf, hf.need("num_hidden_layers")),
              mlp_activation=F.activation(hf, "hidden_act", "silu"))


def _to_hf(c):
  out = llama.common_to_hf(c)
  del out["head_dim"]  # not a Phi-3 field: hidden_size / heads
  out.update(F.rope_to_hf(c, (c.rotary_dim or c.head_width) / c.head_width),
             sliding_window=F.windows_to_hf(c)["sliding_window"],
             # Phi3Config's default (32000) is the embedding's padding
             # row, out of range below that vocabulary; the ModelConfig
             # holds no token ids.
             pad_token_id=None)
  return out


PHI3 = F.Family(name="phi3", model_types=("phi3",),
                architecture="Phi3ForCausalLM", model="decoder",
                prefix="model.", rules=RULES, ignored=llama.IGNORED,
                from_hf=_from_hf, to_hf=_to_hf)
