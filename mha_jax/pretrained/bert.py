"""BERT (and MiniLM): a post-LayerNorm encoder with three embeddings.

Token, position and token-type embeddings are summed and normalised
(`embed_norm`); each block is x = LN(x + Attn(x)), x = LN(x + MLP(x))
(`norm_placement="post"`), with no norm after the last block. Padding is
the `mask` of `Encoder`. The pooler and pre-training heads are not part
of `Encoder` and are not loaded.
"""

from __future__ import annotations

from mha_jax.pretrained import family as F
from mha_jax.pretrained.family import Rule

_L = "encoder.layer.{l}."
_B = "blocks.{l}."


def _ln(source, target):
  return (Rule(source + ".weight", "m", target + ".scale", "m"),
          Rule(source + ".bias", "m", target + ".bias", "m"))


def _linear(source, target, src, dst, bias):
  return (Rule(source + ".weight", src, target, dst),
          Rule(source + ".bias", bias[0], target.replace("w_", "b_").replace(
              "kernel", "bias"), bias[1]))


RULES = (
    Rule("embeddings.word_embeddings.weight", "v m", "embed.embed.embedding",
         "v m"),
    Rule("embeddings.position_embeddings.weight", "p m",
         "embed.pos_embed.embedding", "p m"),
    Rule("embeddings.token_type_embeddings.weight", "t m",
         "embed.type_embed.embedding", "t m"),
    *_ln("embeddings.LayerNorm", "embed.embed_norm"),
    *_linear(_L + "attention.self.query", _B + "attn.w_q", "(h d) m",
             "m h d", ("(h d)", "h d")),
    *_linear(_L + "attention.self.key", _B + "attn.w_k", "(h d) m", "m h d",
             ("(h d)", "h d")),
    *_linear(_L + "attention.self.value", _B + "attn.w_v", "(h d) m",
             "m h d", ("(h d)", "h d")),
    *_linear(_L + "attention.output.dense", _B + "attn.w_o", "m (h d)",
             "h d m", ("m", "m")),
    *_ln(_L + "attention.output.LayerNorm", _B + "ln_attn"),
    *_linear(_L + "intermediate.dense", _B + "mlp_in.kernel", "f m", "m f",
             ("f", "f")),
    *_linear(_L + "output.dense", _B + "mlp_out.kernel", "m f", "f m",
             ("m", "m")),
    *_ln(_L + "output.LayerNorm", _B + "ln_mlp"),
)
IGNORED = (
    (r"embeddings\.position_ids", "a buffer of 0..max_len-1"),
    (r"pooler\..*", "the [CLS] pooler, not part of the encoder's output"),
    (r"cls\..*", "pre-training heads (masked LM, next sentence)"),
)


def _from_hf(hf):
  hf.only("position_embedding_type", ("absolute",), "absolute")
  hf.only("is_decoder", (False,), False)
  hf.only("add_cross_attention", (False,), False)
  hf.get("tie_word_embeddings")  # ties the masked-LM head, not loaded
  return dict(
      vocab_size=hf.need("vocab_size"), d_model=hf.need("hidden_size"),
      num_layers=hf.need("num_hidden_layers"),
      num_heads=hf.need("num_attention_heads"),
      mlp_dim=hf.need("intermediate_size"),
      max_len=hf.need("max_position_embeddings"), positions="learned",
      type_vocab_size=hf.get("type_vocab_size", 2), use_bias=True,
      norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
      norm_placement="post", embed_norm=True, final_ln=False,
      mlp_activation=F.activation(hf, "hidden_act", "gelu"))


def _to_hf(c):
  return dict(vocab_size=c.vocab_size, hidden_size=c.d_model,
              num_hidden_layers=c.num_layers,
              num_attention_heads=c.num_heads, intermediate_size=c.mlp_width,
              max_position_embeddings=c.max_len,
              type_vocab_size=c.type_vocab_size, layer_norm_eps=c.norm_eps,
              hidden_act=F.ACTIVATION_NAMES[c.mlp_activation],
              position_embedding_type="absolute")


BERT = F.Family(name="bert", model_types=("bert",), architecture="BertModel",
                model="encoder", prefix="bert.", rules=RULES, ignored=IGNORED,
                from_hf=_from_hf, to_hf=_to_hf)
