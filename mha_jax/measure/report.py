"""What every experiment's report writes: its cells, tables and files.

One module owns the formats a reader compares across reports, so a
"mean ± std [interval]" cell reads the same everywhere:

  fmt(0.1234, 0.0042)              -> "0.123 ± 0.004"
  interval((0.12, 0.131))          -> "[0.120, 0.131]"   ("n/a": one seed)
  summary(stats.summary(values))   -> "0.123 ± 0.004 [0.110, 0.136]"
  difference(stats.difference(a, b)) -> "+0.050 [0.010, 0.090]"
  percent(0.25)                    -> "25.0%"
  signed(0.1234)                   -> "+0.123"
  significant(0.000123456)         -> "0.000123"
  scientific(1.234e-4, 4.5e-5)     -> "1.23e-04 ± 4.5e-05"
  wall_time(90.0, reused=False)    -> "1.5 min wall on this machine"
  head_name(1, 3)                  -> "L1H3"

Each takes a format spec (`spec`, and `std_spec` / `interval_spec` where
the parts differ) for the reports that print significant digits (`.3g`)
or signs (`+.3f`). `md_table` writes a Markdown table and `write_outputs`
the report.md / results.json pair of a run folder. `fill` puts those cells
into a report's Markdown template, and `regenerate` renders a report again
from a folder's results.json.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import string

from absl import app
import jax
import numpy as np

from mha_jax import hooks
from mha_jax.measure import stats


# Mean and sample std (ddof = 1; None for one seed) over seeds.
mean_std = stats.mean_std


def fmt(mean: float, std: float | None = None, digits: int = 3) -> str:
  """`0.123 ± 0.004` (mean ± sample std), or `0.123` without a std."""
  if std is None:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


def interval(ci, digits: int = 3, *, spec: str | None = None,
             missing: str = "n/a") -> str:
  """`[0.120, 0.131]`, or `missing` where there is no interval (one
  seed)."""
  if ci is None:
    return missing
  spec = spec or f".{digits}f"
  return f"[{ci[0]:{spec}}, {ci[1]:{spec}}]"


def summary(summ: dict, digits: int = 3, *, spec: str | None = None,
            std_spec: str | None = None) -> str:
  """A `stats.summary` as `mean ± std [95% interval]`; the mean alone for
  one seed (no std)."""
  spec = spec or f".{digits}f"
  if summ["std"] is None:
    return f"{summ['mean']:{spec}}"
  return (f"{summ['mean']:{spec}} ± {summ['std']:{std_spec or spec}} "
          f"{interval(summ['ci95'], spec=spec)}")


def difference(d: dict, digits: int = 3, *, spec: str | None = None,
               interval_spec: str | None = None,
               missing: str = "(n/a)") -> str:
  """A `stats.difference` as `+diff [lo, hi]` (signed); `+diff missing`
  without an interval (one seed)."""
  spec = spec or f"+.{digits}f"
  if d["ci95"] is None:
    return f"{d['diff']:{spec}} {missing}"
  return f"{d['diff']:{spec}} {interval(d['ci95'], spec=interval_spec or spec)}"


def percent(fraction: float, digits: int = 1, *, signed: bool = False
            ) -> str:
  """`0.25` -> `25.0%` (`+25.0%` with `signed`)."""
  return f"{100 * fraction:{'+' if signed else ''}.{digits}f}%"


def share_cell(r: dict) -> str:
  """A share of a yardstick (`roofline.share`) in percent: `87% [84, 98]`,
  the median over rounds [minimum, maximum]."""
  return (f"{100 * r['median']:.0f}% [{100 * r['min']:.0f}, "
          f"{100 * r['max']:.0f}]")


def matmul_yardstick(n: int) -> str:
  """`roofline.matmul_yardstick(n)` in a report's words."""
  return f"float32 `[{n}, {n}] x [{n}, {n}]` product"


def stream_yardstick(rows: int, cols: int) -> str:
  """`roofline.stream_yardstick(rows, cols)` in a report's words."""
  return (f"float32 `[1, {rows}] x [{rows}, {cols}]` product, which reads "
          f"{rows * cols * 4 / 1e6:.3g} MB of weights a call")


def signed(x: float, digits: int = 3) -> str:
  """`+0.123`: a bare number with its sign."""
  return f"{x:+.{digits}f}"


def significant(x: float, digits: int = 3) -> str:
  """`x` to `digits` significant digits (for values spanning decades)."""
  return f"{x:.{digits}g}"


def scientific(mean: float, std: float | None = None) -> str:
  """`1.23e-04 ± 4.5e-05`, or the mean alone without a std."""
  return f"{mean:.2e} ± {std:.1e}" if std is not None else f"{mean:.2e}"


def wall_time(wall_s: float, reused: bool) -> str:
  """How long an experiment's command took; with reused runs, the
  analysis alone."""
  return (f"{wall_s / 60:.1f} min wall on this machine"
          + (", analysis only: finished runs were reused" if reused else ""))


# Everything a reader sees counts layers and heads from 0, as the API does
# (`blocks.1.attn`, `heads=3`) and as TransformerLens names heads (L1H3), so
# a head read off a report is the head one types. Each report says so once.
HEAD_NAMES = ("Layers and heads count from 0, as the API does: L1H3 is head "
              "3 of layer 1, `hooks` site `blocks.1.attn.*` with `heads=3`.")


# `L1H3`: head 3 of layer 1, both counted from 0 (see `HEAD_NAMES`).
head_name = hooks.head_name


def freed_memory(kept: dict | None) -> str:
  """How a benchmark's process treated freed host memory, from the answer
  of `host_memory.keep_freed_memory` it saved (None: a run from before
  benchmarks saved it, which used glibc's default)."""
  if kept is None:
    return "glibc's default (the run predates the setting)"
  return ("kept for reuse" if kept["applied"]
          else f"glibc's default ({kept['reason']})")


def md_table(headers, rows) -> str:
  """A Markdown table; cells are written with `str`."""
  lines = ["| " + " | ".join(str(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _to_json(x, drop):
  """`x` with arrays as lists and every dict key in `drop` left out."""
  if isinstance(x, dict):
    return {str(k): _to_json(v, drop) for k, v in x.items() if k not in drop}
  if isinstance(x, (list, tuple)):
    return [_to_json(v, drop) for v in x]
  if isinstance(x, (np.ndarray, jax.Array)):
    return np.asarray(x).tolist()
  if isinstance(x, (np.floating, np.integer, np.bool_)):
    return x.item()
  return x


def command_line(argv, module: str) -> str:
  """`python -m <module> <argv[1:]>` as one shell-quoted line: the command
  a report names (an entry point passes it to its run)."""
  return shlex.join([".venv/bin/python", "-m", module, *argv[1:]])


def command(module: str, line: str | None = None) -> str:
  """The command that ran, as Markdown: `line` (`command_line`'s), or,
  without one (`run` called from Python: a test, a notebook), that call
  (its config is in results.json).

  The line is an argument, not state of this module, so two reports
  rendered in one process each name their own command.
  """
  if line is not None:
    return f"`{line}`"
  return (f"`{module}.run(config, workdir)` called from Python (the config "
          "is in results.json)")


SMOKE_NOTE = (
    "**Smoke run.** This report comes from the config's `smoke` sizes (a "
    "tiny model trained for a few steps, a few examples) that check the "
    "code runs end to end. Its numbers are not evidence of anything and it "
    "draws no conclusion; the full run is the same command without "
    "`:smoke`.")

# Each report's conclusions section, from its heading to the next "## "
# heading or the end; a smoke report replaces it.
_CONCLUSIONS = re.compile(
    r"^## What (this shows|the numbers show)\b.*?(?=^## |\Z)", re.M | re.S)
_HEAD = re.compile(r"\bL\d+H\d+\b")


def _framed(report: str, smoke: bool) -> str:
  """`report` with the head-naming note under its title where it names a
  head, and, for a smoke run, the smoke note there and no conclusions."""
  title, _, body = report.partition("\n")
  notes = []
  if smoke:
    notes.append(SMOKE_NOTE)
    body = _CONCLUSIONS.sub(
        "## What this shows\n\nNothing: a smoke run draws no conclusion.\n\n",
        body)
  if _HEAD.search(body):
    notes.append(HEAD_NAMES)
  if not notes:
    return report
  return "\n\n".join([title] + notes) + "\n" + body


def write_outputs(workdir, results: dict, report: str, drop=(), *,
                  config=None, name: str = "report.md") -> dict:
  """Write results.json (every number) and report.md into `workdir`.

  Keys named in `drop` are left out of results.json at any depth (the
  per-example arrays kept only for figures). `config` (the experiment's
  ConfigDict) is saved in results.json under "config" (unless `results`
  has that key already); when its `smoke`
  field is true the report says it is a smoke run and its conclusions
  section ("## What this shows") is left out. A report that names a head
  (L1H3) gets `HEAD_NAMES` under its title. `name` is the report's file
  name. Returns what was written.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  if config is not None and "config" not in results:
    results = {**results, "config": config.to_dict()}
  report = _framed(report, bool(config is not None
                                and config.get("smoke", False)))
  written = _to_json(results, frozenset(drop))
  (workdir / "results.json").write_text(json.dumps(written, indent=1) + "\n")
  (workdir / name).write_text(report.rstrip() + "\n")
  return written


def check_no_arguments(argv) -> None:
  """Entry points take flags only; refuse stray positional arguments."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")


# A report's prose lives in a Markdown template beside its experiment
# (`experiments/<name>/report.md.tmpl`); the experiment's report.py turns
# results.json into the values and `fill` puts them in. The templates are
# `string.Template` text: `$name` or `${name}` is a value, `$$` a dollar
# sign. Values are strings already written with the formats above, so a
# template holds no formatting and no logic: a number's wording that
# depends on its value (better or worse than random) is chosen in code.


def fill(template_path, values: dict) -> str:
  """The template at `template_path` with every `$name` replaced by
  `values[name]`. A name the template uses that `values` lacks, or a value
  the template never uses, is an error naming it, so template and code
  cannot drift apart silently."""
  path = pathlib.Path(template_path)
  template = string.Template(path.read_text())
  used = set(template.get_identifiers())
  missing = sorted(used - values.keys())
  unused = sorted(values.keys() - used)
  if missing or unused:
    raise KeyError(f"{path}: no value for {missing}; values the template "
                   f"does not use: {unused}")
  return template.substitute(values)


def saved_results(results: dict, drop=(), *, config=None) -> dict:
  """What `write_outputs` writes to results.json for these arguments (the
  config under "config"), so a report rendered from it reads exactly what
  a later `regenerate` reads."""
  if config is not None and "config" not in results:
    results = {**results, "config": config.to_dict()}
  return _to_json(results, frozenset(drop))


def write_rendered(workdir, results: dict, render, drop=(), *, config=None,
                   name: str = "report.md", echo: bool = False) -> dict:
  """What every experiment's `write` ends with: `results` as results.json
  saves them (`saved_results`), `render(saved)` as the report, both
  written (`write_outputs`); `echo` prints the report as written. Since
  the report is rendered from the saved form, `regenerate` gives it back
  from results.json. Returns what results.json holds."""
  saved = saved_results(results, drop, config=config)
  written = write_outputs(workdir, saved, render(saved), config=config,
                          name=name)
  if echo:
    print((pathlib.Path(workdir) / name).read_text(), end="")
  return written


def regenerate(folder, render) -> str:
  """report.md rendered again from `folder`'s results.json, as
  `write_outputs` writes it: `render` takes the saved dict (with its
  "config") and returns the report's text."""
  saved = json.loads((pathlib.Path(folder) / "results.json").read_text())
  smoke = bool(saved.get("config", {}).get("smoke", False))
  return _framed(render(saved), smoke).rstrip() + "\n"
