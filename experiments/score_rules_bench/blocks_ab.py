"""A/B: one rule's block mask on other blocks and walks, in one process.

    .venv/bin/python -m experiments.score_rules_bench.blocks_ab \
        --rule=window --grad
    .venv/bin/python -m experiments.score_rules_bench.blocks_ab \
        --rule=documents

On q, k, v `[1, n, 2, 64]` float32 (n = 8192 by default), the causal rule
of configs/score_rules_bench.py (`--rule`: a 512-key window or 8
documents, `run.rule_of`) through `flash.flash_attention` with its block
mask built on each variant's blocks:

  window     blocks512 (the block walk, spans=False), spans128, spans64,
             spans32 (the span walk, spans=True)
  documents  blocks512 (heads batched, the default), loop512 (one head at
             a time), blocks256, blocks1024 (the block walk throughout)

forward only, or with `--grad` the gradient of sum(out * w) by q, k and v
(the backward walks the blocks in every variant). Every variant is
compiled and called once, then timed in `--rounds` interleaved rounds
(`timing.interleaved_times`); printed as one JSON object with each
variant's median, its ratio to the first variant's per round, and its
largest difference from the first's output.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from configs import score_rules_bench as bench_config
from experiments.score_rules_bench import run as run_lib
from mha_jax.core import block_mask
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.measure import timing
from mha_jax.training import host_memory

# name -> (blocks, head_loop, spans) per rule; the first is the baseline.
VARIANTS = {
    "window": {"blocks512": (512, None, False), "spans128": (128, None, True),
               "spans64": (64, None, True), "spans32": (32, None, True)},
    "documents": {"blocks512": (512, None, None),
                  "loop512": (512, True, None),
                  "blocks256": (256, None, False),
                  "blocks1024": (1024, None, False)},
}


def run(rule="window", n=8192, grad=False, rounds=7, seed=0) -> dict:
  config = bench_config.get_config()
  kept = host_memory.keep_freed_memory()  # as score_rules_bench does
  ks = jax.random.split(jax.random.key(seed), 4)
  q, k, v, w = (jax.random.normal(kk, (1, n, 2, 64)) for kk in ks)
  mask_mod, _ = run_lib.rule_of(rule, n, config)
  compiled, outs = {}, {}
  for name, (blocks, head_loop, spans) in VARIANTS[rule].items():
    rules = score_rules.ScoreRules(mask_mod=mask_mod,
                                   block_mask=block_mask.create(
                                       mask_mod, None, None, n, n, blocks,
                                       blocks))
    attend = lambda q, k, v, rules=rules, head_loop=head_loop, spans=spans: (
        flash.flash_attention(q, k, v, rules=rules, head_loop=head_loop,
                              spans=spans))
    fn = (jax.grad(lambda q, k, v, f=attend: jnp.sum(f(q, k, v) * w),
                   argnums=(0, 1, 2)) if grad else attend)
    compiled[name] = jax.jit(fn).lower(q, k, v).compile()
    outs[name] = np.asarray(compiled[name](q, k, v)[0] if grad
                            else compiled[name](q, k, v))  # the warm-up
  times = timing.interleaved_times(
      {name: lambda f=f: f(q, k, v) for name, f in compiled.items()},
      rounds)
  base = next(iter(times))
  result = {"rule": rule, "n": n, "grad": grad, "rounds": rounds,
            "load_average": list(os.getloadavg()),
            "keep_freed_memory": kept, "variants": {}}
  for name, ts in times.items():
    per_round = [t / b for t, b in zip(ts, times[base])]
    result["variants"][name] = {
        "median_s": float(np.median(ts)), "times_s": ts,
        "x_first_median": float(np.median(ts) / np.median(times[base])),
        "x_first_rounds": [min(per_round), max(per_round)],
        "max_abs_diff": float(np.max(np.abs(outs[name] - outs[base])))}
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rule", choices=sorted(VARIANTS), default="window")
  parser.add_argument("--n", type=int, default=8192)
  parser.add_argument("--grad", action="store_true")
  parser.add_argument("--rounds", type=int, default=7)
  args = parser.parse_args()
  print(json.dumps(run(args.rule, args.n, args.grad, args.rounds),
                   indent=1))


if __name__ == "__main__":
  main()
