"""One config on one device and on a mesh, reporting: report.md from the
results dict of `run.measure`.

The prose is report.md.tmpl beside this file; `render` fills it from
results.json alone.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """report.md and results.json into `workdir` (the report is printed
  too); returns what results.json holds."""
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command),
      config=config, echo=True)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`), naming `command`
  (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _eval_table(ev) -> str:
  """Eval loss of both runs at every logged step, and their difference."""
  rows = [[s, f"{a:.6f}", f"{b:.6f}", f"{d:.2e}"] for s, a, b, d in zip(
      ev["steps"], ev["loss_one_device"], ev["loss_mesh"], ev["abs_diff"])]
  return report_lib.md_table(["step", "one device", "mesh", "abs diff"], rows)


def _bytes_table(by) -> str:
  """Parameter and optimizer bytes: total, per device, split leaves."""
  rows = [[k, v["total"], ", ".join(map(str, v["per_device"])),
           v["split_leaves"], v["split_bytes"],
           v["split_leaves_hold_total_over_model"]]
          for k, v in by.items()]
  return report_lib.md_table(
      ["tree", "total", "per device", "split leaves", "split bytes",
       "split leaves hold total/model"], rows)


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  tr, runs, m = saved["train"], saved["runs"], saved["mesh"]
  return {
      "data": m["data"],
      "model": m["model"],
      "config": saved["config"],
      "steps": saved["steps"],
      "one_device_command": runs["one_device"]["command"],
      "mesh_command": runs["mesh"]["command"],
      "max_abs_diff": f"{tr['max_abs_diff']:.2e}",
      "max_rel_diff": f"{tr['max_rel_diff']:.2e}",
      "worst_step": tr["steps"][int(np.argmax(tr["abs_diff"]))],
      "params_diff": f"{saved['final_params_max_abs_diff']:.2e}",
      "eval_table": _eval_table(saved["eval"]),
      "devices": saved["devices"],
      "bytes_table": _bytes_table(saved["bytes"]),
      "one_device_wall": f"{runs['one_device']['wall_s']:.0f}",
      "mesh_wall": f"{runs['mesh']['wall_s']:.0f}",
      "command": report_lib.command("experiments.mesh_check", command),
  }
