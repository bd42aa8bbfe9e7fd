r"""A real decoder LM in mha_jax against transformers, on one machine.

  python -m experiments.real_lm_bench --workdir=runs/real_lm_bench

Reads SmolLM2-135M-Instruct's GGUF file with both libraries (float32
weights) and times, in interleaved rounds: a forward of 512 tokens, the
loss and gradient of all weights on those tokens, and 128 greedy tokens
after a 16-token prompt with the KV cache; torch at 2 threads and at 1.
Then profiles the three tasks by operation, XLA's per-op trace beside
torch.profiler. The committed run (docs/results/real_lm_bench): 7.6 min
wall on 2 CPU cores at load average 1.7 to 2.7 (43 min at load 9-11).
Expect ratios near or below 1 for the forward and decoding; the report
says where the gradient stands and what costs the difference.
`--config=configs/real_lm_bench.py:smoke`: a tiny random Llama written
by transformers and read back by both (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None):
  """The benchmark's settings; no training, so no model/task/train groups."""
  smoke = default.is_smoke(arg, "configs/real_lm_bench.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  # glibc keeps freed host memory for reuse (`host_memory.keep_freed_memory`,
  # as the train-step benchmark and the training commands do): with its
  # default every einsum loss + gradient here faulted 389,000 pages and took
  # 5.1-5.4 s a round against 3.0-3.1 with it (docs/performance_real.md).
  # Off in the smoke run, which runs inside the test suite's processes.
  c.keep_freed_memory = not smoke
  c.experiment = e = ml_collections.ConfigDict()
  e.model = "smollm2"  # smollm2 (its GGUF wheel) | tiny_llama (random)
  e.implementations = ("einsum", "flash")  # mha_jax attention paths timed
  e.threads = (2, 1)  # torch thread counts; the first is the reference
  e.tokens = 512  # T of the forward and of the loss + gradient
  e.prompt = 16  # P, prompt tokens before decoding
  e.new_tokens = 128  # N, greedy tokens decoded per timed call
  e.second_prompt = 11  # a prompt length of the same bucket: no recompile
  e.rounds = 5  # timed rounds; each times every contestant once per task
  # Untimed rounds first, the same calls in the same rotation: the round
  # after the first calls still grew the kept heap (the einsum gradient
  # 6.4 s, then 3.1).
  e.warm_rounds = 1
  # The roofline's yardsticks, timed in the same rounds: a plain float32
  # matmul_n^3 product, and a [1, rows] x [rows, cols] float32 product that
  # reads 512 MB of weights (SmolLM2 holds 540 MB), more than any cache.
  e.matmul_n = 1024
  e.stream_shape = (2048, 65536)
  e.profile = True  # per-op profiles of the forward and of decoding
  e.profile_calls = 2  # calls traced per profile (after a warm call)
  e.seed = 0  # the random token ids both libraries read
  # The tiny random Llama of the smoke run (transformers' init, seed).
  e.tiny = t = ml_collections.ConfigDict()
  t.seed = 0
  t.vocab_size = 128
  t.hidden_size = 32
  t.intermediate_size = 64
  t.num_hidden_layers = 2
  t.num_attention_heads = 4
  t.num_key_value_heads = 2
  if smoke:
    e.model = "tiny_llama"
    e.implementations = ("einsum",)
    e.tokens, e.prompt, e.new_tokens, e.second_prompt = 16, 6, 4, 5
    e.rounds, e.warm_rounds, e.profile_calls = 2, 0, 1
    e.matmul_n, e.stream_shape = 64, (64, 256)
  return c
