"""Context parallelism, reporting: report.md from the results dict of
`run.measure`."""

from __future__ import annotations

from mha_jax.measure import report as report_lib

MIB = 2.0 ** 20


def _mib(x) -> str:
  return f"{x / MIB:,.1f}"


def report(r: dict) -> str:
  """The text of report.md, from the results dict `r`."""
  m, n = r["memory"], r["devices"]
  rows = [[name, _mib(m["one_device"][name]),
           _mib(m["ring_per_device"][name])]
          for name in ("argument", "output", "temp", "alias", "peak")]
  text = f"""# Context parallelism: memory per device, and a long sequence

Command: {report_lib.command("experiments.context_parallel")} (config
`configs/context_parallel.py`).

Causal attention forward+backward, B = 1, H = K = {m['heads']}, Dh =
{m['head_dim']}, float32, blocks of {r['block']}; the ring on a sequence
axis of {n} simulated CPU devices, layout "{r['layout']}".

## Memory at n = {m['tokens']}

XLA's memory analysis of the compiled programs (MiB; the ring's figures
are one device's program, every device runs the same):

{report_lib.md_table(["", "one device", f"ring, per device of {n}"], rows)}

Per-device peak / one-device peak: {m['ratio']:.3f} (1/{n} would be
{1 / n:.3f}; the rest is the travelling key/value slice and its
gradients, in flight twice during a send).
"""
  if "long" in r:
    g = r["long"]
    per = g["per_device"]["peak"]
    text += f"""
## The long run: n = {g['tokens']}, H = K = {g['heads']}, Dh = {g['head_dim']}

One forward+backward through the ring: {g['run_s']:.0f} s (after
{g['compile_s']:.0f} s compiling; {n} simulated devices share 2 CPU
cores, so this is no speed claim), gradients finite: {g['finite']}.
Compiled peak per device {_mib(per)} MiB, {_mib(per * n)} MiB for the
{n}; the process's peak resident memory {_mib(g['process_peak_rss'])} MiB.
"""
  return text


def write(config, results, workdir) -> dict:
  """report.md and results.json into `workdir` (the report is printed
  too); returns what results.json holds."""
  text = report(results)
  print(text)
  return report_lib.write_outputs(workdir, results, text, config=config)
