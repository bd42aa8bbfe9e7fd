"""Reports rendered from results.json through their Markdown templates.

Known answers: the committed reports. Each experiment below renders its
committed docs/results/<name>/results.json through its template, and the
text must equal the committed report.md byte for byte.
"""

import functools
import importlib
import inspect
import json
import pathlib

import pytest

from mha_jax.measure import report

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The experiments whose prose is a template beside their report.py and
# whose report is committed under docs/results.
TEMPLATED = tuple(sorted(
    p.parent.name for p in (ROOT / "experiments").glob("*/report.md.tmpl")
    if (ROOT / "docs" / "results" / p.parent.name / "report.md").exists()))


def test_fill_puts_each_value_in_its_place(tmp_path):
  path = tmp_path / "report.md.tmpl"
  path.write_text("# $title\n\nLoss ${loss}s, $$5 a seed.\n")
  assert report.fill(path, {"title": "Pruning", "loss": "0.123"}) == (
      "# Pruning\n\nLoss 0.123s, $5 a seed.\n")


def test_fill_names_a_missing_and_an_unused_value(tmp_path):
  path = tmp_path / "report.md.tmpl"
  path.write_text("$a and $b\n")
  with pytest.raises(KeyError, match=r"no value for \['b'\]"):
    report.fill(path, {"a": "1"})
  with pytest.raises(KeyError, match=r"does not use: \['c'\]"):
    report.fill(path, {"a": "1", "b": "2", "c": "3"})


@pytest.mark.parametrize("name", TEMPLATED)
def test_committed_report_regenerates_from_its_results(name):
  # results.json does not hold the command line; the committed reports ran
  # with the Makefile's `--workdir=runs/<name>`, passed to the reports that
  # name their command.
  module = importlib.import_module(f"experiments.{name}.report")
  render = module.render
  if "command" in inspect.signature(render).parameters:
    render = functools.partial(render, command=report.command_line(
        ["", f"--workdir=runs/{name}"], f"experiments.{name}"))
  folder = ROOT / "docs" / "results" / name
  assert report.regenerate(folder, render) == (
      folder / "report.md").read_text()


@pytest.mark.parametrize("name", ["benchmark", "real_lm_bench",
                                  "score_rules_bench"])
def test_the_runs_beside_the_first_regenerate(name):
  """A benchmark's folder holds further runs in folders of their own
  (other CPUs; the same CPU with XLA and torch held to AVX2; a later run
  with the roofline); their reports regenerate from their results.json
  too (a run from before the roofline says it was not measured). A
  report that names its command ran with the Makefile's, as the first."""
  render = importlib.import_module(f"experiments.{name}.report").render
  if "command" in inspect.signature(render).parameters:
    render = functools.partial(render, command=report.command_line(
        ["", f"--workdir=runs/{name}"], f"experiments.{name}"))
  folders = sorted(p.parent for p in (ROOT / "docs" / "results" /
                                      name).glob("*/report.md"))
  assert folders, f"docs/results/{name} holds no second run"
  for folder in folders:
    assert report.regenerate(folder, render) == (
        folder / "report.md").read_text()


def test_every_committed_report_has_a_template():
  committed = {p.parent.name for p in (ROOT / "docs" / "results").glob(
      "*/report.md")}
  assert committed == set(TEMPLATED), sorted(committed ^ set(TEMPLATED))


def test_reports_in_one_process_name_their_own_commands():
  # The command is an argument of each render, so one report rendered with
  # a command leaves nothing behind for the next: two experiments' reports,
  # then a run called from Python, each name their own.
  texts = {}
  for name, line in (("pruning", "--workdir=runs/a"),
                     ("induction", "--workdir=runs/b"), ("pruning", None)):
    module = importlib.import_module(f"experiments.{name}.report")
    saved = json.loads(
        (ROOT / "docs" / "results" / name / "results.json").read_text())
    command = line and report.command_line(["", line], f"experiments.{name}")
    texts[name, line] = module.render(saved, command=command)
  a = "`.venv/bin/python -m experiments.pruning --workdir=runs/a`"
  b = "`.venv/bin/python -m experiments.induction --workdir=runs/b`"
  python = "`experiments.pruning.run(config, workdir)` called from Python"
  assert a in texts["pruning", "--workdir=runs/a"]
  assert b in texts["induction", "--workdir=runs/b"]
  assert python in texts["pruning", None]
  for text in texts.values():
    assert sum(c in text for c in (a, b, python)) == 1
