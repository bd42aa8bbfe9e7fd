"""docs/gpu.md from one `make gpu-check` run's outputs.

  python -m experiments.gpu_bench.page --work=runs/gpu_check --out=docs/gpu.md

scripts/gpu_check.sh calls this last. It reads, in the work folder:
`stages.tsv` (one line per stage the script ran: name, exit status,
seconds, limit in seconds), `tests.log` (pytest's output), each attend
benchmark run's `<run>/table.md` and the GPU benchmark's
`gpu_bench/report.md` and `results.json`. A stage that failed, timed out
or never ran is said to have, in its place on the page; nothing is
left out silently.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re

ATTEND_RUNS = {"standard": "the standard shape in float32 and bfloat16",
               "long_32768": "long context, n = 32768, bfloat16",
               "smoke": "the smoke config's tiny shape"}
_TIMEOUT = (124, 137)  # `timeout`'s exit statuses (TERM, then KILL)
_WHERE = ("pytest-xdist workers sharing the device, "
          "XLA_PYTHON_CLIENT_PREALLOCATE=false; a suite stopped at its limit "
          "counts only the tests that finished")


def read_stages(work: pathlib.Path) -> dict:
  """name -> {"rc", "seconds", "limit"} from stages.tsv."""
  path = work / "stages.tsv"
  out = {}
  if path.exists():
    for line in path.read_text().splitlines():
      name, rc, seconds, limit = line.split("\t")
      out[name] = {"rc": int(rc), "seconds": float(seconds),
                   "limit": float(limit)}
  return out


def stage_note(stage: dict | None) -> str:
  """How a stage ended, in words."""
  if stage is None:
    return "did not run"
  if stage["rc"] in _TIMEOUT or stage["rc"] == 130:
    return (f"stopped at its time limit of {stage['limit']:.0f} s "
            f"(exit status {stage['rc']})")
  return f"exit status {stage['rc']}, {stage['seconds']:.0f} s"


def tests_section(work: pathlib.Path, stage: dict | None,
                  command: str) -> str:
  log = work / "tests.log"
  text = log.read_text(errors="replace") if log.exists() else ""
  lines = [l for l in text.splitlines() if l.strip()]
  summary = next((l.strip("= ") for l in reversed(lines)
                  if re.search(r"\b(passed|failed|error|no tests ran)\b",
                               l)), "no summary line (see the log)")
  failed = [l for l in lines if l.startswith(("FAILED ", "ERROR "))]
  out = [f"`{command.strip()}` ({_WHERE}): {stage_note(stage)}.", "",
         f"Summary: {summary}"]
  if failed:
    out += ["", f"Failed ({len(failed)}):", ""]
    out += [f"- `{l[:300]}`" for l in failed[:60]]
    if len(failed) > 60:
      out.append(f"- ... and {len(failed) - 60} more (tests.log)")
  return "\n".join(out)


def auto_section(smoke: bool) -> str:
  """What `auto` chooses at the attend benchmark's shapes."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import mha_jax  # pylint: disable=import-outside-toplevel
  from configs import benchmark  # pylint: disable=import-outside-toplevel
  c = benchmark.get_config("smoke" if smoke else None)
  std, long = c.shape, c.long_shape
  shapes = [(f"standard {jnp.dtype(t).name}", std.B, std.n, std.D, std.h,
             t, False) for t in (jnp.float32, jnp.bfloat16)]
  shapes += [(f"long causal n={n} {jnp.dtype(t).name}", long.B, n, long.D,
              long.h, t, True)
             for n in (8192, 32768) for t in (jnp.float32, jnp.bfloat16)]
  lines = []
  for name, b, n, dm, h, dtype, causal in shapes:
    q = jax.ShapeDtypeStruct((b, n, h, dm // h), dtype)
    choice = str(mha_jax.explain_auto(q, q, is_causal=causal))
    lines.append(f"- {name}: `{choice}`".replace("\n", "; "))
  return "\n".join(lines)


def attend_section(work: pathlib.Path, run: str, stage: dict | None) -> str:
  table = work / run / "table.md"
  head = f"## Attend benchmark: {ATTEND_RUNS.get(run, run)}\n\n"
  if stage is not None and stage["rc"] == 0 and table.exists():
    return head + f"`{run}`: {stage_note(stage)}.\n\n" + table.read_text()
  return head + f"`{run}`: {stage_note(stage)}; no table."


def bench_section(work: pathlib.Path, stage: dict | None) -> str:
  report = work / "gpu_bench" / "report.md"
  if not report.exists():
    return ("## Training steps, real LMs, long context, precision\n\n"
            f"experiments.gpu_bench: {stage_note(stage)}; no report.")
  lines = report.read_text().splitlines()
  body = "\n".join(("#" + l) if l.startswith("#") else l for l in lines[1:])
  title = lines[0].lstrip("# ")
  return (f"## {title}\n\nexperiments.gpu_bench ({stage_note(stage)}; "
          "its report, with results.json beside it in the run folder):\n"
          + body)


def facts_line(work: pathlib.Path) -> str:
  path = work / "gpu_bench" / "results.json"
  if path.exists():
    f = json.loads(path.read_text())["facts"]
  else:
    from experiments.gpu_bench import devices  # pylint: disable=import-outside-toplevel
    f = devices.facts()
  torch = (f"torch {f['torch']} on {f.get('torch_device_name', '-')}"
           if "torch_device" in f else f"torch: {f.get('torch')}")
  return (f"Device: {f['jax_device']} (JAX backend {f['jax_backend']}, "
          f"{f['jax_device_count']} device(s)); jax {f['jax']}, flax "
          f"{f['flax']}, {torch}, transformers "
          f"{f.get('transformers', '-')}; {f['cpu_count']} CPU cores.")


def compose(work, *, smoke: bool, tests_command: str, attend_runs) -> str:
  """The page's Markdown."""
  work = pathlib.Path(work)
  stages = read_stages(work)
  total = sum(s["seconds"] for s in stages.values())
  parts = [
      "# Attention on GPU", "",
      f"Written by `make gpu-check` (scripts/gpu_check.sh) on "
      f"{datetime.date.today().isoformat()}, in {total / 60:.1f} min "
      "(" + ", ".join(f"{n} {s['seconds']:.0f} s" for n, s in
                      stages.items()) + ")."]
  if smoke:
    parts += ["", "**Smoke run** (GPU_CHECK_FORCE=1 on a machine without a "
              "GPU): one test file and tiny shapes, to check the script "
              "end to end. These are not GPU numbers."]
  parts += ["", facts_line(work), "", "## Tests", "",
            tests_section(work, stages.get("tests"), tests_command), "",
            "## What `auto` chose", "", auto_section(smoke), ""]
  for run in attend_runs:
    parts += [attend_section(work, run, stages.get(f"attend_{run}")), ""]
  parts += [bench_section(work, stages.get("gpu_bench"))]
  return "\n".join(parts).rstrip() + "\n"


def _main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--work", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--tests_command", default="pytest")
  ap.add_argument("--attend_runs", default="")
  a = ap.parse_args()
  text = compose(a.work, smoke=a.smoke, tests_command=a.tests_command,
                 attend_runs=[r for r in a.attend_runs.split(",") if r])
  out = pathlib.Path(a.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(text)
  print(f"gpu-check: wrote {out}")


if __name__ == "__main__":
  _main()
