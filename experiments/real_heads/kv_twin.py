"""A GQA model against its MHA twin: KV-cache bytes per token, decode speed.

Shape letters: B batch, P prompt tokens, N new tokens, S cache slots, D
d_model, H query heads, K kv heads, Dh head width.

`mha_twin(model)` is the same model with `num_kv_heads = H`: each kv
head's key and value weights `[D, K, Dh]` repeated for the query heads of
its group (`hooks.expand_kv`: query head h reads kv head h // (H / K)),
every other weight shared. Its logits equal the GQA model's (each query
head reads the same keys and values), with H / K times the cache.
`cache_bytes_per_token` reads the bytes from the cache the model itself
allocates (`model.init_cache`); `decode_seconds` times greedy decoding
with `mha_jax.models.generate`, compiled first.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax import hooks
from mha_jax.measure import timing
from mha_jax.models import generate
from mha_jax.models import transformer


def mha_twin(model):
  """The MHA twin of a GQA `DecoderLM` (a new model; `model` unchanged)."""
  c = model.config
  twin_config = c.replace(num_kv_heads=c.num_heads)
  graphdef, shapes = nnx.split(nnx.eval_shape(
      lambda: transformer.DecoderLM(twin_config, rngs=nnx.Rngs(0))))
  _, state = nnx.split(model)

  def fill(want, have):
    have = jnp.asarray(have)
    # A kv weight or bias: its K axis is the one whose size grew to H.
    grown = [a for a, (w, h) in enumerate(zip(want.shape, have.shape))
             if w != h]
    return hooks.expand_kv(have, c.num_heads, axis=grown[0]) if grown else (
        have)
  values = jax.tree.map(fill, shapes, state)
  return nnx.merge(graphdef, values)


def cache_bytes_per_token(model, batch: int = 1, max_len: int = 16) -> int:
  """Bytes the model's own KV cache holds per token (all layers, keys
  and values), read off `model.init_cache`."""
  cache = model.init_cache(batch, max_len)
  total = sum(x.k.nbytes + x.v.nbytes for x in cache)
  return int(total // (batch * max_len))


def decode_seconds(model, prompt, new: int, *, max_len: int,
                   repeats: int) -> dict:
  """Seconds per decoded token: greedy `generate` of `new` tokens minus
  that of 1 token (the prefill and the first token), over `new - 1`,
  timed `repeats` times after one compiling call of each; {"per_token":
  [repeats] seconds, "tokens": `[B, N]` of the last call}."""
  prompt = jnp.asarray(prompt)
  for n in (new, 1):  # compile both programs before timing
    jax.block_until_ready(generate.generate(model, prompt, n,
                                            max_len=max_len))

  def timed(n):
    return timing.timed_call(lambda: None, lambda: generate.generate(
        model, prompt, n, max_len=max_len))

  per = []
  tokens = None
  for _ in range(repeats):
    t_n, tokens = timed(new)
    t_1, _ = timed(1)
    per.append((t_n - t_1) / (new - 1))
  return {"per_token": np.asarray(per), "tokens": np.asarray(tokens)}
