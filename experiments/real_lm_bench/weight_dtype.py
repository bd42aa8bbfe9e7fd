r"""Greedy decoding with bfloat16 weights: does it read fewer bytes a step?

  python -m experiments.real_lm_bench.weight_dtype [--new_tokens=128] \
      [--rounds=5] [--notorch]

Decoding one sequence is bound by reading the weights (the real-LM
benchmark's profile: a SmolLM2 step reads its 540 MB of float32 weights
at about 28 GB/s), so halving their bytes is the obvious lever. This
loads SmolLM2-135M-Instruct (its GGUF file) three ways with
`load_pretrained`: float32 weights (the default), bfloat16 weights with
float32 compute (`param_dtype=bfloat16, dtype=float32`: each weight is
converted where it is used), and bfloat16 throughout; and, as a PyTorch
user would, transformers' model in float32 and in bfloat16. It times N
greedy tokens after a P-token prompt in interleaved rounds (rotating
order, the first call untimed), compares each one's tokens with mha_jax
float32's, and reads the compiled decode program for what its loop
carries: the bytes of the `while` loop's state by dtype. A weight whose
conversion XLA hoists out of the loop enters it already float32, so the
loop reads as many bytes as with float32 weights. It also times XLA's
matrix-vector product alone in both dtypes.

The roofline: the weight-stream yardstick (`roofline.stream_yardstick`,
a float32 `[1, 2048] x [2048, 65536]` product, 537 MB read a call) is
timed in the same rounds, and each contestant's share is its weights'
bytes as stored (float32 or bfloat16), read once per new token, per
second over the yardstick's rate in the same round. A contestant that
reads wider copies than it stores shows it as a lower share.

Writes nothing: the table goes to stdout (docs/performance_real.md
quotes one).
"""

from __future__ import annotations

import collections
import os
import re

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments import torch_peers
import mha_jax
from mha_jax.measure import machine
from mha_jax.measure import report as report_lib
from mha_jax.measure import roofline
from mha_jax.measure import timing
from mha_jax.models import generate
from mha_jax.pretrained import real_models

# `load_pretrained` keywords of each mha_jax contestant.
SETTINGS = {
    "mha_jax float32": {},
    "mha_jax bf16 weights, f32 compute": {"param_dtype": jnp.bfloat16,
                                          "dtype": jnp.float32},
    "mha_jax bfloat16": {"param_dtype": jnp.bfloat16,
                         "dtype": jnp.bfloat16},
}
_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4,
          "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "s8": 1, "u8": 1,
          "pred": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_WHILE = re.compile(r"^\s*(?:ROOT )?%[\w.\-]+ = (\(.*?\)) while\(")


def loop_state_bytes(hlo_text: str) -> dict:
  """`{dtype: bytes}` of the state of the largest `while` loop in
  compiled HLO text (its tuple's arrays; what every iteration may read),
  or {} when there is none."""
  best = {}
  for line in hlo_text.splitlines():
    m = _WHILE.match(line)
    if not m:
      continue
    sizes = collections.Counter()
    for dtype, dims in _ARRAY.findall(m.group(1)):
      n = int(np.prod([int(d) for d in dims.split(",") if d]))
      sizes[dtype] += n * _BYTES[dtype]
    if sum(sizes.values()) > sum(best.values()):
      best = dict(sizes)
  return best


def matvec_rate(dtype, n: int = 2048, repeats: int = 50) -> float:
  """GB/s of weights read by XLA's `[1, n] x [n, n]` product in `dtype`
  (the best of `repeats` calls): what one decoding step does per
  weight matrix."""
  w, x = jnp.ones((n, n), dtype), jnp.ones((1, n), dtype)
  f = jax.jit(lambda x, w: x @ w)
  best = min(timing.wall_times(f, (x, w), warmup=2, repeats=repeats)[0])
  return w.nbytes / best / 1e9


def main(argv):
  del argv
  fl = flags.FLAGS
  path = real_models.smollm2_135m()
  vocab = mha_jax.pretrained.load_config(path).vocab_size
  ids = torch_peers.token_ids(vocab, fl.prompt, seed=0)  # [1, P]
  calls, tokens, state, stored = {}, {}, {}, {}
  for name, kw in SETTINGS.items():
    model = mha_jax.load_pretrained(path, **kw)
    stored[name] = roofline.param_bytes(model)
    calls[name] = lambda m=model: generate.generate(m, ids, fl.new_tokens)
    args, static = generate.prepare(model, ids, fl.new_tokens)
    state[name] = loop_state_bytes(
        generate.decode_jit.lower(*args, **static).compile().as_text())
  setups = {}
  if fl.torch:
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    prompt = torch.as_tensor(ids)
    for dt in ("float32", "bfloat16"):
      hf = transformers.AutoModelForCausalLM.from_pretrained(
          str(path.parent), gguf_file=path.name,
          dtype=getattr(torch, dt)).eval()
      name = f"transformers {dt}"
      calls[name] = torch_peers.greedy_decode(hf, prompt, fl.new_tokens)
      setups[name] = lambda: torch.set_num_threads(2)
      # Tied weights are one tensor: count each once.
      stored[name] = sum(p.numel() * p.element_size()
                         for p in hf.parameters())
  for name, call in calls.items():  # untimed: compiles, warms
    setups.get(name, lambda: None)()
    tokens[name] = np.asarray(jax.block_until_ready(call()))
  yard, yard_bytes = roofline.stream_yardstick()
  times = timing.interleaved_times({**calls, "yardstick": yard}, fl.rounds,
                                   setups=setups)
  rate = [yard_bytes / t for t in times["yardstick"]]
  ref = "mha_jax float32"
  cpu = machine.cpu()
  print(f"{cpu['model']} (AVX-512: {cpu['avx512f']}), {os.cpu_count()} "
        f"cores; jax {jax.__version__}; {fl.new_tokens} greedy tokens "
        f"after {fl.prompt}; median of {fl.rounds} interleaved rounds, "
        f"ratio per round to {ref}")
  print(f"XLA's [1, 2048] x [2048, 2048] product reads float32 weights at "
        f"{matvec_rate(jnp.float32):.1f} GB/s, bfloat16 at "
        f"{matvec_rate(jnp.bfloat16):.1f} GB/s")
  print(f"The weight-stream yardstick in the same rounds: "
        f"{np.median(rate) / 1e9:.1f} GB/s (median; {min(rate) / 1e9:.1f} to "
        f"{max(rate) / 1e9:.1f})")
  print("\n| contestant | tokens/s | time x float32 (median, range) | "
        "tokens equal to float32's before the first difference | loop "
        "state, MB by dtype | weights as stored, MB | share of the weight "
        "stream, weights as stored (median [min, max]) |")
  print("|---|---|---|---|---|---|---|")
  for name in calls:
    r = np.asarray(times[name]) / np.asarray(times[ref])
    mb = ", ".join(f"{d} {b / 1e6:.0f}" for d, b in
                   sorted(state.get(name, {}).items()) if b >= 1e6)
    share = roofline.share(fl.new_tokens * stored[name], times[name],
                           yard_bytes, times["yardstick"])
    print(f"| {name} | {fl.new_tokens / np.median(times[name]):.1f} | "
          f"{np.median(r):.2f} ({r.min():.2f}-{r.max():.2f}) | "
          f"{torch_peers.leading_agreement(tokens[name], tokens[ref])} "
          f"of {fl.new_tokens} | {mb or '-'} | {stored[name] / 1e6:.0f} | "
          f"{report_lib.share_cell(share)} |")


if __name__ == "__main__":
  # Defined here, not on import, so that tests can import the helpers.
  flags.DEFINE_integer("prompt", 16, "P, prompt tokens (random ids).")
  flags.DEFINE_integer("new_tokens", 128, "N, greedy tokens per call.")
  flags.DEFINE_integer("rounds", 5, "Interleaved timed rounds.")
  flags.DEFINE_bool("torch", True, "Also time transformers in float32 and "
                    "bfloat16 (2 threads).")
  app.run(main)
