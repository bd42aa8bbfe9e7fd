"""GPT-2: learned positions, LayerNorm, biases everywhere, GELU (tanh).

Its `Conv1D` layers store weights `[in, out]` (the transpose of torch's
`Linear`), and q, k, v are fused in `c_attn` as `[D, 3 D]`: all of q,
then all of k, then all of v ("m (three h d)"). The readout is tied to
the token embedding unless `tie_word_embeddings` is false.
"""

from __future__ import annotations

from mha_jax.pretrained import family as F
from mha_jax.pretrained.family import Rule

_L = "h.{l}."
_B = "blocks.{l}."
_QKV = (_B + "attn.w_q", _B + "attn.w_k", _B + "attn.w_v")
_QKV_BIAS = (_B + "attn.b_q", _B + "attn.b_k", _B + "attn.b_v")

RULES = (
    Rule("wte.weight", "v m", "embed.embed.embedding", "v m"),
    Rule("wpe.weight", "p m", "embed.pos_embed.embedding", "p m"),
    Rule(_L + "ln_1.weight", "m", _B + "ln_attn.scale", "m"),
    Rule(_L + "ln_1.bias", "m", _B + "ln_attn.bias", "m"),
    Rule(_L + "attn.c_attn.weight", "m (three h d)", _QKV, "m h d"),
    Rule(_L + "attn.c_attn.bias", "(three h d)", _QKV_BIAS, "h d"),
    Rule(_L + "attn.c_proj.weight", "(h d) m", _B + "attn.w_o", "h d m"),
    Rule(_L + "attn.c_proj.bias", "m", _B + "attn.b_o", "m"),
    Rule(_L + "ln_2.weight", "m", _B + "ln_mlp.scale", "m"),
    Rule(_L + "ln_2.bias", "m", _B + "ln_mlp.bias", "m"),
    Rule(_L + "mlp.c_fc.weight", "m f", _B + "mlp_in.kernel", "m f"),
    Rule(_L + "mlp.c_fc.bias", "f", _B + "mlp_in.bias", "f"),
    Rule(_L + "mlp.c_proj.weight", "f m", _B + "mlp_out.kernel", "f m"),
    Rule(_L + "mlp.c_proj.bias", "m", _B + "mlp_out.bias", "m"),
    Rule("ln_f.weight", "m", "final_ln.scale", "m"),
    Rule("ln_f.bias", "m", "final_ln.bias", "m"),
    Rule("lm_head.weight", "v m", "readout.kernel", "m v"),
)
IGNORED = ((r"h\.\d+\.attn\.(bias|masked_bias)",
            "the causal-mask buffers of older checkpoints"),)


def _from_hf(hf):
  if hf.get("scale_attn_by_inverse_layer_idx", False):
    hf.fail("scale_attn_by_inverse_layer_idx", "mha_jax scales every layer's"
            " scores alike; expected false, got true")
  hf.only("add_cross_attention", (False,), False)
  hf.get("reorder_and_upcast_attn")  # mha_jax's softmax is float32 anyway
  hf.get("n_ctx")  # older name of n_positions
  d = hf.need("n_embd")
  return dict(
      vocab_size=hf.need("vocab_size"), d_model=d,
      num_layers=hf.need("n_layer"), num_heads=hf.need("n_head"),
      max_len=hf.need("n_positions"), mlp_dim=hf.get("n_inner", 4 * d),
      positions="learned", use_bias=True,
      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
      mlp_activation=F.activation(hf, "activation_function", "gelu_new"),
      attn_scale=None if hf.get("scale_attn_weights", True) else 1.0,
      tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
      readout_bias=False)


def _to_hf(c):
  return dict(vocab_size=c.vocab_size, n_embd=c.d_model, n_layer=c.num_layers,
              n_head=c.num_heads, n_positions=c.max_len, n_inner=c.mlp_width,
              layer_norm_epsilon=c.norm_eps,
              # GPT-2's own name for gelu (tanh): transformers' code for
              # it rounds differently from "gelu_pytorch_tanh".
              activation_function=dict(F.ACTIVATION_NAMES,
                                       gelu_tanh="gelu_new")[c.mlp_activation],
              scale_attn_weights=c.attn_scale is None,
              tie_word_embeddings=c.tie_embeddings)


GPT2 = F.Family(name="gpt2", model_types=("gpt2",),
                architecture="GPT2LMHeadModel", model="decoder",
                prefix="transformer.", rules=RULES, ignored=IGNORED,
                from_hf=_from_hf, to_hf=_to_hf)
