"""One config on one device and on a mesh, reporting: report.md from the
results dict of `run.measure`."""

from __future__ import annotations

import numpy as np

from mha_jax.measure import report as report_lib


def report(r: dict) -> str:
  """The text of report.md, from the results dict `r`."""
  tr, ev, by = r["train"], r["eval"], r["bytes"]
  m = r["mesh"]
  worst = int(np.argmax(tr["abs_diff"]))
  rows = [[s, f"{a:.6f}", f"{b:.6f}", f"{d:.2e}"] for s, a, b, d in zip(
      ev["steps"], ev["loss_one_device"], ev["loss_mesh"], ev["abs_diff"])]
  byte_rows = [[k, v["total"], ", ".join(map(str, v["per_device"])),
                v["split_leaves"], v["split_bytes"],
                v["split_leaves_hold_total_over_model"]]
               for k, v in by.items()]
  return f"""# Same loss curve on one device and on a {m['data']}x{m['model']} mesh

Config `{r['config']}`, {r['steps']} steps, shortened by overrides:

    {r['runs']['one_device']['command']}
    {r['runs']['mesh']['command']}

Train loss, every step: largest |difference| {tr['max_abs_diff']:.2e}
(relative {tr['max_rel_diff']:.2e}) at step {tr['steps'][worst]}; final
parameters differ by at most {r['final_params_max_abs_diff']:.2e}. The runs
are not bit-identical because sharded matmuls sum over heads, MLP width and
batch in another order (per-device partial sums, then an all-reduce).

Eval loss:

{report_lib.md_table(["step", "one device", "mesh", "abs diff"], rows)}

Bytes on each of the {r['devices']} devices (per_device lists the distinct
values; leaves split on "model" must hold total / {m['model']}):

{report_lib.md_table(["tree", "total", "per device", "split leaves",
                  "split bytes", "split leaves hold total/model"],
                 byte_rows)}

Wall time (one device {r['runs']['one_device']['wall_s']:.0f} s, mesh
{r['runs']['mesh']['wall_s']:.0f} s, both including compilation) is not a
speed claim: the eight simulated devices share the same CPU cores.

Command: {report_lib.command("experiments.mesh_check")}.
"""


def write(config, results, workdir) -> dict:
  """report.md and results.json into `workdir` (the report is printed
  too); returns what results.json holds."""
  text = report(results)
  print(text)
  return report_lib.write_outputs(workdir, results, text, config=config)
