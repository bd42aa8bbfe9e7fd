r"""KV-cache cost measurements: decode time, FLOPs, cache bytes, intensity.

  python -m experiments.kv_cache --workdir=runs/kv_cache

Measures the trained-model class `transformer.DecoderLM` (attention + MLP
blocks, LayerNorm, rotary positions, readout), not a bare decoder stack.
A few minutes on 2 CPU cores. Expect the cached decode step to be orders of
magnitude cheaper than recomputing the prefix at long contexts, its time to
grow about linearly with the context (the cache buffer it reads), and the
cache of multi-query attention to be exactly 1/H of multi-head attention's.
Quick smoke run (seconds): `--config=configs/kv_cache.py:smoke`.
"""

import ml_collections

from configs import default


def get_config(arg=None) -> ml_collections.ConfigDict:
  """Sizes of the measured `DecoderLM` and of each measurement."""
  smoke = default.is_smoke(arg, "configs/kv_cache.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion

  # The trained-model class `transformer.DecoderLM`: token embedding, L
  # pre-LayerNorm attention + MLP blocks, final LayerNorm, readout to V
  # logits (not a bare stack of blocks), with its own KV cache.
  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 256  # V, readout width (small: attention dominates)
  m.d_model = 256  # D, residual width
  m.num_layers = 2  # L, attention + MLP blocks
  m.num_heads = 8  # H, query heads; Dh = D // H
  m.num_kv_heads = 8  # K of the timed model (K = H: multi-head)
  m.mlp_dim = 1024  # MLP hidden width
  m.positions = "rotary"  # no position table, so caches of any size work
  m.max_len = 8192  # longest full forward (recomputation runs n + 1 tokens)
  m.implementation = "einsum"  # core attend path used by every measurement

  c.bench = b = ml_collections.ConfigDict()
  b.contexts = (64, 128, 256, 512, 1024, 2048, 4096)  # n, tokens in context
  b.nocache_max_context = 4096  # skip recomputation above this n
  b.batch = 1  # B of the timing runs
  b.warmup = 2  # untimed calls after compiling
  b.repeats = 21  # timed calls; the median (and min) is reported
  b.nocache_repeats = 3  # timed full forwards (they are slow)
  b.target_context = 2048  # where the speed-up target is checked
  b.target_speedup = 50.0  # cached step at least this much faster
  b.target_slope = 1.2  # cached step time slope in log-log, at most

  c.heads = h = ml_collections.ConfigDict()
  h.kv_heads = (8, 4, 2, 1)  # K compared: MHA, GQA (two group sizes), MQA
  h.max_len = 2048  # S, cache slots per sequence for the byte counts
  h.context = 2048  # context of the intensity measurement
  h.batches = (1, 16)  # B values of the intensity measurement
  if smoke:  # a 1-layer, 16-wide model; three short contexts; one batch
    m.update(vocab_size=32, d_model=16, num_layers=1, num_heads=2,
             num_kv_heads=2, mlp_dim=32, max_len=64)
    b.update(contexts=(8, 16, 32), nocache_max_context=16, warmup=1, repeats=2,
             nocache_repeats=1, target_context=16)
    h.update(kv_heads=(2, 1), max_len=32, context=16, batches=(2,))
  return c
