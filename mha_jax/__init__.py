"""mha_jax: multi-head attention in JAX, from pure functions up.

    import mha_jax
    params = mha_jax.init_mha_params(key, d_model=64, num_heads=8)
    y = mha_jax.multi_head_attention(params, x, is_causal=True)
"""

from mha_jax import hooks
from mha_jax.core.attention import attend
from mha_jax.core.softmax import masked_softmax
from mha_jax.core.reference import scaled_dot_product_attention
from mha_jax.core.attention_spec import AttentionSpec
from mha_jax.core.kernels.auto import explain_auto
from mha_jax.core.converters import from_linen_mha
from mha_jax.core.converters import from_nnx_mha
from mha_jax.core.flops import analytic_mha_flops
from mha_jax.core.flops import compiled_matmul_flops
from mha_jax.core.flops import jaxpr_matmul_flops
from mha_jax.core.flops import xla_flops
from mha_jax.hooks import Hooks
from mha_jax.core.kv_cache import CacheStatus
from mha_jax.core.kv_cache import init_cache
from mha_jax.core.kv_cache import init_cache_for
from mha_jax.core.kv_cache import KVCache
from mha_jax.core.kv_cache import raise_if_overflow
from mha_jax.core.masks import causal_mask
from mha_jax.core.masks import combine_masks
from mha_jax.core.masks import padding_mask
from mha_jax.models.activation_cache import ActivationCache
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.model_config import ModelConfigError
from mha_jax.models.modules import MultiHeadAttention
from mha_jax.core.multi_head import attention_layer
from mha_jax.core.multi_head import cached_attention
from mha_jax.core.multi_head import merge_heads
from mha_jax.core.multi_head import multi_head_attention
from mha_jax.core.multi_head import project
from mha_jax.core.multi_head import project_heads
from mha_jax.core.multi_head import project_out
from mha_jax.core.multi_head import project_qkv
from mha_jax.core.multi_head import split_heads
from mha_jax.core.params import init_mha_params
from mha_jax.core.params import mha_dims
from mha_jax.core.params import MHADims
from mha_jax.core.rotary import apply_rotary
from mha_jax.models.transformer import DecoderLM
from mha_jax.models.transformer import Encoder
from mha_jax.models.transformer import EncoderDecoder
from mha_jax.models.transformer import TransformerBlock
from mha_jax.models.transformer import with_implementation
from mha_jax.parallel.all_to_all import all_to_all_attention
from mha_jax.parallel.ring import ring_attention
from mha_jax.pretrained import LanguageModel
from mha_jax.pretrained import load_language_model
from mha_jax.pretrained import load_pretrained
from mha_jax.pretrained import load_tokenizer
from mha_jax.pretrained import save_pretrained
from mha_jax.training.host_memory import keep_freed_memory

__version__ = "0.1.0"

# The context-parallel paths need a mesh, so they live in `mha_jax.parallel`,
# a layer above the core. They are wired in here, the one module that sees
# every layer, so that `attend(implementation="ring")` and a model config
# reach them while the core names neither. Importing any part of mha_jax
# runs this file first, so they are always registered.
from mha_jax.core import attention as _attention
from mha_jax.parallel import all_to_all as _all_to_all
from mha_jax.parallel import ring as _ring

_attention.register(_ring.RING)
_attention.register(_all_to_all.ALL_TO_ALL)


def __getattr__(name):
  # `mha_jax.show.heads(...)` as in a notebook: the inline views live in
  # the interp layer (mha_jax/interp/show.py), loaded on first use so that
  # `import mha_jax` does not load the analyses.
  if name == "show":
    from mha_jax.interp import show  # pylint: disable=g-import-not-at-top
    return show
  raise AttributeError(f"module 'mha_jax' has no attribute {name!r}")
