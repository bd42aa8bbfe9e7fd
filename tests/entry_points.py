"""Shared by the tests that run entry points in-process.

Entry points define their flags (--config, --workdir, ...) at import, and
absl refuses a flag name that another module already defined. The tests
call an entry point's functions directly and never read its flags, so
before a new entry point is imported the flags of those imported earlier
are dropped.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]


def module_name(name: str) -> str:
  """`experiments.<name>`, or its `__main__` for an experiment folder."""
  folder = ROOT / "experiments" / name
  return f"experiments.{name}.__main__" if folder.is_dir() else (
      f"experiments.{name}")


def load(name: str):
  """The entry point `python -m experiments.<name>` runs, imported."""
  module = module_name(name)
  if module not in sys.modules:
    for flag in list(flags.FLAGS):
      owner = flags.FLAGS.find_module_defining_flag(flag) or ""
      if owner.startswith("experiments."):
        delattr(flags.FLAGS, flag)
  return importlib.import_module(module)


def config(name: str, arg: str = "smoke"):
  """`configs/<name>.py:<arg>` as a ConfigDict."""
  return importlib.import_module(f"configs.{name}").get_config(arg)


def table(report: str, header_start: str) -> list[list[str]]:
  """Cells of the Markdown table whose header row starts `header_start`."""
  lines = report.splitlines()
  for i, line in enumerate(lines):
    if line.startswith(header_start):
      rows = []
      for row in lines[i + 2:]:
        if not row.startswith("|"):
          break
        rows.append([c.strip() for c in row.strip().strip("|").split("|")])
      return rows
  raise AssertionError(f"no table starting {header_start!r} in:\n{report}")


def table_by_label(report: str, header_start: str) -> dict[str, list[str]]:
  """The same table as {first cell: the other cells}."""
  return {row[0]: row[1:] for row in table(report, header_start)}
