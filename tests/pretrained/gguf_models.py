"""Tiny GGUF files written from tiny random transformers models, the way
llama.cpp's converter writes them, for the GGUF loader's fast tests.

The writer is independent of mha_jax's tables: tensor names come from
the `gguf` package's own name map (`gguf.get_tensor_name_map`), and the
two conversions llama.cpp makes are written here from its documented
behaviour: for llama, the rows of q and k are permuted from Hugging
Face's rotate-half order to interleaved pairs (row i*2 + half holds
the rotate-half row half * Dh/2 + i of its head); for Gemma, every
RMSNorm weight is stored as 1 + w. The metadata is what llama.cpp's
converter writes for each architecture: Gemma 2's soft caps and window
and no rope base; Phi-3's rotated width, original context and a window
of 0 for none; Mistral as a `llama` file whose general.name says
Mistral. transformers reads the same file with its own GGUF loader, the
reference.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
import transformers as tf

import hf_models

Q = gguf.GGMLQuantizationType
# One quantized type per kind of tensor, so that the loader meets each
# of the package's types that can be written in NumPy; a matrix whose
# rows are not a whole number of blocks is written as F16 instead (as
# llama.cpp falls back).
TYPES = {"token_embd": Q.Q8_0, "attn_q": Q.Q8_0, "attn_k": Q.Q4_1,
         "attn_v": Q.Q5_0, "attn_output": Q.Q5_1, "ffn_gate": Q.Q4_0,
         "ffn_up": Q.BF16, "ffn_down": Q.Q8_0, "output": Q.Q4_0,
         "attn_qkv": Q.Q8_0}
_TINY = dict(vocab_size=hf_models.VOCAB, hidden_size=32,
             intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, rms_norm_eps=1e-2)


def llama_config():
  """A tiny Llama with GQA, a non-default eps and a rotary base far from
  10^4 (llama.cpp's llama arch has no biases and default rope here)."""
  return tf.LlamaConfig(
      vocab_size=hf_models.VOCAB, hidden_size=32, intermediate_size=64,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=64, rms_norm_eps=1e-2,
      rope_parameters=dict(rope_type="default", rope_theta=100.0),
      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def gemma3_config():
  """A tiny Gemma 3 with six layers, so that the layer pattern a GGUF
  file leaves to the family's default (five sliding, then one global)
  has both kinds, bases 1e4 and 1e6, and a window shorter than the
  inputs. The file cannot say query_pre_attn_scalar: the default (256)
  holds on both sides."""
  return tf.Gemma3TextConfig(
      vocab_size=hf_models.VOCAB, hidden_size=32, intermediate_size=64,
      num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
      head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-2,
      sliding_window=4, rope_parameters=dict(
          sliding_attention=dict(rope_type="default", rope_theta=1e4),
          full_attention=dict(rope_type="default", rope_theta=1e6)),
      bos_token_id=2, eos_token_id=1, pad_token_id=0)


def qwen2_config():
  """A tiny Qwen2: biases on q, k and v (not o), GQA."""
  return tf.Qwen2Config(**_TINY, rope_parameters=dict(
      rope_type="default", rope_theta=100.0), tie_word_embeddings=False)


def qwen3_config():
  """A tiny Qwen3 with QK-norm. transformers' GGUF loader does not read
  the head width (attention.key_length) for qwen3 and takes
  Qwen3Config's default of 128, so the tiny model has that width too:
  not hidden_size / heads (8), as in Qwen3-0.6B."""
  return tf.Qwen3Config(**_TINY, head_dim=128, rope_parameters=dict(
      rope_type="default", rope_theta=100.0), tie_word_embeddings=False)


def gemma2_config(caps=(50.0, 30.0)):
  """A tiny Gemma 2: sliding and global layers alternating with a window
  shorter than the inputs, tied embeddings, soft caps `caps` (scores,
  logits). transformers' GGUF loader does not read the caps and takes
  Gemma 2's own 50 and 30, the default here; caps that bite harder are
  checked against the model itself
  (`test_gguf_load.test_what_transformers_gguf_loader_drops`). The file
  cannot say query_pre_attn_scalar: the default (256) holds on both
  sides."""
  return tf.Gemma2Config(
      **dict(_TINY, num_hidden_layers=3), head_dim=16, sliding_window=4,
      query_pre_attn_scalar=256, attn_logit_softcapping=caps[0],
      final_logit_softcapping=caps[1], pad_token_id=0)


def phi3_config(partial=1.0, window=None):
  """A tiny Phi-3 with GQA, so the fused q/k/v parts differ in size.
  transformers' GGUF loader reads neither phi3's rotated width nor its
  window, so the file compared with it has neither (see
  `test_gguf_load.test_what_transformers_gguf_loader_drops`)."""
  return tf.Phi3Config(**_TINY, sliding_window=window, pad_token_id=0,
                       rope_parameters=dict(rope_type="default",
                                            rope_theta=100.0,
                                            partial_rotary_factor=partial))


def mistral_config():
  """A tiny Mistral without a window (Mistral 7B v0.2 on): llama.cpp's
  converter writes it as a llama file."""
  return tf.MistralConfig(**_TINY, head_dim=8, sliding_window=None,
                          rope_parameters=dict(rope_type="default",
                                               rope_theta=100.0))


CONFIGS = {"llama": llama_config, "gemma3": gemma3_config,
           "qwen2": qwen2_config, "qwen3": qwen3_config,
           "gemma2": gemma2_config, "phi3": phi3_config,
           "mistral": mistral_config}
# Gemma's norms are stored as 1 + w.
NORM_SHIFT = {"gemma2": 1.0, "gemma3": 1.0}
# The `general.architecture` llama.cpp writes, where it is not the name.
GGUF_ARCH = {"mistral": "llama"}


def build(arch: str = "llama", seed=hf_models.SEED, config=None):
  """The random float32 transformers model the GGUF file is made from
  (`config`: instead of the architecture's own)."""
  config = config or CONFIGS[arch]()
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(seed)
  model = tf.AutoModelForCausalLM.from_config(config).eval()
  hf_models.randomize(model, seed)
  return model


def permute_for_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
  """Rotate-half row order -> llama.cpp's interleaved pairs, per head."""
  dh = w.shape[0] // heads
  x = w.reshape(heads, 2, dh // 2, *w.shape[1:])  # [heads, half, i, ...]
  return np.swapaxes(x, 1, 2).reshape(w.shape)  # row i * 2 + half


def name_is_llama(arch: str) -> bool:
  """Whether llama.cpp writes `arch` as a llama file (q/k permuted)."""
  return GGUF_ARCH.get(arch, arch) == "llama"


def _kind(gguf_name: str) -> str:
  return gguf_name.split(".")[-2]


def write(model, path, arch: str = "llama", *, quantize: bool = True) -> dict:
  """Write `model` (a transformers causal LM) as a GGUF file of `arch`;
  returns {gguf name: the float32 values written before quantization}."""
  c = model.config
  norm_shift = NORM_SHIFT.get(arch, 0.0)
  gguf_arch = GGUF_ARCH.get(arch, arch)
  writer = gguf.GGUFWriter(str(path), gguf_arch)
  if arch == "mistral":  # how transformers tells a Mistral llama file
    writer.add_name("Mistral tiny")
  writer.add_block_count(c.num_hidden_layers)
  writer.add_context_length(c.max_position_embeddings)
  writer.add_embedding_length(c.hidden_size)
  writer.add_feed_forward_length(c.intermediate_size)
  writer.add_head_count(c.num_attention_heads)
  writer.add_head_count_kv(c.num_key_value_heads)
  writer.add_layer_norm_rms_eps(c.rms_norm_eps)
  if arch != "gemma2":  # llama.cpp's Gemma 2 converter writes no base
    writer.add_rope_freq_base(
        (c.rope_parameters.get("full_attention") or c.rope_parameters)[
            "rope_theta"])
  head_dim = getattr(c, "head_dim", None) or (
      c.hidden_size // c.num_attention_heads)
  writer.add_key_length(head_dim)
  writer.add_value_length(head_dim)
  partial = c.rope_parameters.get("partial_rotary_factor", 1.0)
  writer.add_rope_dimension_count(int(partial * head_dim))
  writer.add_vocab_size(c.vocab_size)
  if c.pad_token_id is not None:  # else Phi3Config's 32000 > vocabulary
    writer.add_pad_token_id(c.pad_token_id)
  if arch == "phi3":
    writer.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
    writer.add_sliding_window(c.sliding_window or 0)
  elif getattr(c, "sliding_window", None) is not None:
    writer.add_sliding_window(c.sliding_window)
  if arch == "gemma2":
    writer.add_attn_logit_softcapping(c.attn_logit_softcapping)
    writer.add_final_logit_softcapping(c.final_logit_softcapping)
  names = gguf.get_tensor_name_map(
      next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == gguf_arch),
      c.num_hidden_layers)
  written = {}
  for hf_name, tensor in model.state_dict().items():
    if c.tie_word_embeddings and hf_name == "lm_head.weight":
      continue
    base, suffix = hf_name.rsplit(".", 1)
    name = names.get_name(base)
    assert name is not None, hf_name
    name = f"{name}.{suffix}"
    w = tensor.detach().to(torch.float32).numpy().copy()
    if name_is_llama(arch) and _kind(name) == "attn_q":
      w = permute_for_llama_cpp(w, c.num_attention_heads)
    elif name_is_llama(arch) and _kind(name) == "attn_k":
      w = permute_for_llama_cpp(w, c.num_key_value_heads)
    if name.endswith("norm.weight"):
      w = w + np.float32(norm_shift)
    written[name] = w
    qtype = TYPES.get(_kind(name), Q.F32) if quantize and w.ndim == 2 else (
        Q.F32)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if w.shape[-1] % block:
      qtype = Q.F16
    data = (w if qtype == Q.F32 else w.astype(np.float16) if qtype == Q.F16
            else gguf.quants.quantize(w, qtype))
    writer.add_tensor(name, data, raw_dtype=qtype)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return written
