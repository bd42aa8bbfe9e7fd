"""The machine a speed figure comes from: the CPU's model and the
instruction set each library was allowed to use.

XLA can be held to an older instruction set (`XLA_FLAGS=--xla_cpu_max_isa=
AVX2`) and so can torch (`ATEN_CPU_CAPABILITY=avx2`), which is how an
AVX-512 machine measures the AVX2 case; a figure names both, since the
same CPU gives different ratios under the two settings.
"""

from __future__ import annotations

import os
import pathlib
import re


def _cpuinfo() -> str:
  info = pathlib.Path("/proc/cpuinfo")
  return info.read_text() if info.exists() else ""


def cpu() -> dict:
  """`{"model", "avx512f"}`: the model name (/proc/cpuinfo's; "" where
  there is none) and whether the CPU has AVX-512."""
  text = _cpuinfo()
  model = next((l.split(":", 1)[1].strip() for l in text.splitlines()
                if l.startswith("model name")), "")
  return {"model": model, "avx512f": " avx512f" in text}


def instruction_sets() -> dict:
  """`cpu()` plus the CPU's family/model numbers, whether it has AVX2,
  the instruction set XLA was limited to (`--xla_cpu_max_isa` in
  XLA_FLAGS; None: the CPU's best) and torch's (`ATEN_CPU_CAPABILITY`;
  None: the CPU's best)."""
  text = _cpuinfo()
  field = lambda name: next(
      (l.split(":", 1)[1].strip() for l in text.splitlines()
       if re.match(rf"{name}\s*:", l)), None)
  xla = re.search(r"--xla_cpu_max_isa=(\S+)", os.environ.get("XLA_FLAGS", ""))
  return {**cpu(), "family": field("cpu family"), "model_number":
          field("model"), "avx2": " avx2" in text,
          "xla_max_isa": xla.group(1) if xla else None,
          "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY")}


def describe(isa: dict) -> str:
  """One line for a report: "AMD EPYC (family 25 model 17), AVX-512; XLA
  limited to AVX2, torch to avx2"."""
  best = ("AVX-512" if isa["avx512f"] else "AVX2" if isa.get("avx2")
          else "neither AVX2 nor AVX-512")
  limits = [f"{who} limited to {isa[key]}" for who, key in (
      ("XLA", "xla_max_isa"), ("torch", "aten_cpu_capability")) if isa.get(key)]
  where = (f" (family {isa['family']} model {isa['model_number']})"
           if isa.get("family") else "")
  return (f"{isa['model'] or 'unknown CPU'}{where}, {best}"
          + (f"; {', '.join(limits)}" if limits else ""))
