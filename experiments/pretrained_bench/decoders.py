"""The real GGUF decoder LMs, mha_jax against transformers on one machine.

Shape letters: T prefill length, P prompt length, N new tokens, V
vocabulary (one sequence throughout: batch 1).

Both libraries read the same GGUF file and run its weights dequantized
to float32: mha_jax through `load_pretrained` (once per attention path,
jitted), transformers through `AutoModelForCausalLM.from_pretrained(...,
gguf_file=..., dtype=float32)` under `torch.no_grad()` with its default
attention (recorded), at each torch thread count. Two tasks:

- prefill: one forward of T tokens that returns the logits at every
  position `[1, T, V]`, no cache written (mha_jax: `model(ids)`;
  transformers: `use_cache=False`);
- decode: greedy generation of N tokens after a P-token prompt with the
  KV cache (mha_jax: `generate.generate`, which jits prefill and the
  loop; transformers: `generate(do_sample=False, min_new_tokens=N)`);
  tokens/s is N over the whole call, the prompt's prefill included.

Each contestant makes one untimed call first (for mha_jax it compiles;
its seconds are kept as `first`), then `repeats` rounds time one call
of every contestant, in an order rotated each round, so a change in the
load of a shared machine falls on all of them; a ratio to torch is the
median over rounds of the time over torch's time in the same round.

The roofline, as the real-LM benchmark measures it (`task_work`):
a plain float32 `MATMUL_N`^3 product and a weight-stream product
(`roofline.stream_yardstick`) are timed in the same rounds, in blocks of
`YARD_REPEAT` calls; prefill is measured in the einsum program's matrix-
multiply FLOPs against the first, decode in weight bytes (every parameter
once per new token) against the second, each contestant's share per
round (`roofline.share`).
"""

from __future__ import annotations

import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import torch_peers
import mha_jax
from mha_jax.core import flops
from mha_jax.measure import roofline
from mha_jax.measure import timing
from mha_jax.models import generate
from mha_jax.pretrained import real_models

MATMUL_N = 1024  # the plain matmul yardstick's size (`measure`'s default)
YARD_REPEAT = {"matmul": 10, "stream": 5}  # calls per timing
MODELS = {"smollm2": ("SmolLM2-135M-Instruct (Q4_1)",
                      real_models.smollm2_135m),
          "gemma3": ("Gemma 3 270M (Q4_K_M)", real_models.gemma3_270m)}


def _mha_jax_calls(path, impl: str, ids, prompt, new_tokens: int):
  """(prefill, decode) zero-argument calls of mha_jax on `path`; decode
  returns the new tokens `[1, N]`."""
  model = mha_jax.load_pretrained(path, implementation=impl)
  graphdef, state = nnx.split(model)
  forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
  ids, prompt = jnp.asarray(ids, jnp.int32), jnp.asarray(prompt, jnp.int32)
  max_len = prompt.shape[1] + new_tokens  # the slots decoding fills
  return (lambda: forward(state, ids),
          lambda: generate.generate(model, prompt, new_tokens,
                                    max_len=max_len))


def _torch_calls(hf, threads: int, ids, prompt, new_tokens: int):
  """(setup, prefill, decode) calls of transformers' model at `threads`
  torch threads; the thread count is set before the clock starts."""
  import torch  # pylint: disable=import-outside-toplevel
  setup = lambda: torch.set_num_threads(threads)
  return (setup, torch_peers.forward(hf, torch.as_tensor(ids)),
          torch_peers.greedy_decode(hf, torch.as_tensor(prompt), new_tokens))


def task_work(path, ids, new_tokens: int) -> dict:
  """The roofline's numerators per call: prefill's matrix-multiply FLOPs
  (the einsum program's, as compiled: `flops.compiled_matmul_flops`) and
  decoding's weight bytes (every parameter once per new token)."""
  model = mha_jax.load_pretrained(path, implementation="einsum")
  graphdef, state = nnx.split(model)
  forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
  compiled = forward.lower(state, jnp.asarray(ids, jnp.int32)).compile()
  return {"prefill": flops.compiled_matmul_flops(compiled),
          "decode": new_tokens * roofline.param_bytes(model)}


def summary(times: dict, reference: str) -> dict:
  """Per contestant: median and minimum seconds, and the median over
  rounds of its time over `reference`'s time in the same round."""
  ref = np.asarray(times[reference])
  return {name: {"median": float(np.median(t)), "min": float(np.min(t)),
                 "ratio": float(np.median(np.asarray(t) / ref))}
          for name, t in times.items()}


def measure(path, *, prefill: int = 512, prompt: int = 16,
            new_tokens: int = 128, implementations=("flash", "einsum"),
            threads=(1, 2), repeats: int = 5, matmul_n: int = MATMUL_N,
            stream_shape=(2048, 65536)) -> dict:
  """Prefill and decode seconds of every contestant on the GGUF `path`:
  raw times per round, their `summary` against each torch thread count,
  each contestant's first-call seconds and tokens' agreement with torch
  at the most threads, and the machine's load as each round began (torch
  at 2 threads slows down most when another process holds a core)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(path)
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
  ids = torch_peers.token_ids(hf.config.vocab_size, prefill)
  head = ids[:, :prompt]
  calls = {}
  for impl in implementations:
    calls[f"mha_jax {impl}"] = (lambda: None,) + _mha_jax_calls(
        path, impl, ids, head, new_tokens)
  for n in threads:
    calls[torch_peers.thread_name(n)] = _torch_calls(hf, n, ids, head,
                                                     new_tokens)
  names = list(calls)
  first, tokens = {"prefill": {}, "decode": {}}, {}
  for c in names:
    setup, pre, dec = calls[c]
    first["prefill"][c] = timing.timed_call(setup, pre)[0]
    first["decode"][c], tokens[c] = timing.timed_call(setup, dec)
  load = []  # the 1-minute load average as each round starts
  timed = {(task, c): calls[c][index] for task, index in (("prefill", 1),
                                                           ("decode", 2))
           for c in names}
  yard = {"matmul": roofline.matmul_yardstick(matmul_n),
          "stream": roofline.stream_yardstick(*stream_shape)}
  timed.update({("yardstick", k): call for k, (call, _) in yard.items()})
  flat = timing.interleaved_times(
      timed, repeats,
      setups={(task, c): calls[c][0] for task in ("prefill", "decode")
              for c in names},
      repeat={("yardstick", k): n for k, n in YARD_REPEAT.items()},
      on_round=lambda r: load.append(os.getloadavg()[0]))
  times = {task: {c: flat[(task, c)] for c in names}
           for task in ("prefill", "decode")}
  stick = {"prefill": "matmul", "decode": "stream"}
  work = task_work(path, ids, new_tokens)
  share = {task: {c: roofline.share(work[task], t, yard[stick[task]][1],
                                    flat[("yardstick", stick[task])])
                  for c, t in by.items()} for task, by in times.items()}
  torch_names = [c for c in names if c.startswith("torch")]
  reference = torch_names[-1]
  # What transformers ran: the config field it dispatches attention on.
  attn = hf.config._attn_implementation  # pylint: disable=protected-access
  return {
      "attn_implementation": attn,
      "vocab": hf.config.vocab_size, "prefill": prefill, "prompt": prompt,
      "new_tokens": new_tokens, "repeats": repeats, "times": times,
      "first": first, "loadavg": load,
      "roofline": {"work": work, "yardstick": stick, "matmul_n": matmul_n,
                   "stream_shape": list(stream_shape),
                   "rates": {k: [w / t for t in flat[("yardstick", k)]]
                             for k, (_, w) in yard.items()},
                   "share": share},
      "summary": {task: {t: summary(times[task], t) for t in torch_names}
                  for task in times},
      "agree": {c: torch_peers.leading_agreement(tokens[c],
                                                 tokens[reference])
                for c in names},
      "reference": reference}
