"""Every experiment entry point, end to end on its smoke config.

Each test runs an entry point's `run` in-process on its config's smoke
variant (`configs/<name>.py:smoke`: a tiny model, a handful of steps, one
or two seeds) with a temporary workdir, then checks what a reader gets:
report.md, results.json and the figures exist, and the report's tables
show the numbers that results.json holds. mesh_check runs as its real
command line: its second training run needs simulated devices, which exist
only in a process started with XLA_FLAGS.

The smoke models share shapes where they can (induction, pruning, train,
kv_behaviour), so in one process they reuse compiled programs.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

import numpy as np
import pytest

from experiments.circuits import survey as circuit_survey
from mha_jax.measure import report as report_lib

import entry_points

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _outputs(workdir, figures, report="report.md"):
  """report.md text and results.json (which must equal what `run` returned
  is checked by the caller); every figure must be a PNG."""
  workdir = pathlib.Path(workdir)
  for name in figures:
    assert (workdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
  return ((workdir / report).read_text(),
          json.loads((workdir / "results.json").read_text()))


def _row(rows, first_cell):
  matches = [r for r in rows if r[0] == str(first_cell)]
  assert len(matches) == 1, (first_cell, rows)
  return matches[0]


def _explorer_page(workdir, report) -> dict:
  """The explorer page the report links, as the page's script reads it
  ("title", "info" pairs, one entry per attention kind in "kinds")."""
  assert "[explorer.html](explorer.html)" in report
  text = (pathlib.Path(workdir) / "explorer.html").read_text()
  found = re.search(r'<script type="application/json" id="data">(.*?)'
                    r"</script>", text, re.S)
  assert found, "explorer.html holds no page data"
  return json.loads(found.group(1))


def _page_eval(page) -> dict:
  """{metric: value} the page states for its batch (4 decimals)."""
  text = dict(page["info"])["loss on the batch"]
  return {k: float(v) for k, v in (p.split() for p in text.split(" | "))}


def _explore_command_run(workdir, report, experiment):
  """The run folder a report's `experiments.explore` command names: it
  must be one of this workdir's runs."""
  found = re.search(rf"--workdir=runs/{experiment}/(\S+) --batch_from_task",
                    report)
  assert found, report
  assert (pathlib.Path(workdir) / found.group(1) / "config.json").is_file()
  return found.group(1)


def test_induction(tmp_path):
  config = entry_points.config("induction")
  results = entry_points.load("induction").run(config, tmp_path)
  report, saved = _outputs(tmp_path, ["loss_curves.png", "attention.png",
                                      "head_metrics.png", "ablation.png"])
  assert saved == results
  deep, ctrl = results["summary"]["L2"], results["summary"]["L1"]
  # Two smoke seeds: every number has a sample std and a t interval.
  loss = deep["final_loss"]
  values = [results["runs"][f"L2_seed{s}"]["eval"]["loss"] for s in (0, 1)]
  assert loss["values"] == values
  assert loss["std"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5)
  summary = entry_points.table(report, "| model | final loss |")
  assert _row(summary, "2-layer")[1] == (
      f"{loss['mean']:.3f} ± {loss['std']:.3f} "
      f"[{loss['ci95'][0]:.3f}, {loss['ci95'][1]:.3f}]")
  assert _row(summary, "1-layer")[3] == report_lib.fmt(
      ctrl["init_loss"]["mean"], ctrl["init_loss"]["std"])
  run = results["runs"]["L2_seed0"]
  # Floors: uniform attention on the run's own held-out batch, and the
  # untrained model; the 1-layer model has no across-layer pairs.
  floors = entry_points.table(report, "| score | 2-layer trained |")
  ind = _row(floors, "best last-layer induction score")
  assert ind[-1] == report_lib.fmt(deep["uniform_induction"]["mean"],
                               deep["uniform_induction"]["std"], 2)
  assert _row(floors, "JS distance, heads across layers")[3:5] == ["-", "-"]
  pc = run["phase_change"]
  per_run = entry_points.table(report, "| layers | seed | loss |")
  assert per_run[0][:5] == [
      "2", "0", f"{run['eval']['loss']:.3f}", f"{run['eval']['accuracy']:.3f}",
      f"{pc['from_step']}→{pc['to_step']}: {pc['loss_before']:.2f}→"
      f"{pc['loss_after']:.2f}"]
  # The curve is the run's own eval metrics, at steps 3 and 6.
  rows = [json.loads(l) for l in
          (tmp_path / "L2_seed0" / "metrics.jsonl").read_text().splitlines()]
  assert run["curve"] == {"steps": [3, 6], "loss": [
      r["loss"] for r in rows if r["split"] == "eval"]}
  heads = entry_points.table(report, "| head | previous_token |")
  assert len(heads) == 2 * config.model.num_heads + 2  # L * H + 2 floors
  lo, hi = run["intervals"]["induction"][1][0]
  assert _row(heads, "L1H0")[2] == (
      f"{run['metrics']['induction'][1][0]:.2f} [{lo:.2f}, {hi:.2f}]")
  assert _row(heads, "uniform causal")[2] == (
      f"{run['floors']['uniform']['induction']:.2f}")
  assert "weights_example" not in run  # per-example arrays stay out
  # The report links a browser page of the first 2-layer model.
  assert "[explorer.html](explorer.html)" in report
  assert "<html" in (tmp_path / "explorer.html").read_text()[:200].lower()


def _check_nmse_table(report, sweep, summary, selection):
  """The two-offset sweep's tables: one row per setting, NMSE mean ± sample
  std [95% interval] of the per-seed values results.json holds, and each
  setting's learning-rate choice."""
  from mha_jax.measure import stats  # pylint: disable=g-import-not-at-top
  from experiments import offset_sweep_report  # pylint: disable=g-import-not-at-top
  rows = entry_points.table(report, "| setting | NMSE |")
  assert [r[0] for r in rows] == list(sweep)
  for label, runs in sweep.items():
    nmse = [r["nmse"] for r in runs]
    assert summary[label]["nmse"]["values"] == nmse
    assert _row(rows, label)[1] == offset_sweep_report.summary_cell(
        stats.summary(nmse))
    # NMSE is the held-out MSE over the targets' variance, exactly 1.
    np.testing.assert_allclose(runs[0]["nmse"], runs[0]["loss"], rtol=1e-12)
    # Every reported run trained at the rate its setting chose.
    assert {r["learning_rate"] for r in runs} == {selection[label]["chosen"]}
    assert runs[0]["curve"]["steps"] == [3, 6]
  chosen = entry_points.table(report, "| setting | NMSE per learning rate |")
  assert [r[0] for r in chosen] == list(sweep)
  assert [r[2] for r in chosen] == [
      f"{selection[k]['chosen']:g}" for k in sweep]


def test_two_offsets(tmp_path):
  results = entry_points.load("two_offsets").run(entry_points.config("two_offsets"), tmp_path)
  report, saved = _outputs(tmp_path, ["nmse_vs_heads.png", "nmse_curves.png",
                                      "attention.png"])
  assert saved == results
  # A smoke config's report says it is one and concludes nothing.
  assert results["config"]["smoke"] is True
  assert report_lib.SMOKE_NOTE in report
  assert report.rstrip().endswith("Nothing: a smoke run draws no conclusion.")
  summary = results["summary"]
  _check_nmse_table(report, results["continuous"], summary["continuous"],
                    results["selection"])
  # The single-head controls: a wider model and an added MLP.
  assert list(results["continuous"]) == [
      "h=1", "h=2", "h=1, d_model=16 (d_k=16)", "h=1 + MLP (F=32)"]
  d = summary["continuous_vs_h1"]["h=2"]
  cont = entry_points.table(report, "| setting | NMSE |")
  assert _row(cont, "h=2")[2] == (
      f"{d['diff']:+.3g} [{d['ci95'][0]:+.3g}, {d['ci95'][1]:+.3g}]")
  tok = entry_points.table(report, "| setting | accuracy |")
  acc = summary["token"]["h=2"]["accuracy"]
  assert acc["values"] == [r["accuracy"] for r in results["token"]["h=2"]]
  assert _row(tok, "h=2")[1] == report_lib.fmt(acc["mean"], acc["std"])
  # The browser page: the h=2 continuous model of seed 0 on the batch of
  # its table row (the same loss), positions as labels.
  page = _explorer_page(tmp_path, report)
  assert page["title"] == ("Two offsets, continuous task: one layer, h=2, "
                           "seed 0")
  (kind,) = page["kinds"]
  assert (kind["num_layers"], kind["num_heads"]) == (1, 2)
  assert kind["query_labels"][:2] == ["@0", "@1"]
  assert _page_eval(page)["loss"] == pytest.approx(
      results["continuous"]["h=2"][0]["loss"], abs=1e-4)
  assert _explore_command_run(tmp_path, report, "two_offsets") == (
      "two_offset_token_h_2_s0")


def test_head_dim(tmp_path):
  config = entry_points.config("head_dim")
  results = entry_points.load("head_dim").run(config, tmp_path)
  report, saved = _outputs(tmp_path, ["nmse_vs_dk.png", "nmse_curves.png",
                                      "low_rank_fit.png"])
  assert saved == results
  _check_nmse_table(report, results["part_a"], results["part_a_summary"],
                    results["part_a_selection"])
  rows = entry_points.table(report, "| setting | NMSE |")
  for label, s in results["part_a_summary"].items():
    first = s["first_step_below_threshold"]["per_seed"]
    assert _row(rows, label)[-1] == ", ".join(
        "-" if f is None else str(f) for f in first)
  part_b = entry_points.table(report, "| d_k | mean KL (nats) |")
  fit = results["part_b"]
  assert [int(r[0]) for r in part_b] == fit["d_k"] == list(
      range(1, config.experiment.fit_n + 1))
  for row, kl, err in zip(part_b, fit["kl"], fit["max_error"]):
    m, s = report_lib.mean_std(kl)
    assert row[1:] == [f"{m:.2e} ± {s:.1e}", f"{np.mean(err):.3f}"]
  # The browser page: the narrowest heads (h=2, d_k=4 here), seed 0, on
  # the batch of their table row.
  page = _explorer_page(tmp_path, report)
  assert page["title"] == "Head width: one layer, h=2 (d_k=4), seed 0"
  (kind,) = page["kinds"]
  assert kind["num_heads"] == max(config.experiment.heads) == 2
  assert _page_eval(page)["loss"] == pytest.approx(
      results["part_a"]["h=2 (d_k=4)"][0]["loss"], abs=1e-4)


def test_cross_attention(tmp_path):
  results = entry_points.load("cross_attention").run(entry_points.config("cross_attention"),
                                                tmp_path)
  report, saved = _outputs(tmp_path, ["cross_attention.png",
                                      "cross_heads.png"])
  assert saved == results
  run = results["runs"][0]
  assert "cross_example" not in run
  seeds = entry_points.table(report, "| seed | loss |")
  assert seeds[0][:3] == ["0", f"{run['loss']:.3f}", f"{run['accuracy']:.3f}"]
  heads = entry_points.table(report, "| head | alignment accuracy |")
  acc, zero = run["alignment_accuracy"], run["importance"]["zero_ablation"]
  near = run["alignment_mass_within_1"]
  assert len(heads) == len(acc) * len(acc[0]) + 2  # + two floor rows
  assert _row(heads, "L0H1")[1:5:3] == [f"{acc[0][1]:.2f}",
                                         f"{zero[0][1]:+.3f}"]
  assert _row(heads, "L0H1")[3] == f"{near[0][1]:.2f}"
  assert all(0.0 <= a <= 1.0 for layer in acc for a in layer)
  # The weight within +-1 of the target includes the weight on it.
  assert all(n >= m - 1e-6 for ln, lm in zip(near, run["alignment_mass"])
             for n, m in zip(ln, lm))
  uni = run["floors"]["uniform"]
  assert _row(heads, "uniform over the source")[1] == (
      f"{uni['accuracy']:.2f}")
  assert (tmp_path / "explorer.html").exists()


def test_pruning(tmp_path):
  config = entry_points.config("pruning")
  results = entry_points.load("pruning").run(config, tmp_path)
  report, saved = _outputs(tmp_path, ["prune_curve.png"])
  assert saved == results
  n_heads = config.model.num_layers * config.model.num_heads
  assert results["heads_kept"] == list(range(n_heads, -1, -1))
  rows = entry_points.table(report, "| heads kept |")
  assert [int(r[0]) for r in rows] == results["heads_kept"]
  mean, std = results["mean"], results["std"]
  # Columns follow the curves' order; check the first and last ones.
  for col, key in ((1, "zero_ablation"), (-1, "most_important_first")):
    assert [r[col] for r in rows] == [
        report_lib.fmt(m, s, digits=2) for m, s in zip(mean[key], std[key])]
  # With every head kept, each ranking measures the same full model.
  assert len({round(v[0], 6) for v in mean.values()}) == 1
  # Per seed, two removed: the Taylor ranking against random order, the
  # difference and its Welch interval as the comparison table shows them.
  taylor = np.asarray(results["curves"]["taylor_estimate"])[:, 2]
  rand = np.asarray(results["curves"]["random"])[:, 2]
  d = results["two_removed_minus_random"]["taylor_estimate"]
  assert d["diff"] == pytest.approx(taylor.mean() - rand.mean())
  cells = _row(entry_points.table(report, "| ranking |"), "taylor estimate")
  assert cells[2].startswith(f"{d['diff']:+.2f} nats, 95% interval "
                             f"[{d['ci95'][0]:.2f}, {d['ci95'][1]:.2f}]")


def test_train_then_generate(tmp_path, capsys):
  """experiments.train on a smoke config, then experiments.generate on the
  trained run (what `generate` needs: a finished run's workdir)."""
  config = entry_points.config("induction")
  state = entry_points.load("train").run(config, tmp_path)
  assert int(state.step) == config.train.num_steps
  assert (json.loads((tmp_path / "config.json").read_text())
          == json.loads(config.to_json_best_effort()))
  rows = [json.loads(l) for l in
          (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["split"] == "eval"] == [3, 6]
  assert (tmp_path / "checkpoints" / "6").is_dir()

  res = entry_points.load("generate").run(tmp_path, num_examples=8, show=2)
  printed = capsys.readouterr().out
  assert res["step"] == 6 and "checkpoint at step 6" in printed
  valid = np.arange(res["tokens"].shape[1])[None] < res["counts"][:, None]
  hits = ((res["tokens"] == res["expected"]) & valid).sum()
  assert res["token_accuracy"] == hits / valid.sum()
  assert (f"token accuracy {res['token_accuracy']:.4f}, whole continuation "
          f"correct {res['sequence_accuracy']:.4f}") in printed
  assert printed.count("expected:") == 2


def test_kv_behaviour_then_kv_cache(tmp_path):
  """kv_behaviour, then kv_cache with its results as --behaviour_results."""
  config = entry_points.config("kv_behaviour")
  behaviour = entry_points.load("kv_behaviour").run(config, tmp_path / "behaviour")
  report, saved = _outputs(tmp_path / "behaviour",
                           ["time_to_drop.png", "time_to_drop_per_seed.png",
                            "loss_curves.png"])
  assert saved == behaviour
  table = entry_points.table(report, "| variant | K |")
  assert table == [[str(c) for c in r.values()] for r in behaviour["runs"]]
  variants = behaviour["variants"]
  mha, mqa = variants  # the smoke config trains MHA and the matched MQA
  assert [r[0] for r in table] == ["MHA", mqa["name"]]
  assert mqa["matched"] and mqa["num_kv_heads"] == 1
  assert mqa["name"] == f"MQA, Dh={mqa['head_dim']} (params matched)"
  # The widened heads bring the shared-kv model near MHA's count; the
  # cache stays smaller.
  assert abs(mqa["params"] - mha["params"]) < 0.1 * mha["params"]
  assert mqa["cache_bytes_per_token"] < mha["cache_bytes_per_token"]
  for v in variants:
    losses = [behaviour["per_seed"][f"{v['key']}_seed{s}"]["eval_loss"]
              for s in config.experiment.seeds]
    loss = v["eval_loss"]
    assert loss["values"] == losses
    assert loss["std"] == pytest.approx(np.std(losses, ddof=1))
    assert _row(table, v["name"])[6] == (
        f"{loss['mean']:.3f} ± {loss['std']:.3f} "
        f"[{loss['ci95'][0]:.3f}, {loss['ci95'][1]:.3f}]")
    # One schedule, evaluated at steps 3 and 6: the time to drop is read
    # from the same curve.
    curve = behaviour["per_seed"][f"{v['key']}_seed0"]["curve"]
    assert curve["steps"] == [3, 6] and curve["loss"][-1] == losses[0]
  d = behaviour["comparisons"][0]["eval_loss"]
  assert d["diff"] == pytest.approx(mqa["eval_loss"]["mean"]
                                    - mha["eval_loss"]["mean"])
  versus = entry_points.table(report, "| variant | reference |")
  assert _row(versus, mqa["name"])[3] == (
      f"{d['diff']:+.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]")
  per_seed = entry_points.table(report, "| variant | seed 0 |")
  assert _row(per_seed, "MHA")[1:] == [
      "-" if f is None else str(f)
      for f in mha["time_to_drop"]["per_seed"]]
  finals = entry_points.table(report, "| variant | seed 0 final |")
  assert _row(finals, "MHA")[1:] == [
      f"{loss:.3f} ({acc:.3f})" for loss, acc in zip(
          mha["eval_loss"]["values"],
          mha["generation_token_accuracy"]["values"])]
  # The browser page: MHA, seed 0, on the sequences its generation prompts
  # are cut from, so its accuracy is the teacher-forced one.
  page = _explorer_page(tmp_path / "behaviour", report)
  assert page["title"].startswith("MHA (") and page["title"].endswith(
      ", seed 0")
  (kind,) = page["kinds"]
  assert kind["num_heads"] == config.model.num_heads
  assert _page_eval(page)["accuracy"] == pytest.approx(
      behaviour["per_seed"][f"{mha['key']}_seed0"]["teacher_forced_accuracy"],
      abs=1e-4)
  assert _explore_command_run(tmp_path / "behaviour", report,
                              "kv_behaviour") == f"{mqa['key']}_seed0"

  cfg = entry_points.config("kv_cache")
  workdir = tmp_path / "kv_cache"
  results = entry_points.load("kv_cache").run(cfg, workdir, behaviour=json.loads(
      (tmp_path / "behaviour" / "results.json").read_text()))
  report, saved = _outputs(workdir, ["decode_time.png", "flops.png",
                                     "cache_bytes.png"])
  assert saved == results
  timing = entry_points.table(report, "| n | cached ms (min) |")
  assert [int(r[0]) for r in timing] == list(cfg.bench.contexts)
  for row, r in zip(timing, results["timing"]):
    assert row[1] == (f"{1e3 * r['cached_s']:.3f} "
                      f"({1e3 * r['cached_min_s']:.3f})")
    assert row[6] == f"{r['cached_analytic_flops']:.4g}"
  memory = entry_points.table(report, "| K (kv heads) |")
  mha, mqa = results["cache_bytes"]
  assert _row(memory, 1)[4] == f"{mqa['fraction_of_first']:.4f}" == "0.5000"
  assert _row(memory, 2)[1] == f"{mha['bytes_per_token']:.0f}"
  # The behaviour section shows kv_behaviour's rows, and the answer quotes
  # its numbers.
  assert entry_points.table(report, "| variant | K |") == table
  assert f"{behaviour['variants'][1]['name']} (K=1): loss" in report
  lo, hi = behaviour["comparisons"][0]["eval_loss"]["ci95"]
  assert f"95% interval [{lo:+.3f}, {hi:+.3f}]" in report
  assert all(v < 1e-4 for v in results["exactness_max_rel_err"].values())


def test_cost_scaling(tmp_path):
  config = entry_points.config("cost_scaling")
  results = entry_points.load("cost_scaling").run(config, tmp_path)
  report, saved = _outputs(tmp_path, [
      "time_vs_heads.png", "memory_vs_heads.png", "time_vs_n.png",
      "memory_vs_n.png"])
  assert saved == results
  heads = entry_points.table(report, "| path | h | time ms |")
  assert len(heads) == len(results["heads"]) == 4  # 2 paths x 2 head counts
  for row, p in zip(heads, results["heads"]):
    assert row[:3] == [p["path"], str(p["h"]), f"{p['time_ms']:.1f}"]
    assert row[4] == f"{p['analytic_flops'] / 1e9:.3f}"
  lengths = entry_points.table(report, "| path | n | time ms |")
  assert [int(r[1]) for r in lengths] == [p["n"] for p in results["length"]]
  for path, s in results["slopes"].items():
    assert (f"- {path}: time slope {s['time']:.2f} (claim: about 2 at large "
            f"n); memory slope {s['memory']:.2f}") in report


def test_benchmark(tmp_path, monkeypatch):
  """Each case runs in its own worker process (`experiments.benchmark.bench`), as in a real
  run; the smoke config times two paths on one tiny shape."""
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")  # the workers
  results = entry_points.load("benchmark").run(entry_points.config("benchmark"), tmp_path)
  report, saved = _outputs(tmp_path, [], report="table.md")
  assert saved == json.loads(json.dumps(results))
  rows = results["rows"]
  assert [r["path"] for r in rows] == ["einsum", "jax.nn"]
  assert not any("skipped" in r for r in rows), rows
  table = entry_points.table(report, "| path | fwd ms |")
  for r in rows:
    cells = _row(table, r["path"])
    assert cells[1] == f"{r['fwd_ms']:.1f}"
    assert cells[5] == f"{r['fwdbwd_ms']:.1f}"
  assert _row(table, "jax.nn")[4] == "1.00"  # the only anchor is 1x itself
  # The train-step set: one tiny step of experiment 1's smoke model in
  # mha_jax and in PyTorch, interleaved; the ratio is per round.
  steps = {r["path"]: r for r in results["train_step"]}
  assert list(steps) == ["einsum", "torch"]
  ours, peer = steps["einsum"], steps["torch"]
  per_round = [a / b for a, b in zip(ours["step_s"], peer["step_s"])]
  assert ours["x_torch"]["median"] == pytest.approx(
      statistics.median(per_round))
  assert ours["x_torch"]["min"] == pytest.approx(min(per_round))
  cells = _row(entry_points.table(report, "| path | ms per step |"), "einsum")
  assert cells[1] == f"{ours['step_ms']:.1f}"
  # The roofline: per round, the step's matmul rate over the plain
  # matmul's in the same round.
  per_round = [(ours["matmul_gflop"] / s) / g for s, g in
               zip(ours["step_s"], ours["matmul_gflops"])]
  assert cells[2] == (f"{100 * statistics.median(per_round):.0f} "
                      f"({100 * min(per_round):.0f}-"
                      f"{100 * max(per_round):.0f})")
  assert cells[3].startswith(f"{ours['x_torch']['median']:.2f} (")


def test_mesh_check_command_line(tmp_path):
  """The real command line: flags, config file and smoke argument, the two
  training subprocesses (experiments.train), the comparison."""
  # Devices for the mesh run exist from the start, so mesh_check need not
  # restart itself to get them; optimisations off as in tests/conftest.py.
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_DISABLE_MOST_OPTIMIZATIONS="1",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.mesh_check",
       "--config=configs/mesh_check.py:smoke", f"--workdir={tmp_path}",
       "--config.experiment.steps=3"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report, results = _outputs(tmp_path, [])
  assert results["steps"] == 3 and results["mesh"] == {"data": 2, "model": 4}
  assert results["config"] == "configs/mesh_check.py:smoke"
  # The report names the command as typed, and that it is a smoke run.
  assert (f"Command: `.venv/bin/python -m experiments.mesh_check "
          f"--config=configs/mesh_check.py:smoke --workdir={tmp_path} "
          "--config.experiment.steps=3`") in report
  assert report_lib.SMOKE_NOTE in report
  # The override reached both training runs.
  assert "--config.experiment.steps=3" in results["runs"]["mesh"]["command"]
  ev = results["eval"]
  assert ev["steps"] == [1, 2, 3]
  rows = entry_points.table(report, "| step | one device |")
  assert rows == [[str(s), f"{a:.6f}", f"{b:.6f}", f"{d:.2e}"] for s, a, b, d
                  in zip(ev["steps"], ev["loss_one_device"], ev["loss_mesh"],
                         ev["abs_diff"])]
  # Same training on one device and on the mesh, up to summation order.
  assert ev["max_abs_diff"] < 1e-4
  assert results["bytes"]["params"]["split_leaves_hold_total_over_model"]


def test_context_parallel_command_line(tmp_path):
  """The real command line on its smoke config: it starts itself again
  with 8 simulated devices, compiles one device's and the ring's
  forward+backward and runs a short ring; the report shows results.json."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.context_parallel",
       "--config=configs/context_parallel.py:smoke", f"--workdir={tmp_path}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report, results = _outputs(tmp_path, [])
  m = results["memory"]
  rows = entry_points.table(report, "|  | one device |")
  assert rows[-1] == ["peak", f"{m['one_device']['peak'] / 2**20:,.1f}",
                      f"{m['ring_per_device']['peak'] / 2**20:,.1f}"]
  assert f"{m['ratio']:.3f}" in report
  # Each device holds 1/8 of the sequence: its program needs far less.
  assert m["ratio"] < 0.25
  assert results["long"]["finite"] and results["long"]["tokens"] == 512
  # The command that ran, as every report says it, and its config saved.
  assert ("Command: `.venv/bin/python -m experiments.context_parallel "
          "--config=configs/context_parallel.py:smoke") in report
  assert results["config"]["experiment"]["long_len"] == 512


def test_every_entry_point_has_an_end_to_end_test():
  """An entry point added to experiments/ needs a smoke test here (or, for
  the worked example, in test_toy_example.py)."""
  tested = {"induction", "two_offsets", "head_dim", "cross_attention",
            "pruning", "train", "generate", "kv_behaviour", "kv_cache",
            "cost_scaling", "benchmark", "mesh_check", "toy_example",
            "context_parallel",
            "explore", "circuits",
            # explore: tests/interp/test_explore.py; text_heads: tests/training/test_text.py;
            # sinks: tests/experiments/test_sinks.py
            "text_heads", "sinks",
            # text_induction: tests/experiments/test_text_induction.py
            "text_induction",
            # pretrained_bench: tests/pretrained/test_pretrained_bench.py
            "pretrained_bench", "pretrained_heads",
            # real_heads, ioi: tests/experiments/test_real_heads.py and
            # test_ioi.py (tiny random GGUF models through the same code)
            "real_heads", "ioi",
            # ioi_circuit: tests/experiments/test_ioi_circuit.py
            "ioi_circuit",
            # ioi_output_heads: tests/experiments/test_ioi_output_heads.py
            "ioi_output_heads",
            # ioi_classes: tests/experiments/test_ioi_classes.py
            "ioi_classes",
            # eap_ioi: tests/experiments/test_eap_ioi.py
            "eap_ioi",
            # score_rules_bench: tests/experiments/test_score_rules_bench.py
            "score_rules_bench",
            # real_lm_bench: tests/experiments/test_real_lm_bench.py
            "real_lm_bench",
            # gpu_bench: tests/experiments/test_gpu_bench.py
            "gpu_bench",
            # sae: tests/real_models/test_sae_smoke_run.py (the real tier)
            "sae"}
  helpers = {"__init__", "cli",  # cli: the flags every experiment shares
             # shared by two experiments (two_offsets, head_dim), run by them
             "offset_sweep", "offset_sweep_report",
             # circuits writes these numbers, explore reads them back
             "saved_patching",
             # shared inputs and peers of two experiments each, run by them
             "stdlib_prose", "torch_peers",
             "speed_ab"}  # speed_ab: an A/B tool needing a second checkout
  found = {p.stem for p in (ROOT / "experiments").iterdir()
           if p.suffix == ".py" or (p / "__main__.py").exists()} - helpers
  assert found == tested


def test_pretrained_heads(tmp_path):
  """The smoke config's tiny random BERT (built by transformers): the
  report's tables show results.json's numbers."""
  config = entry_points.config("pretrained_heads")
  results = entry_points.load("pretrained_heads").run(config, tmp_path)
  report, saved = _outputs(tmp_path, [
      "layer_shares.png", "entropy.png", "sep_gradient.png", "heads_mds.png",
      "pruning.png"])
  assert saved == results
  page = _explorer_page(tmp_path, report)
  assert page["kinds"][0]["query_labels"][0] == "[CLS]"
  nl, nh = results["model"]["layers"], results["model"]["heads"]
  assert (nl, nh) == (config.experiment.tiny.num_layers,
                      config.experiment.tiny.num_heads)
  cell = lambda s, i=(): (f"{np.asarray(s['mean'])[i]:.3f} "
                          f"{report_lib.interval(np.asarray(s['ci95'])[i])}")
  layers = entry_points.table_by_label(report, "| layer | [CLS] |")
  h = results["heads"]
  for l in range(nl):
    assert layers[str(l)][:4] == [
        cell(h["cls"]["layer_trained"], l), cell(h["cls"]["layer_init"], l),
        cell(h["sep"]["layer_trained"], l), cell(h["sep"]["layer_init"], l)]
  assert layers["uniform"][0] == cell(h["cls"]["uniform"])
  # A layer's share is its heads' mean; uniform attention over n tokens
  # puts 1/n on [CLS] and 2/n on the two [SEP]s.
  for l in range(nl):
    assert np.mean(h["sep"]["trained"]["mean"][l]) == pytest.approx(
        h["sep"]["layer_trained"]["mean"][l], rel=1e-6)
  assert h["sep"]["uniform"]["mean"] == pytest.approx(
      2 * h["cls"]["uniform"]["mean"], rel=1e-6)
  # The single-sentence control: [CLS] s [SEP] has one [SEP], so uniform
  # attention puts as much on it as on [CLS]; the report's table shows it.
  s = results["single_sentences"]
  assert s["uniform"]["sep"]["mean"] == pytest.approx(
      s["uniform"]["cls"]["mean"], rel=1e-6)
  single = entry_points.table_by_label(report, "| layer | [CLS], pairs |")
  for l in range(nl):
    assert single[str(l)][:3] == [
        cell(h["cls"]["layer_trained"], l), cell(s["trained"]["cls"], l),
        cell(s["init"]["cls"], l)]
  top = entry_points.table(report, "| focus on | head |")
  assert [r[1] for r in top[:config.experiment.top]] == [
      f"L{t['layer']}H{t['head']}" for t in results["top"]["previous"]]
  js = entry_points.table_by_label(report, "| model | JS distance within")
  assert js["pretrained"][:2] == [
      f"{results['js']['trained']['within_layer']:.3f}",
      f"{results['js']['trained']['across_layer']:.3f}"]
  assert 0 < results["js"]["trained"]["p_value"] <= 1
  grad = entry_points.table_by_label(report, "| layer | share on [SEP] |")
  g = results["gradient"]["sep"]
  assert grad["0"][1] == (f"{g['mean'][0]:.6f} "
                          f"{report_lib.interval(g['ci95'][0], 6)}")
  prune = entry_points.table(report, "| heads removed |")
  p = results["pruning"]
  assert [int(r[0]) for r in prune] == p["removed"] == list(
      range(0, nl * nh + 1, config.experiment.prune_step))
  assert [r[1] for r in prune] == [f"{a:.3f}" for a in p["ranked"]["accuracy"]]
  # With no head removed both orders score the same model.
  assert p["ranked"]["accuracy"][0] == p["random"]["accuracy"][0]
  assert sorted(p["order"]) == list(range(nl * nh))
  clean = results["ablation"]["clean"]["accuracy"]["mean"]
  assert 0 <= clean <= 1


def test_circuits(tmp_path):
  config = entry_points.config("circuits")
  results = entry_points.load("circuits").run(config, tmp_path)
  report, saved = _outputs(tmp_path, [
      "composition.png", "path_patching.png", "head_patching.png",
      "position_patching.png", "copying_dla.png", "dynamics.png"])
  assert saved == results
  summary = entry_points.table(report, "| key | mean ± std |")
  assert [r[0] for r in summary] == list(results["summary"])
  for key, (mean, std) in results["summary"].items():
    digits = 0 if key.endswith("_step") else 3
    assert _row(summary, key)[1] == report_lib.fmt(mean, std, digits=digits)
    assert _row(summary, key)[3] == ", ".join(
        f"{v:.{digits}f}" for v in results["per_seed"][key])
  # The joint sets score one path exactly as the path grid does (two
  # code paths: routes through `joint_path_patching` on per-example sums,
  # and `path_patching_grid` on the pooled metric).
  for claim, key in (("fc_prev_k_noise", "prev_k_noise"),
                     ("fc_prev_k_denoise", "prev_k_denoise"),
                     ("fc_cur_v_noise", "cur_v_noise")):
    np.testing.assert_allclose(results["claims"][claim]["values"],
                               results["per_seed"][key], rtol=1e-4,
                               atol=1e-5)
  rows = entry_points.table(report, "| key | corruption | way |")
  assert [r[0] for r in rows] == [h[0] for h in circuit_survey.HEADLINES]
  for r in rows:
    assert r[4] == report_lib.summary(results["claims"][r[0]], 3)
  run = results["runs"]["seed0"]
  noise = run["heads"]["noise"]["path"]
  paths = entry_points.table(report, "| seed, head | prev-token |")
  assert len(paths) == len(config.experiment.seeds) * config.model.num_heads
  assert _row(paths, "0 L0H1")[3:6] == [f"{noise[f'{k}_all'][1]:.2f}"
                                       for k in "qkv"]
  comp = entry_points.table(report, "| seed, head | prev / current score |")
  assert _row(comp, "random")[2:5] == [
      report_lib.fmt(*results["baselines"]["composition"][k]) for k in "qkv"]
  assert _row(comp, "0 L0H0")[3] == (
      f"{np.mean(run['composition']['k'][0]):.3f}")
  # The dynamics: step 0 and every evaluation, read from the checkpoints.
  assert run["dynamics"]["steps"] == [0, 3, 6]
  np.testing.assert_allclose(run["dynamics"]["loss"][-1],
                             -run["heads"]["noise"]["reference"][0],
                             rtol=1e-5)  # the same batch, the same model
  # The browser page: seed 0 on the clean pairs (its loss is minus the
  # clean metric), each head's patching numbers beside its scores.
  page = _explorer_page(tmp_path, report)
  assert _page_eval(page)["loss"] == pytest.approx(
      -run["heads"]["noise"]["reference"][0], abs=1e-4)
  (kind,) = page["kinds"]
  table = kind["table"]
  keys = [c["key"] for c in table["columns"]]
  for d in ("denoise", "noise"):
    for m in ("activation", "attribution"):
      col = keys.index(f"{d} {m} patching")
      assert [r["values"][col] for r in table["rows"]] == [
          v for layer in run["heads"][d][m] for v in layer]
