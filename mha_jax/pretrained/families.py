"""The families mha_jax loads, by name and by config.json `model_type`."""

from __future__ import annotations

from mha_jax.pretrained.bert import BERT
from mha_jax.pretrained.gemma2 import GEMMA2
from mha_jax.pretrained.gemma3 import GEMMA3
from mha_jax.pretrained.gpt2 import GPT2
from mha_jax.pretrained.gpt_neox import GPT_NEOX
from mha_jax.pretrained.llama import LLAMA
from mha_jax.pretrained.llama import MISTRAL
from mha_jax.pretrained.llama import QWEN2
from mha_jax.pretrained.phi3 import PHI3
from mha_jax.pretrained.qwen3 import QWEN3

FAMILIES = {f.name: f for f in (GPT2, LLAMA, MISTRAL, QWEN2, GEMMA2, GEMMA3,
                                QWEN3, PHI3, GPT_NEOX, BERT)}
BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}
