"""mha_jax: multi-head attention in JAX, from pure functions up.

    import mha_jax
    params = mha_jax.init_mha_params(key, d_model=64, num_heads=8)
    y = mha_jax.multi_head_attention(params, x, is_causal=True)
"""

from mha_jax import hooks
from mha_jax.attention import attend
from mha_jax.attention import masked_softmax
from mha_jax.attention import scaled_dot_product_attention
from mha_jax.auto_select import explain_auto
from mha_jax.converters import from_linen_mha
from mha_jax.converters import from_nnx_mha
from mha_jax.flops import analytic_mha_flops
from mha_jax.flops import jaxpr_matmul_flops
from mha_jax.flops import xla_flops
from mha_jax.hooks import Hooks
from mha_jax.kv_cache import CacheStatus
from mha_jax.kv_cache import init_cache
from mha_jax.kv_cache import init_cache_for
from mha_jax.kv_cache import KVCache
from mha_jax.kv_cache import raise_if_overflow
from mha_jax.masks import causal_mask
from mha_jax.masks import combine_masks
from mha_jax.masks import padding_mask
from mha_jax.model_config import ModelConfig
from mha_jax.model_config import ModelConfigError
from mha_jax.modules import MultiHeadAttention
from mha_jax.multi_head import attention_layer
from mha_jax.multi_head import cached_attention
from mha_jax.multi_head import merge_heads
from mha_jax.multi_head import multi_head_attention
from mha_jax.multi_head import project
from mha_jax.multi_head import project_heads
from mha_jax.multi_head import project_out
from mha_jax.multi_head import project_qkv
from mha_jax.multi_head import split_heads
from mha_jax.params import init_mha_params
from mha_jax.params import mha_dims
from mha_jax.params import MHADims
from mha_jax.pretrained import load_pretrained
from mha_jax.pretrained import load_tokenizer
from mha_jax.pretrained import save_pretrained
from mha_jax.rotary import apply_rotary
from mha_jax.transformer import DecoderLM
from mha_jax.transformer import Encoder
from mha_jax.transformer import EncoderDecoder
from mha_jax.transformer import TransformerBlock
from mha_jax.transformer import with_implementation

__version__ = "0.1.0"
