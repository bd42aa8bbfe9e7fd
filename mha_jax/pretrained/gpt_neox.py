"""GPT-NeoX (Pythia): parallel attention and MLP, partial rotary, fused qkv.

`query_key_value.weight` is a torch `Linear` `[3 D, D]` whose outputs run
head by head, q, k, v within each head ("(h three d) m"): the opposite
nesting of GPT-2's `c_attn`. Rotary turns the first `rotary_pct` of each
head's features (`rotary_dim`); both sublayers read the block's input
(`use_parallel_residual`, `parallel_block`), each with its own LayerNorm.
"""

from __future__ import annotations

from mha_jax.pretrained import family as F
from mha_jax.pretrained.family import Rule

_L = "layers.{l}."
_B = "blocks.{l}."
_QKV = (_B + "attn.w_q", _B + "attn.w_k", _B + "attn.w_v")
_QKV_BIAS = (_B + "attn.b_q", _B + "attn.b_k", _B + "attn.b_v")

RULES = (
    Rule("embed_in.weight", "v m", "embed.embed.embedding", "v m"),
    Rule(_L + "input_layernorm.weight", "m", _B + "ln_attn.scale", "m"),
    Rule(_L + "input_layernorm.bias", "m", _B + "ln_attn.bias", "m"),
    Rule(_L + "attention.query_key_value.weight", "(h three d) m", _QKV,
         "m h d"),
    Rule(_L + "attention.query_key_value.bias", "(h three d)", _QKV_BIAS,
         "h d"),
    Rule(_L + "attention.dense.weight", "m (h d)", _B + "attn.w_o", "h d m"),
    Rule(_L + "attention.dense.bias", "m", _B + "attn.b_o", "m"),
    Rule(_L + "post_attention_layernorm.weight", "m", _B + "ln_mlp.scale",
         "m"),
    Rule(_L + "post_attention_layernorm.bias", "m", _B + "ln_mlp.bias", "m"),
    Rule(_L + "mlp.dense_h_to_4h.weight", "f m", _B + "mlp_in.kernel", "m f"),
    Rule(_L + "mlp.dense_h_to_4h.bias", "f", _B + "mlp_in.bias", "f"),
    Rule(_L + "mlp.dense_4h_to_h.weight", "m f", _B + "mlp_out.kernel", "f m"),
    Rule(_L + "mlp.dense_4h_to_h.bias", "m", _B + "mlp_out.bias", "m"),
    Rule("final_layer_norm.weight", "m", "final_ln.scale", "m"),
    Rule("final_layer_norm.bias", "m", "final_ln.bias", "m"),
    Rule("embed_out.weight", "v m", "readout.kernel", "m v"),
)
IGNORED = ((r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",
            "buffers of older checkpoints (causal mask, rotary "
            "frequencies)"),)


def _from_hf(hf):
  d, h = hf.need("hidden_size"), hf.need("num_attention_heads")
  theta, scaling, pct = F.rope(hf, theta_field="rotary_emb_base",
                               partial_field="rotary_pct")
  dh = d // h
  rotary_dim = int(dh * pct)
  if rotary_dim % 2 or rotary_dim < 2:
    hf.fail("rotary_pct", f"gives {rotary_dim} rotated features of Dh={dh}; "
            "expected an even number >= 2")
  hf.only("is_decoder", (True, False), False)
  bias = bool(hf.get("attention_bias", True))
  return dict(
      vocab_size=hf.need("vocab_size"), d_model=d,
      num_layers=hf.need("num_hidden_layers"), num_heads=h,
      mlp_dim=hf.need("intermediate_size"),
      max_len=hf.need("max_position_embeddings"), positions="rotary",
      rotary_base=theta, rotary_scaling=scaling,
      rotary_dim=None if rotary_dim == dh else rotary_dim,
      use_bias=bias, norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
      parallel_block=bool(hf.get("use_parallel_residual", True)),
      mlp_activation=F.activation(hf, "hidden_act", "gelu"),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      readout_bias=False)


def _to_hf(c):
  return dict(vocab_size=c.vocab_size, hidden_size=c.d_model,
              num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
              intermediate_size=c.mlp_width,
              max_position_embeddings=c.max_len, attention_bias=c.use_bias,
              layer_norm_eps=c.norm_eps,
              use_parallel_residual=c.parallel_block,
              hidden_act=F.ACTIVATION_NAMES[c.mlp_activation],
              tie_word_embeddings=c.tie_embeddings,
              **F.rope_to_hf(c, (c.rotary_dim or c.head_width) / c.head_width))


GPT_NEOX = F.Family(name="gpt_neox", model_types=("gpt_neox",),
                    architecture="GPTNeoXForCausalLM", model="decoder",
                    prefix="gpt_neox.", rules=RULES, ignored=IGNORED,
                    from_hf=_from_hf, to_hf=_to_hf)
