"""Layer 1, hooks: read (capture) or replace (patch) any activation by
name. The bottom layer, importing nothing of the project, so that both
the pure core and the modules can offer hook sites.

Shape letters: B batch, Tq query length, Tk key length (cache slots when
decoding with a cache), D d_model, H query heads, K key/value heads,
Dh per-head query/key width, Dv per-head value width.

The names and meanings follow TransformerLens (`hook_q`, `hook_pattern`,
...), without the `hook_` prefix. In an attention layer:

  q        [B, Tq, H, Dh]  queries, after rotary positions
  k        [B, Tk, K, Dh]  keys of the tokens of this call, after rotary
  v        [B, Tk, K, Dv]  values of the tokens of this call
  scores   [B, H, Tq, Tk]  float32: scaled q.k, plus bias, -inf where
                           masked; the softmax's input
  pattern  [B, H, Tq, Tk]  float32: the softmax; before dropout
  z        [B, Tq, H, Dv]  each head's output, before W^O
  result   [B, Tq, H, D]   each head's own contribution to the residual
                           stream, z_h @ W^O_h (formed only when asked for)

and in a transformer block, all `[B, T, D]`: `resid_pre`, `attn_out`
(after b_o), `cross_out` (blocks with cross-attention), `resid_mid` (before
the MLP, blocks with one), `mlp_out`, `resid_post`. A model prefixes them
with where they sit: `"blocks.1.attn.pattern"`, `"blocks.0.resid_post"`,
and for an encoder-decoder `"encoder.blocks.0.attn.z"`,
`"decoder.blocks.1.cross.pattern"`.

With a KV cache, `k` and `v` are the new tokens' (what gets written), and
`scores`/`pattern` run over all cache slots (`Tk = S`).

Grouped-query attention (K < H; K = 1 is multi-query): `k` and `v` hold
the K kv heads, as TransformerLens's `hook_k`/`hook_v` do by default, and
every other site counts the H query heads. Query head h reads kv head
`h // (H // K)`: consecutive query heads share one, as in Hugging Face's
`repeat_kv` and in `core.attention.attend` (which groups q as `[K, G]`).
So that a head index means the same thing at every site, `expand_kv(k, H)`
is the per-query-head view `[B, T, H, Dh]` (its head h is what query head
h reads; TransformerLens's `ungroup_grouped_query_attention`), `kv_head(h,
H, K)` the kv head of query head h and `query_heads(j, H, K)` the group
sharing kv head j. A patch of `k` or `v` (`heads=` there counts kv heads,
and an index past K fails saying so) changes what the whole group reads:
to change what ONE query head sees, patch its `scores`, `pattern` or `q`;
to remove its output, its `z`.

A `Hooks` object lives for one call. At each site the model calls
`hooks(site, x)`: a patch (an array, or a function of the clean array)
replaces x, then a capture records the value that flows on. Both happen
while JAX traces, so they work under `jax.jit`, `jax.grad` and `jax.vmap`;
the site names are Python strings, hence static: the same set of names
reuses a compiled program, a new set compiles once.

The modules: `sites.py` (the site names, `Hooks`, the checks of names and
values), `gqa_heads.py` (which kv head a query head reads) and
`patches.py` (`replace`, `ablate`, `ScaleHeads`).
"""

# The layer's public API is `mha_jax.hooks.<name>`: the docs, the
# notebook and every layer above call `hooks.Hooks`, `hooks.replace`,
# `hooks.kv_head`, ... through this one import, so each public name is
# re-exported here from the module that holds it.
from mha_jax.hooks.gqa_heads import expand_kv
from mha_jax.hooks.gqa_heads import kv_head
from mha_jax.hooks.gqa_heads import kv_heads_of
from mha_jax.hooks.gqa_heads import query_heads
from mha_jax.hooks.patches import ablate
from mha_jax.hooks.patches import Replace
from mha_jax.hooks.patches import replace
from mha_jax.hooks.patches import ScaleHeads
from mha_jax.hooks.patches import site_axes
from mha_jax.hooks.sites import ATTENTION_SITES
from mha_jax.hooks.sites import BLOCK_SITES
from mha_jax.hooks.sites import check_names
from mha_jax.hooks.sites import head_name
from mha_jax.hooks.sites import Hooks
from mha_jax.hooks.sites import LISTED_SITES
from mha_jax.hooks.sites import NO_HOOKS
from mha_jax.hooks.sites import outputs
from mha_jax.hooks.sites import Patch
from mha_jax.hooks.sites import PatchError
from mha_jax.hooks.sites import WEIGHT_SITES

__all__ = ["ATTENTION_SITES", "BLOCK_SITES", "Hooks", "LISTED_SITES",
           "NO_HOOKS", "Patch", "PatchError", "Replace", "ScaleHeads",
           "WEIGHT_SITES", "ablate", "check_names", "expand_kv", "head_name",
           "kv_head", "kv_heads_of", "outputs", "query_heads", "replace",
           "site_axes"]
