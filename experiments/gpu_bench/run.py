"""The GPU benchmark's measuring: the five parts in turn, within a budget.

`config.parts` names the parts in run order (`PARTS`); part i gets the
share `config.shares[i]` of the time left when it starts, renormalised
over the parts still to run, so time one part leaves goes to the next.
A part asks its `devices.Budget` before each case and records the cases
it skips. A part that raises is recorded with its error (the others still
run), so a one-off run on a device keeps everything that worked.
After each part `on_part(results)` is called (the entry point writes the
report then), so a run stopped from outside keeps the parts it finished.
"""

from __future__ import annotations

import time
import traceback

from experiments.gpu_bench import devices
from experiments.gpu_bench import flex
from experiments.gpu_bench import lms
from experiments.gpu_bench import long_context
from experiments.gpu_bench import policy
from experiments.gpu_bench import train_steps

PARTS = {"train_step": train_steps.measure, "lms": lms.measure,
         "long_context": long_context.measure, "policy": policy.measure,
         "flex": flex.measure}


def part_names(config) -> list[str]:
  names = devices.names(config.parts)
  bad = [n for n in names if n not in PARTS]
  if bad:
    raise ValueError(f"config.parts: unknown {bad}; expected names from "
                     f"{list(PARTS)}")
  return names


def measure(config, on_part=None) -> dict:
  """Every part of `config.parts`; `on_part(results)` after each."""
  start = time.perf_counter()
  names = part_names(config)
  results = {"facts": devices.facts(), "budget_s": float(config.budget_s),
             "parts": {}, "part_s": {}, "order": names}
  for i, name in enumerate(names):
    left = config.budget_s - (time.perf_counter() - start)
    weights = [float(config.shares.get(n, 0.0)) for n in names[i:]]
    share = weights[0] / sum(weights) if sum(weights) > 0 else 1.0
    budget = devices.Budget(max(0.0, left * share), name)
    part_start = time.perf_counter()
    print(f"[gpu_bench] {name}: {budget.seconds:.0f} s of the budget",
          flush=True)
    try:
      results["parts"][name] = PARTS[name](config, budget)
    except Exception as e:  # pylint: disable=broad-except
      results["parts"][name] = {
          "error": f"{type(e).__name__}: {e}",
          "traceback": traceback.format_exc()[-4000:]}
      print(results["parts"][name]["traceback"], flush=True)
    results["part_s"][name] = time.perf_counter() - part_start
    results["seconds"] = time.perf_counter() - start
    if on_part is not None:
      on_part(results)
  return results
