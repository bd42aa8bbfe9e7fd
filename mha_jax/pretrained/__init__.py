"""Layer 4, pretrained: Hugging Face checkpoints in and out of mha_jax
(docs/pretrained.md).

`load_pretrained(path)` reads a local directory (config.json,
model.safetensors or shards, no torch) or a GGUF file into a `DecoderLM`
or `Encoder`; `save_pretrained(model, path)` writes one back;
`load_tokenizer(path)` reads tokenizer.json or a GGUF file's tokenizer;
`load_language_model(path)` gives both as a `LanguageModel` (text in and
out, `text.py`).
Families: gpt2, llama, mistral, qwen2, gemma2, gemma3, qwen3, phi3,
gpt_neox, bert.
`real_models` finds the two GGUF models the install brings. This layer
imports only models, core and hooks (docs/architecture.md, "The
layers"); parallel, beside it, is not among them.
"""

from mha_jax.pretrained.errors import PretrainedError
from mha_jax.pretrained.families import FAMILIES
from mha_jax.pretrained.load import load_config
from mha_jax.pretrained.load import load_pretrained
from mha_jax.pretrained.save import save_pretrained
from mha_jax.pretrained.tokenizer import encode
from mha_jax.pretrained.tokenizer import encode_pairs
from mha_jax.pretrained.tokenizer import labels
from mha_jax.pretrained.text import LanguageModel
from mha_jax.pretrained.text import load_language_model
from mha_jax.pretrained.tokenizer import load_tokenizer

__all__ = ["PretrainedError", "FAMILIES", "load_config", "load_pretrained",
           "save_pretrained", "encode", "encode_pairs", "labels", "load_tokenizer",
           "LanguageModel", "load_language_model"]
