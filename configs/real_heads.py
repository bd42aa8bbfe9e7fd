r"""What the heads of two real decoder LMs do, offline: SmolLM2-135M and
Gemma 3 270M from their GGUF files.

  python -m experiments.real_heads --workdir=runs/real_heads

For each model: every head's previous-token, induction and duplicate-token
score on random tokens repeated, and its first-token (sink) mass,
Sink_k^eps share, local vs long-range mass and entropy on English prose,
each beside uniform attention and the same architecture with shuffled and
with re-initialised weights, with bootstrap intervals over inputs; the
top-k heads of each kind ablated (zero and mean) against k random heads
drawn many times; Gemma 3's induction and copy loss against the repeat
distance on its sliding-window (512) and global layers, with induction
heads, random heads and whole global layers ablated; KV-cache bytes
per token and decode speed of the GQA model against its MHA twin. The
measured wall time is in the report (42 min on 2 shared cores, 2026-12-05).
`--config=configs/real_heads.py:smoke`: tiny random models of both
families (llama, gemma3) through the same code, in seconds.
"""

import ml_collections

from configs import default


def get_config(arg=None):
  """The experiment's settings; no training, so no model/task/train groups."""
  smoke = default.is_smoke(arg, "configs/real_heads.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  c.experiment = e = ml_collections.ConfigDict()
  e.models = ("smollm2", "gemma3")  # real GGUF models, or tiny_* (smoke)
  e.seed = 0  # draws of tokens, windows, random heads, bootstrap
  # Survey inputs.
  e.repeat_len = 50  # random tokens per copy: [BOS, x, x], 2 n + 1 tokens
  e.repeat_inputs = 48  # repeated sequences surveyed (and ablated)
  e.token_range = (1000, 32000)  # random tokens drawn from ids in [lo, hi)
  e.text_len = 128  # tokens per prose window
  e.text_inputs = 48  # prose windows surveyed (and as many ablated)
  e.chunk = 8  # inputs per forward pass
  e.local = 8  # "local": a key at most this many tokens back
  e.sink_eps = 0.3  # Gu et al.'s threshold on the mean first-token mass
  e.resamples = 1000  # bootstrap resamples over inputs
  e.floor_seed = 1  # seed of the shuffled and re-initialised floors
  # Causal tests, on inputs disjoint from the survey's.
  e.causal_inputs = 8  # repeated sequences and prose windows ablated
  e.causal_text_len = 64  # tokens per prose window whose loss is read
  e.top_k = 4  # heads of each kind ablated together
  e.random_draws = 10  # random k-head sets drawn for the baseline
  e.single_top = 4  # heads past layer 0 ablated alone (by attribution)
  # Induction by repeat distance (Gemma 3's window is 512 tokens).
  e.distance_models = ("gemma3",)
  # Two distances inside the window, one twice past it (2048, measured
  # before on 3 sequences, costs as much as the other three together).
  e.distances = (64, 256, 1024)
  e.segment = 32  # random tokens copied at each distance
  e.distance_inputs = 32  # sequences per distance
  e.distance_chunk = 4  # sequences per forward pass
  e.distance_draws = 2  # random k-head sets per ablation
  # KV cache and decode speed, GQA against the MHA twin.
  e.kv_prompt = 32  # prompt tokens
  e.kv_new = 32  # tokens decoded
  e.kv_max_len = 2048  # cache slots (every decode step reads them all)
  e.kv_repeats = 5  # timed decodes per layout
  # Tiny models of the smoke run (mha_jax's own random init).
  e.tiny_seed = 0
  if smoke:
    e.models = ("tiny_llama", "tiny_gemma3")
    e.distance_models = ("tiny_gemma3",)
    e.repeat_len, e.repeat_inputs, e.text_len, e.text_inputs = 6, 8, 16, 8
    e.token_range, e.chunk, e.local, e.resamples = (3, 200), 4, 2, 50
    e.top_k, e.random_draws, e.single_top = 2, 3, 2
    e.causal_inputs, e.causal_text_len = 4, 12
    e.distances, e.segment, e.distance_inputs = (4, 12), 4, 4
    e.distance_chunk, e.distance_draws = 2, 2
    e.kv_prompt, e.kv_new, e.kv_max_len, e.kv_repeats = 4, 4, 16, 2
  return c
