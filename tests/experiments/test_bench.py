"""The benchmark's ratios and table, on hand-made timings (no timing runs)."""

import pytest

from experiments.benchmark import bench
from experiments.benchmark import report
from experiments.benchmark import run


def _row(path, fwd_ms, rss=100):
  kind = "anchor" if path in bench.ANCHORS else "ours"
  return {"set": "standard", "path": path, "kind": kind, "B": 8, "n": 512,
          "D": 256, "h": 8, "dtype": "float32", "causal": False,
          "modes": ["fwd"], "fwd_ms": fwd_ms, "fwd_rss": rss}


def test_ratios_divide_by_the_fastest_jax_anchor_never_torch():
  # torch is the fastest here; the anchor must still be the fastest JAX
  # library (jax.nn at 150 ms), and torch gets a ratio of its own.
  rows = [_row("flash", 90.0, rss=50), _row("flax.linen", 200.0),
          _row("jax.nn", 150.0, rss=200), _row("torch", 45.0, rss=999)]
  bench.ratios(rows, ["fwd"])
  by = {r["path"]: r for r in rows}
  assert {r["fwd_anchor"] for r in rows} == {"jax.nn"}
  assert by["flash"]["fwd_x_anchor"] == pytest.approx(0.6)
  assert by["flax.linen"]["fwd_x_anchor"] == pytest.approx(4 / 3)
  assert by["torch"]["fwd_x_anchor"] == pytest.approx(0.3)
  assert by["flash"]["fwd_x_torch"] == pytest.approx(2.0)
  assert by["torch"]["fwd_x_torch"] == pytest.approx(1.0)
  assert by["flash"]["fwd_rss_x_anchor"] == pytest.approx(0.25)
  # torch ran in the parent process: no RSS ratio for it.
  assert "fwd_rss_x_anchor" not in by["torch"]


def test_ratios_without_torch_or_with_skipped_rows():
  rows = [_row("flash", 60.0), _row("flax.nnx", 120.0),
          {**_row("jax.nn", 1.0), "fwd_ms": None}]
  del rows[2]["fwd_ms"]  # a skipped anchor has no time and no ratio
  rows[2]["skipped"] = "needs a GPU"
  bench.ratios(rows, ["fwd"])
  assert rows[0]["fwd_x_anchor"] == pytest.approx(0.5)
  assert rows[0]["fwd_anchor"] == "flax.nnx"
  assert not any("fwd_x_torch" in r for r in rows)
  assert "fwd_x_anchor" not in rows[2]


def _header(table):
  return next(l for l in table.splitlines() if l.startswith("| path |"))


def test_table_has_a_torch_column_only_when_torch_was_timed():
  with_torch = bench.ratios([_row("flash", 90.0), _row("jax.nn", 150.0),
                             _row("torch", 45.0)], ["fwd"])
  table = report.shape_tables(with_torch)
  cols = [c.strip() for c in _header(table).strip("|").split("|")]
  flash = next(l for l in table.splitlines() if l.startswith("| flash |"))
  cells = [c.strip() for c in flash.strip("|").split("|")]
  assert cells[cols.index("fwd x anchor")] == "0.60"
  assert cells[cols.index("fwd x torch")] == "2.00"
  without = bench.ratios([_row("flash", 90.0), _row("jax.nn", 150.0)],
                         ["fwd"])
  assert "x torch" not in _header(report.shape_tables(without))



def test_window_scaling_is_saved_by_the_run_and_read_by_the_table():
  def window(path, n, ms, rss):
    return {**_row(path, None), "set": "window", "n": n, "modes": ["fwdbwd"],
            "fwdbwd_ms": ms, "fwdbwd_rss": rss}
  rows = [window("flash", 1024, 10.0, 100), window("flash", 4096, 60.0, 150),
          window("einsum", 1024, 10.0, 100)]  # one length: no ratio
  scaling = run.window_scaling(rows)
  assert [w["path"] for w in scaling] == ["flash"]
  assert scaling[0]["time_x_linear"] == pytest.approx(1.5)
  assert scaling[0]["rss_growth"] == pytest.approx(1.5)
  assert ("- flash: fwd+bwd at n=4096 is 1.50x its n=1024 time scaled by 4 "
          "(1.00 = linear in n); peak RSS grew 1.50x.") in (
              report.window_scaling(scaling))
  assert report.window_scaling([]) == ""
