"""A real decoder LM in mha_jax against transformers: times and profiles.

Shape letters: T tokens of the forward and gradient, P prompt tokens, N
new tokens, V vocabulary (one sequence throughout: batch 1).

Both libraries read one file (SmolLM2's GGUF; the smoke run's tiny Llama
checkpoint written by transformers) and run float32 weights: mha_jax
through `load_pretrained` (once per attention path, jitted), transformers
through `AutoModelForCausalLM` with its default attention, at each torch
thread count. Three tasks, on random ids (a fixed seed):

- forward: the logits `[1, T, V]` of T tokens, no cache;
- loss_grad: the mean next-token cross-entropy over the T tokens and its
  gradient for every weight (transformers: `labels=ids`, `backward()`);
- decode: N greedy tokens after a P-token prompt with the KV cache
  (mha_jax `generate.generate`, bucketed; transformers `generate`);
  tokens/s is N over the whole call, the prompt's prefill included.

Each contestant's first call of each task is untimed (mha_jax compiles
then). Then a decode at another prompt length of the same bucket is timed
and its XLA compiles counted (0 when the bucket does its work). Then
`warm_rounds` untimed rounds, and `rounds` rounds time one call of every
contestant per task, in an order rotated each round, so a change in the
load of the shared machine falls on all of them; the ratio to torch is
per round (time over torch's time in that round), kept per round, with
their median, minimum and maximum.

The roofline: two yardsticks are timed in the same rounds
(`mha_jax.measure.roofline`), a plain float32 matmul and a float32
matrix-vector product that reads more weights than the caches hold. The
forward and the loss and gradient are measured in matrix-multiply FLOPs
(read from the einsum path's jaxpr, `flops.jaxpr_matmul_flops`: the
dense program, the same numerator for every contestant) per second over
the matmul's rate; decoding, which reads every weight once per token, in
weight bytes (the model's parameters, float32, times N) per second over
the matrix-vector product's rate. Each share is taken per round.

The process keeps freed host memory for reuse first
(`config.keep_freed_memory`, `training/host_memory.py`), as the
train-step benchmark does: XLA's CPU programs allocate their scratch per
call, and with glibc's default every call of the einsum path's loss and
gradient faulted in about 1.5 GB of fresh pages, slower still in this
process than alone (5.1-5.4 s against 3.4-3.9 s; 3.0-3.1 with memory
kept, on 2 AMD EPYC cores).
"""

from __future__ import annotations

import os
import pathlib
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments import cli
from experiments import torch_peers
from experiments.real_lm_bench import profile as profile_lib
import mha_jax
from mha_jax.core import flops
from mha_jax.measure import machine
from mha_jax.measure import roofline
from mha_jax.measure import timing
from mha_jax.models import generate
from mha_jax.pretrained import real_models

TASKS = ("forward", "loss_grad", "decode")
YARDSTICK = "yardstick"  # the task name of the roofline's timed calls
MATMUL, STREAM = "plain matmul", "weight stream"


def load_hf(e, workdir):
  """`(transformers model, the path mha_jax reads, label)`."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  if e.model == "smollm2":
    path = real_models.smollm2_135m()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return hf.eval(), path, "SmolLM2-135M-Instruct (Q4_1 GGUF)"
  if e.model == "tiny_llama":
    t = e.tiny
    torch.manual_seed(t.seed)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_hidden_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        max_position_embeddings=4 * (e.tokens + e.new_tokens),
        tie_word_embeddings=True))
    path = pathlib.Path(workdir) / "tiny_llama"
    hf.save_pretrained(path)
    return hf.eval(), path, f"tiny random Llama (seed {t.seed})"
  raise ValueError(f"config.experiment.model: expected 'smollm2' or "
                   f"'tiny_llama', got {e.model!r}")


def next_token_loss(logits, ids):
  """Mean cross-entropy of `logits [B, T, V]` predicting `ids [B, T]`
  one position on (transformers' `labels=ids` loss)."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()


def mha_jax_calls(model, ids, prompt, new_tokens: int) -> dict:
  """task -> `(jitted fn, args)` or, for decode, a zero-argument call."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  forward = jax.jit(lambda p, r, x: nnx.merge(graphdef, p, r)(x))
  grad = jax.jit(jax.value_and_grad(
      lambda p, r, x: next_token_loss(nnx.merge(graphdef, p, r)(x), x)))
  return {"forward": (forward, (params, rest, ids)),
          "loss_grad": (grad, (params, rest, ids)),
          "decode": lambda p=prompt: generate.generate(model, p, new_tokens)}


def torch_calls(hf, ids, prompt, new_tokens: int) -> dict:
  """task -> zero-argument call of transformers' model."""
  import torch  # pylint: disable=import-outside-toplevel
  ids, prompt = torch.as_tensor(ids), torch.as_tensor(prompt)

  def loss_grad():
    hf.zero_grad(set_to_none=True)
    loss = hf(ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach()

  return {"forward": torch_peers.forward(hf, ids), "loss_grad": loss_grad,
          "decode": torch_peers.greedy_decode(hf, prompt, new_tokens)}


def _call(c):
  """A zero-argument call of a contestant's task entry."""
  return c if callable(c) else (lambda: c[0](*c[1]))


def _kept(task: str, out):
  """What agreement needs of a first call's output: the loss alone of
  loss_grad (not a second copy of every weight), else the array."""
  if task != "loss_grad":
    return np.asarray(out)
  return float(out[0] if isinstance(out, tuple) else out)


def _count_compiles(fn):
  """`(seconds, XLA compiles, output)` of one call of `fn()`."""
  with timing.count_compiles() as seen:
    seconds, out = timing.timed_call(lambda: None, fn)
  return seconds, len(seen), out


def _rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def measure(config, workdir) -> dict:
  """Times of every contestant per task and round, ratios, agreement,
  the second prompt length's compiles, and the profiles (run.py's
  docstring)."""
  import torch  # pylint: disable=import-outside-toplevel
  e = config.experiment
  kept = cli.keep_freed_memory_if_asked(config)
  start = time.perf_counter()
  hf, path, label = load_hf(e, workdir)
  vocab = hf.config.vocab_size
  ids = torch_peers.token_ids(vocab, e.tokens, seed=e.seed)  # [1, T]
  prompt = ids[:, :e.prompt]  # [1, P]
  contestants, setups, outs = {}, {}, {}
  models = {}
  for impl in e.implementations:
    name = f"mha_jax {impl}"
    models[name] = mha_jax.load_pretrained(path, implementation=impl)
    contestants[name] = mha_jax_calls(models[name], jnp.asarray(ids,
                                                                jnp.int32),
                                      prompt, e.new_tokens)
    setups[name] = lambda: None
  t_calls = torch_calls(hf, ids, prompt, e.new_tokens)
  for n in e.threads:
    name = torch_peers.thread_name(n)
    contestants[name] = t_calls
    setups[name] = lambda n=n: torch.set_num_threads(n)
  names = list(contestants)
  reference = names[len(e.implementations)]  # torch at e.threads[0]
  first = {t: {} for t in TASKS}
  for c in names:
    for t in TASKS:
      first[t][c], out = timing.timed_call(setups[c],
                                           _call(contestants[c][t]))
      outs[(c, t)] = _kept(t, out)
  second = {}
  for c in names[:len(e.implementations)]:
    p2 = prompt[:, :e.second_prompt]
    s, compiles, _ = _count_compiles(
        lambda c=c, p2=p2: contestants[c]["decode"](p2))
    second[c] = {"seconds": s, "compiles": compiles}
  load = []  # the 1-minute load average as each timed round starts
  calls = {(t, c): _call(contestants[c][t]) for t in TASKS for c in names}
  round_setups = {(t, c): setups[c] for t in TASKS for c in names}
  work = task_work(e, models, path, ids, prompt)
  (calls[(YARDSTICK, MATMUL)], work[MATMUL]) = roofline.matmul_yardstick(
      e.matmul_n)
  (calls[(YARDSTICK, STREAM)], work[STREAM]) = roofline.stream_yardstick(
      *e.stream_shape)
  timing.interleaved_times(calls, e.warm_rounds, setups=round_setups)
  flat = timing.interleaved_times(
      calls, e.rounds, setups=round_setups,
      on_round=lambda r: load.append(os.getloadavg()[0]))
  times = {t: {c: flat[(t, c)] for c in names} for t in TASKS}
  yard = {k: flat[(YARDSTICK, k)] for k in (MATMUL, STREAM)}
  agree = {c: {
      "forward_rel": _rel(outs[(c, "forward")],
                          outs[(reference, "forward")]),
      "loss": outs[(c, "loss_grad")],
      "tokens": torch_peers.leading_agreement(outs[(c, "decode")],
                                              outs[(reference, "decode")])}
           for c in names}
  # What transformers ran: the config field it dispatches attention on.
  attn = hf.config._attn_implementation  # pylint: disable=protected-access
  results = {
      "model": label, "file": path.name, "vocab": vocab,
      "attn_implementation": attn,
      "tokens": e.tokens, "prompt": e.prompt, "new_tokens": e.new_tokens,
      "second_prompt": e.second_prompt,
      "decode_cache_slots": generate.bucket(e.prompt + e.new_tokens - 1),
      "decode_width": generate.bucket(e.prompt),
      "contestants": names, "reference": reference, "times": times,
      "ratios": {ref: _ratios_to(times, names, ref)
                 for ref in names[len(e.implementations):]},
      "first": first, "second_prompt_call": second, "agree": agree,
      "loadavg_rounds": load,
      "roofline": roofline_shares(e, work, times, yard),
      "warm_rounds": e.warm_rounds, "keep_freed_memory": kept,
      "cores": os.cpu_count(), "cpu": machine.instruction_sets(),
      "jax": jax.__version__,
      "torch": torch.__version__}
  if e.profile:
    results["profile"] = _profiles(e, contestants, models, names, prompt,
                                   setups)
  results["summary"] = summary(times, results["ratios"])
  results["seconds"] = time.perf_counter() - start
  return results


def task_work(e, models, path, ids, prompt) -> dict:
  """The roofline's numerators: `{"forward": matmul FLOPs, "loss_grad":
  matmul FLOPs, "decode": weight bytes read}` per call. FLOPs are the
  einsum path's program (the dense one), loaded here if it is not among
  the contestants; bytes are every parameter (float32 here) read once per
  new token (the prefill's pass and N - 1 cached steps)."""
  model = (models.get("mha_jax einsum")
           or mha_jax.load_pretrained(path, implementation="einsum"))
  calls = mha_jax_calls(model, jnp.asarray(ids, jnp.int32), prompt,
                        e.new_tokens)
  out = {t: flops.jaxpr_matmul_flops(*((calls[t][0],) + calls[t][1]))
         for t in ("forward", "loss_grad")}
  out["decode"] = e.new_tokens * roofline.param_bytes(model)
  return out


def roofline_shares(e, work, times, yard) -> dict:
  """Work per call, the yardsticks' rates per round and every
  contestant's share of its task's yardstick per round (median, range):
  the matmul's for the forward and the gradient, the weight stream's for
  decoding."""
  stick = {"forward": MATMUL, "loss_grad": MATMUL, "decode": STREAM}
  return {
      "matmul_n": e.matmul_n, "stream_shape": list(e.stream_shape),
      "work": {t: float(work[t]) for t in TASKS},
      "yardstick": stick,
      "rates": {k: [work[k] / s for s in yard[k]] for k in yard},
      "share": {t: {c: roofline.share(work[t], x, work[stick[t]],
                                      yard[stick[t]])
                    for c, x in by.items()} for t, by in times.items()}}


def summary(times, ratios) -> dict:
  """What the report reads of the rounds: per task and contestant the
  median and minimum seconds ("times"), and per torch reference, task
  and contestant the median, minimum and maximum of the per-round ratio
  ("ratios")."""
  spread = timing.spread
  return {"times": {t: {c: {"median": float(np.median(x)),
                            "min": float(min(x))} for c, x in by.items()}
                    for t, by in times.items()},
          "ratios": {ref: {t: {c: spread(x) for c, x in by.items()}
                           for t, by in by_task.items()}
                     for ref, by_task in ratios.items()}}


def _ratios_to(times, names, ref) -> dict:
  """task -> contestant -> its time over `ref`'s, per round."""
  return {t: {c: [float(x) for x in np.asarray(times[t][c])
                  / np.asarray(times[t][ref])] for c in names}
          for t in TASKS}


def _profiles(e, contestants, models, names, prompt, setups) -> dict:
  """task -> {contestant: `profile.xla_ops` / `torch_ops` tables}: mha_jax
  on its first path, torch at its first thread count, on the timed work
  (for decode, the program `generate` runs: `generate.prepare`)."""
  jax_name, torch_name = names[0], names[len(e.implementations)]
  out = {}
  for t in TASKS:
    if t == "decode":
      args, static = generate.prepare(models[jax_name], prompt,
                                      e.new_tokens)
      fn = generate.decode_jit
    else:
      (fn, args), static = contestants[jax_name][t], {}
    setups[torch_name]()
    out[t] = {jax_name: profile_lib.xla_ops(fn, args, static,
                                            calls=e.profile_calls),
              torch_name: profile_lib.torch_ops(contestants[torch_name][t],
                                                calls=e.profile_calls)}
  return out
