"""Tiny random `transformers` models of each family, saved in safetensors.

Each is 2-3 layers, a few heads (GQA where the family has it), a
vocabulary of 300 and a fixed seed. Every parameter is redrawn, norms
included: Hugging Face starts norm weights at 1 (Gemma's at 0) and biases
at 0, which would hide a dropped (1 + w), a swapped norm or a lost bias.
Weights are scaled so that scores are O(1) and the patterns far from
uniform. Every norm's epsilon is `EPS`, far from each family's default,
so a loader that reads the field and then uses its own default fails.
"""

from __future__ import annotations

import math

import torch
import transformers as tf

VOCAB = 300
SEED = 0
# With activations of mean square about 1 this moves every norm's output
# by about 0.5%, thousands of float32 roundings.
EPS = 1e-2

_LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                   num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64,
                   rms_norm_eps=EPS, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "gpt2": lambda: tf.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
        layer_norm_epsilon=EPS, bos_token_id=1, eos_token_id=2),
    # Llama 3's rotary bands, with theta and the original context chosen
    # so the 4 frequencies of Dh = 8 fall in all three bands.
    "llama": lambda: tf.LlamaConfig(**_LLAMA_LIKE, rope_parameters=dict(
        rope_type="llama3", rope_theta=100.0, factor=8.0,
        low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32)),
    "mistral": lambda: tf.MistralConfig(**_LLAMA_LIKE, sliding_window=4),
    # Layers from max_window_layers on slide: layer 0 global, layer 1 not.
    "qwen2": lambda: tf.Qwen2Config(**_LLAMA_LIKE, use_sliding_window=True,
                                    sliding_window=4, max_window_layers=1),
    "gemma2": lambda: tf.Gemma2Config(
        **dict(_LLAMA_LIKE, num_hidden_layers=3), head_dim=16,
        sliding_window=4, query_pre_attn_scalar=12,
        attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
        pad_token_id=0),
    # Two sliding layers, then a global one (Gemma 3's order, not
    # symmetric, and not what its default pattern of 6 gives); bases 1e4
    # and 1e6 rotate position 11 by 3.5 and 2.0 radians in the second
    # frequency pair; Gemma 3 4B's linear scaling on the global layer.
    "gemma3": lambda: tf.Gemma3TextConfig(
        **dict(_LLAMA_LIKE, num_hidden_layers=3), head_dim=16,
        sliding_window=4, query_pre_attn_scalar=12,
        layer_types=["sliding_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=1e4),
            full_attention=dict(rope_type="linear", factor=2.0,
                                rope_theta=1e6)),
        pad_token_id=0),
    # Its own head width (16, not 32 / 4) and QK-norm; the second layer
    # slides, as in Qwen2.
    "qwen3": lambda: tf.Qwen3Config(**_LLAMA_LIKE, head_dim=16,
                                    use_sliding_window=True,
                                    sliding_window=4, max_window_layers=1),
    # GQA, so the fused q/k/v parts differ in size; half of each head
    # rotated (Phi-4-mini rotates 3/4); a window on every layer.
    "phi3": lambda: tf.Phi3Config(**_LLAMA_LIKE, sliding_window=4,
                                  pad_token_id=0,
                                  rope_parameters=dict(
                                      rope_type="default", rope_theta=1e4,
                                      partial_rotary_factor=0.5)),
    "gpt_neox": lambda: tf.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
        rotary_pct=0.5, layer_norm_eps=EPS, bos_token_id=1, eos_token_id=2),
    "bert": lambda: tf.BertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
        layer_norm_eps=EPS),
}
CLASSES = {"bert": tf.BertModel}


def randomize(model: torch.nn.Module, seed: int = SEED) -> None:
  """Redraw every parameter: matrices N(0, 1/fan_in), embeddings N(0, 1),
  vectors around their usual start (norm weights 1 +- 0.2 or 0 +- 0.2,
  biases N(0, 0.1))."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in sorted(model.named_parameters()):
      noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
      if p.ndim == 2 and "emb" in name or name.endswith("wte.weight") or (
          name.endswith("wpe.weight")):
        p.copy_(noise)
      elif p.ndim == 2:
        fan_in = p.shape[0] if "c_" in name else p.shape[1]  # GPT-2 Conv1D
        p.copy_(noise * 1.5 / math.sqrt(fan_in))
      elif name.endswith("bias"):
        p.copy_(0.1 * noise)
      else:  # norm weights: keep their own centre (1, or Gemma's 0)
        p.copy_(p + 0.2 * noise)


def build(family: str, directory, *, dtype=torch.float32):
  """Build, randomise and save one family's tiny model; returns it (eval
  mode, eager attention so that `output_attentions` gives patterns)."""
  config = CONFIGS[family]()
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  cls = CLASSES.get(family, tf.AutoModelForCausalLM)
  torch.manual_seed(SEED)
  model = (cls(config) if cls is tf.BertModel
           else cls.from_config(config)).eval()
  randomize(model)
  model.save_pretrained(directory)
  return model.to(dtype)


def layers_of(model):
  """The list of transformer layers of any of the families' models."""
  base = model.base_model
  for name in ("layers", "h"):
    if hasattr(base, name):
      return getattr(base, name)
  return base.encoder.layer


def inputs(family: str):
  """The batch each family is compared on: `[2, 12]` tokens (longer than
  the sliding windows), and for BERT token types and a padded row."""
  g = torch.Generator().manual_seed(1)
  tokens = torch.randint(3, VOCAB, (2, 12), generator=g)
  if family != "bert":
    return dict(input_ids=tokens)
  mask = torch.ones_like(tokens)
  mask[1, 9:] = 0
  types = torch.zeros_like(tokens)
  types[:, 6:] = 1
  return dict(input_ids=tokens, attention_mask=mask, token_type_ids=types)


def run(model, batch):
  """Logits (BERT: last hidden state) `[B, T, V or D]`, every layer's
  input and output `[L + 1, B, T, D]` (taken with forward hooks, since the
  last entry of `hidden_states` is after the final norm) and patterns
  `[L, B, H, T, T]`, as float64 NumPy arrays."""
  outs = []
  hooks = [layer.register_forward_hook(
      lambda m, a, o: outs.append(o[0] if isinstance(o, tuple) else o))
           for layer in layers_of(model)]
  try:
    with torch.no_grad():
      out = model(**batch, output_hidden_states=True, output_attentions=True)
  finally:
    for h in hooks:
      h.remove()
  main = out.logits if hasattr(out, "logits") else out.last_hidden_state
  stream = [out.hidden_states[0]] + outs
  as_np = lambda t: t.detach().to(torch.float64).numpy()
  return dict(main=as_np(main),
              stream=as_np(torch.stack(stream)),
              patterns=as_np(torch.stack(out.attentions)))
