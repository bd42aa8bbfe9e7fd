"""The report cells, on hand-picked numbers whose cells are written out."""

import math

import pytest

from mha_jax.measure import report
from mha_jax.measure import stats


def test_mean_std_cell():
  assert report.fmt(0.12345, 0.00449) == "0.123 ± 0.004"
  assert report.fmt(0.12345) == "0.123"
  assert report.fmt(512.0, 37.6, digits=0) == "512 ± 38"


def test_interval_cell():
  assert report.interval((0.12, 0.1314)) == "[0.120, 0.131]"
  assert report.interval(None) == "n/a"
  assert report.interval((1e-4, 2.5e-3), spec=".3g") == "[0.0001, 0.0025]"


def test_summary_cell_of_a_known_sample():
  # values 1, 2, 3: mean 2, sample std 1, t(0.975, 2) = 4.303, so the
  # interval is 2 -+ 4.303 / sqrt(3) = [-0.484, 4.484].
  summ = stats.summary([1.0, 2.0, 3.0])
  assert report.summary(summ) == "2.000 ± 1.000 [-0.484, 4.484]"
  assert report.summary(summ, spec=".3g", std_spec=".2g") == (
      "2 ± 1 [-0.484, 4.48]")
  assert report.summary(stats.summary([0.5])) == "0.500"


def test_difference_cell():
  d = {"diff": 0.05, "ci95": (0.01, 0.09)}
  assert report.difference(d) == "+0.050 [+0.010, +0.090]"
  assert report.difference(d, interval_spec=".3f") == "+0.050 [0.010, 0.090]"
  assert report.difference({"diff": -0.05, "ci95": None}) == "-0.050 (n/a)"
  assert report.difference({"diff": 3.0, "ci95": None}, spec="+.3g",
                           missing="(one seed)") == "+3 (one seed)"


@pytest.mark.parametrize("fraction, kwargs, cell", [
    (0.25, {}, "25.0%"), (0.25, {"signed": True}, "+25.0%"),
    (-0.0123, {"digits": 2, "signed": True}, "-1.23%"),
    (1 / 3, {"digits": 0}, "33%")])
def test_percent_cell(fraction, kwargs, cell):
  assert report.percent(fraction, **kwargs) == cell


def test_md_table():
  assert report.md_table(["a", "b"], [[1, math.pi]]) == (
      "| a | b |\n|---|---|\n| 1 | 3.141592653589793 |")


def test_bare_number_cells():
  assert report.signed(0.1234) == "+0.123"
  assert report.signed(-0.126, 2) == "-0.13"
  assert report.significant(0.000123456) == "0.000123"
  assert report.scientific(1.234e-4, 4.5e-5) == "1.23e-04 ± 4.5e-05"
  assert report.scientific(1.234e-4) == "1.23e-04"


def test_wall_time_sentence():
  assert report.wall_time(90.0, reused=False) == "1.5 min wall on this machine"
  assert report.wall_time(30.0, reused=True) == (
      "0.5 min wall on this machine, analysis only: finished runs were "
      "reused")


# What a reader sees: head names, the command that ran, smoke runs.


def test_head_names_count_from_zero_like_the_hook_sites():
  # L1H3 is what `hooks` calls blocks.1 with heads=3 (TransformerLens's
  # spelling); numpy integers print as plain ones.
  import numpy as np  # pylint: disable=g-import-not-at-top
  assert report.head_name(1, 3) == "L1H3"
  assert report.head_name(np.int64(0), np.int64(0)) == "L0H0"
  assert "L1H3" in report.HEAD_NAMES and "blocks.1" in report.HEAD_NAMES
  assert "heads=3" in report.HEAD_NAMES


def _config(smoke):
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict({"smoke": smoke, "train": {"steps": 6}})


_TEXT = ("# Title\n\nCommand: x.\n\n| head | score |\n|---|---|\n"
         "| L0H1 | 0.5 |\n\n## What this shows\n\n* Heads form.\n")
# A conclusions section followed by another one.
_MIDDLE = ("# T\n\n## What this shows, next to the claim\n\n* Yes.\n\n"
           "## Every head\n\n| L0H0 | 1 |\n")


def test_smoke_report_says_so_and_draws_no_conclusion(tmp_path):
  written = report.write_outputs(tmp_path, {"a": 1}, _TEXT,
                                 config=_config(True))
  text = (tmp_path / "report.md").read_text()
  assert text.splitlines()[0] == "# Title"
  assert report.SMOKE_NOTE in text and report.HEAD_NAMES in text
  assert "Heads form" not in text
  assert text.rstrip().endswith("Nothing: a smoke run draws no conclusion.")
  assert "| L0H1 | 0.5 |" in text  # the numbers stay
  assert written["config"] == {"smoke": True, "train": {"steps": 6}}


def test_smoke_report_keeps_the_sections_after_the_conclusions(tmp_path):
  report.write_outputs(tmp_path, {}, _MIDDLE, config=_config(True))
  text = (tmp_path / "report.md").read_text()
  assert "* Yes." not in text
  assert text.endswith("## What this shows\n\nNothing: a smoke run draws no "
                       "conclusion.\n\n## Every head\n\n| L0H0 | 1 |\n")


def test_full_report_keeps_its_conclusions(tmp_path):
  report.write_outputs(tmp_path, {}, _TEXT, config=_config(False))
  text = (tmp_path / "report.md").read_text()
  assert report.SMOKE_NOTE not in text and "* Heads form." in text
  # No head named, no naming note.
  report.write_outputs(tmp_path, {}, "# T\n\nno heads here\n")
  assert (tmp_path / "report.md").read_text() == "# T\n\nno heads here\n"


def test_command_is_the_one_given():
  assert report.command("experiments.induction") == (
      "`experiments.induction.run(config, workdir)` called from Python (the "
      "config is in results.json)")
  line = report.command_line(["/x/__main__.py", "--workdir=runs/a b",
                              "--config=configs/induction.py:smoke"],
                             "experiments.induction")
  assert report.command("experiments.induction", line) == (
      "`.venv/bin/python -m experiments.induction '--workdir=runs/a b' "
      "--config=configs/induction.py:smoke`")
