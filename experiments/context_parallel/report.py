"""Context parallelism, reporting: report.md from the results dict of
`run.measure`.

The prose is report.md.tmpl beside this file; `render` fills it from
results.json alone, so a committed report regenerates from its
results.json.
"""

from __future__ import annotations

import functools
import pathlib

from mha_jax.measure import report as report_lib

MIB = 2.0 ** 20
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
# The template's last section, left out when the long run was skipped
# (`experiment.long_len = 0`).
LONG_HEADING = "\n## The long run"
LONG_VALUES = ("long_tokens", "long_heads", "long_head_dim", "run_s",
               "compile_s", "finite", "peak", "peak_all", "peak_rss")


def write(config, results, workdir, command: str | None = None) -> dict:
  """report.md and results.json into `workdir` (the report is printed
  too); returns what results.json holds."""
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command),
      config=config, echo=True)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  text = report_lib.fill(TEMPLATE, values(saved, command))
  return text if "long" in saved else text.partition(LONG_HEADING)[0]


def _mib(x) -> str:
  """Bytes as MiB, `1,109.9`."""
  return f"{x / MIB:,.1f}"


def _memory_table(m, n) -> str:
  """XLA's memory analysis, one device against one device of the ring."""
  rows = [[name, _mib(m["one_device"][name]),
           _mib(m["ring_per_device"][name])]
          for name in ("argument", "output", "temp", "alias", "peak")]
  return report_lib.md_table(["", "one device", f"ring, per device of {n}"],
                             rows)


def _long(saved) -> dict:
  """The long run's values; blanks where it was skipped (`render` then
  leaves its section out)."""
  if "long" not in saved:
    return dict.fromkeys(LONG_VALUES, "")
  g, n = saved["long"], saved["devices"]
  per = g["per_device"]["peak"]
  return {"long_tokens": g["tokens"], "long_heads": g["heads"],
          "long_head_dim": g["head_dim"], "run_s": f"{g['run_s']:.0f}",
          "compile_s": f"{g['compile_s']:.0f}", "finite": g["finite"],
          "peak": _mib(per), "peak_all": _mib(per * n),
          "peak_rss": _mib(g["process_peak_rss"])}


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  m, n = saved["memory"], saved["devices"]
  return {
      "command": report_lib.command("experiments.context_parallel", command),
      "heads": m["heads"],
      "head_dim": m["head_dim"],
      "block": saved["block"],
      "devices": n,
      "layout": saved["layout"],
      "tokens": m["tokens"],
      "memory_table": _memory_table(m, n),
      "ratio": f"{m['ratio']:.3f}",
      "even_share": f"{1 / n:.3f}",
      **_long(saved),
  }
