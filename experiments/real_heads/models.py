"""The models the experiment reads, their tokenizers, and their floors.

`load(name, config)` returns `(model, encode, info)`:

  smollm2      SmolLM2-135M-Instruct (llama family, GQA 9 on 3) from its
               GGUF file (`mha_jax.pretrained.real_models`)
  gemma3       Gemma 3 270M (4 on 1, sliding-window and global layers)
  tiny_llama   a tiny random model of the llama layout (GQA, rotary, RMS
               norm, gated SiLU MLP, tied embedding), mha_jax's own init
  tiny_gemma3  a tiny random model of the Gemma 3 layout (a sliding
               layer then a global one, QK-norm, sandwich norms, embed
               scale, two rotary bases)

`encode(texts)` gives each text's token ids (a list of int arrays), as the
model's tokenizer writes them (Gemma's adds its BOS, SmolLM2's adds none);
the tiny models read bytes (id = byte + 3, BOS 2 for the gemma3 layout).
`info["bos"]` is the id put before random tokens.

The floors are the same `ModelConfig` with other weights: `reinitialised`
(mha_jax's initialisation: what training started from, up to the init
scheme) and `shuffled` (every parameter tensor's entries permuted: the
trained weights' distribution, no structure).
"""

from __future__ import annotations

from flax import nnx
import jax
import numpy as np

import mha_jax
from mha_jax.models.model_config import ModelConfig
from mha_jax.models import transformer
from mha_jax.pretrained import real_models

REAL = {"smollm2": ("SmolLM2-135M-Instruct (Q4_1 GGUF)",
                    real_models.smollm2_135m),
        "gemma3": ("Gemma 3 270M (Q4_K_M GGUF)", real_models.gemma3_270m)}
BYTE_OFFSET = 3  # tiny models: ids 0-2 are pad, eos, bos; byte b is b + 3


def tiny_config(name: str) -> ModelConfig:
  """The smoke run's tiny config of one family's layout."""
  common = dict(vocab_size=256 + BYTE_OFFSET, d_model=32, num_heads=4,
                head_dim=8, mlp_dim=64, max_len=128, positions="rotary",
                norm="rms", mlp_gated=True, tie_embeddings=True,
                readout_bias=False, use_bias=False, final_ln=True,
                implementation="einsum")
  if name == "tiny_llama":
    return ModelConfig(num_layers=2, num_kv_heads=2, mlp_activation="silu",
                       rotary_base=100.0, **common)
  if name == "tiny_gemma3":
    # A sliding layer (a window of 4 tokens: itself and 3 back), then a
    # global one; Gemma 3 has five sliding layers before each global one.
    return ModelConfig(num_layers=2, num_kv_heads=1,
                       mlp_activation="gelu_tanh", qk_norm="rms",
                       norm_offset=1.0, norm_placement="sandwich",
                       embed_scale=32 ** 0.5, attn_scale=0.25,
                       rotary_base=1e6, local_rotary_base=1e4,
                       layer_windows=((3, 0), None), **common)
  raise ValueError(f"tiny_config: `name` must be 'tiny_llama' or "
                   f"'tiny_gemma3', got {name!r}")


def _byte_encoder(bos: int | None):
  def encode(texts):
    pre = [] if bos is None else [bos]
    return [np.asarray(pre + [b + BYTE_OFFSET for b in t.encode()], np.int32)
            for t in texts]
  return encode


def _tokenizer_encoder(tok):
  def encode(texts):
    ids, mask = mha_jax.pretrained.encode(tok, list(texts))
    return [np.asarray(i[m], np.int32) for i, m in zip(ids, mask)]
  return encode


def load(name: str, config):
  """`(model, encode, info)` of model `name` (see the module docstring);
  info: {"name", "label", "layers", "heads", "kv_heads", "head_dim",
  "windows", "bos"}."""
  if name in REAL:
    label, path_fn = REAL[name]
    path = path_fn()
    model = mha_jax.load_pretrained(path)
    tok = mha_jax.pretrained.load_tokenizer(path)
    encode = _tokenizer_encoder(tok)
    bos = _gguf_bos(path)
  elif name in ("tiny_llama", "tiny_gemma3"):
    model = transformer.DecoderLM(tiny_config(name), rngs=nnx.Rngs(
        config.experiment.tiny_seed))
    bos = 2
    encode = _byte_encoder(bos if name == "tiny_gemma3" else None)
    label = f"{name} (random, seed {config.experiment.tiny_seed})"
  else:
    raise ValueError(f"config.experiment.models: expected names of "
                     f"{tuple(REAL) + ('tiny_llama', 'tiny_gemma3')}, got "
                     f"{name!r}")
  return model, encode, describe(model, name, label, bos)


def describe(model, name: str, label: str, bos: int) -> dict:
  """The facts of a model the report quotes."""
  c = model.config
  windows = [None if w is None else int(w[0]) + 1
             for w in (c.layer_windows or (None,) * c.num_layers)]
  return {"name": name, "label": label, "layers": c.num_layers,
          "heads": c.num_heads, "kv_heads": c.num_kv_heads or c.num_heads,
          "head_dim": c.head_dim or c.d_model // c.num_heads,
          "windows": windows, "bos": int(bos)}


def _gguf_bos(path) -> int:
  import gguf  # pylint: disable=import-outside-toplevel
  field = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.bos_token_id"]
  return int(field.parts[field.data[0]][0])


def reinitialised(model, seed: int):
  """The same architecture with mha_jax's initialisation."""
  return transformer.DecoderLM(model.config, rngs=nnx.Rngs(seed))


def shuffled(model, seed: int):
  """The same model with every parameter tensor's entries permuted (one
  permutation per tensor, from `seed`)."""
  graphdef, state = nnx.split(model)
  leaves, tree = jax.tree.flatten(state)
  rng = np.random.default_rng(seed)
  out = []
  for x in leaves:
    a = np.asarray(x)
    out.append(rng.permutation(a.ravel()).reshape(a.shape).astype(a.dtype))
  return nnx.merge(graphdef, jax.tree.unflatten(tree, out))
