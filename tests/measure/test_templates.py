"""Reports rendered from results.json through their Markdown templates.

Known answers: the committed reports. Each experiment below renders its
committed docs/results/<name>/results.json through its template, and the
text must equal the committed report.md byte for byte.
"""

import importlib
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
def test_committed_report_regenerates_from_its_results(name, monkeypatch):
  # results.json does not hold the command line; the committed reports ran
  # with the Makefile's `--workdir=runs/<name>`.
  monkeypatch.setattr(report, "_command", None)
  report.record_command(["", f"--workdir=runs/{name}"], f"experiments.{name}")
  module = importlib.import_module(f"experiments.{name}.report")
  folder = ROOT / "docs" / "results" / name
  assert report.regenerate(folder, module.render) == (
      folder / "report.md").read_text()


def test_every_committed_report_has_a_template():
  committed = {p.parent.name for p in (ROOT / "docs" / "results").glob(
      "*/report.md")}
  assert committed == set(TEMPLATED), sorted(committed ^ set(TEMPLATED))
