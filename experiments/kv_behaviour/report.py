"""What sharing key/value heads costs, reporting: tables, figures, claims.

Shape letters: H query heads, K key/value heads, Dh head width.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures; nothing here trains or runs a model.
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import curves
from mha_jax.measure import report as report_lib

FIGURES = ("time_to_drop.png", "time_to_drop_per_seed.png",
           "loss_curves.png")


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(workdir, config, results["variants"], results["per_seed"])
  return report_lib.write_outputs(workdir, results, _report(config, results),
                                  config=config)


def _pct(n, ref) -> str:
  """`n` relative to `ref`, a signed percentage."""
  return report_lib.percent((n - ref) / ref, signed=True)


def _or_na(x) -> str:
  """`x` to 3 decimals, `n/a` where it was not computed (one seed)."""
  return report_lib.fmt(x) if x is not None else "n/a"


def _steps(first) -> str:
  """Per-seed first steps, `-` where a seed never got there."""
  return ", ".join("-" if f is None else str(f) for f in first)


def _figures(workdir, config, variants, per_seed) -> None:
  """Survival curves, first steps per seed, and every eval curve."""
  e = config.experiment
  curves.plot_survival(
      {v["name"]: (v["time_to_drop"]["survival"]["steps"],
                   v["time_to_drop"]["survival"]["fraction_above"])
       for v in variants}, threshold=e.loss_threshold,
      title=f"Seeds whose eval loss has not yet been below "
      f"{e.loss_threshold:g} ({len(e.seeds)} per variant)",
      path=str(workdir / FIGURES[0]))
  curves.plot_first_steps(
      {v["name"]: v["time_to_drop"]["per_seed"] for v in variants},
      censor_at=config.train.num_steps,
      title="First eval step below the threshold, one dot per seed",
      path=str(workdir / FIGURES[1]))
  curves.plot_seed_curves(
      {v["name"]: [(per_seed[f"{v['key']}_seed{s}"]["curve"]["steps"],
                    per_seed[f"{v['key']}_seed{s}"]["curve"]["loss"])
                   for s in e.seeds] for v in variants},
      ylabel="eval loss", title="Eval loss, every run", logy=True,
      path=str(workdir / FIGURES[2]))


def _comparison_rows(variants, comparisons) -> list[list[str]]:
  """One row per comparison: the differences, what the seeds detect."""
  by_key = {v["key"]: v for v in variants}
  rows = []
  for c in comparisons:
    v, ref = by_key[c["variant"]], by_key[c["reference"]]
    loss, acc, t = (c["eval_loss"], c["generation_token_accuracy"],
                    c["time_to_drop"])
    md = t["mean_difference"]
    rows.append([
        v["name"], ref["name"], _pct(v["params"], ref["params"]),
        report_lib.difference(loss, interval_spec=".3f"),
        _or_na(loss["detectable"]),
        report_lib.difference(acc, interval_spec=".3f"),
        _or_na(acc["detectable"]),
        (report_lib.difference(md, 0, interval_spec=".0f") if md is not None
         else "n/a (a seed never dropped)"),
        _or_na(t["logrank_p"])])
  return rows


def _verdict(c, v, ref, key, what, better_low):
  """One clause on `key` of variant `v` against `ref`, no stronger than
  its interval."""
  d = c[key]
  unit = (f"{what} {report_lib.fmt(v[key]['mean'])} vs "
          f"{report_lib.fmt(ref[key]['mean'])}")
  if d["ci95"] is None:
    return f"{unit} (one seed: no interval)"
  ival = (f"difference {report_lib.signed(d['diff'])}, 95% interval "
          f"{report_lib.interval(d['ci95'])}")
  if d["excludes_0"]:
    worse = (d["diff"] > 0) == better_low
    return f"{unit}: {'worse' if worse else 'better'} ({ival})"
  return (f"{unit}: no difference resolved ({ival}; {v['seeds']} seeds per "
          f"variant detect a true difference of about "
          f"{report_lib.fmt(d['detectable'])} with 80% power, not a "
          "smaller one)")


def _drop_text(c, v, r) -> str:
  """The time-to-drop difference, or why no mean is taken."""
  t = v["time_to_drop"]
  md = c["time_to_drop"]["mean_difference"]
  if md is not None and md["ci95"] is not None:
    return (f"mean first step {report_lib.signed(md['diff'], 0)} relative to "
            f"{r['name']}, 95% interval "
            f"{report_lib.interval(md['ci95'], 0)}")
  return (f"{t['reached']}/{v['seeds']} seeds dropped by step "
          f"{t['censored_at']}, so no mean is taken")


def _split_text(config, v) -> str:
  """A warning where some seeds never dropped and others did."""
  e = config.experiment
  t = v["time_to_drop"]
  stuck = [(s, loss) for s, f, loss in zip(
      e.seeds, t["per_seed"], v["eval_loss"]["values"]) if f is None]
  if not stuck or len(stuck) == len(e.seeds):
    return ""
  return (" Two outcomes: " + ", ".join(
      f"seed {s} never got below {e.loss_threshold:g} (final loss "
      f"{report_lib.fmt(loss)})" for s, loss in stuck)
          + f", while the other {len(e.seeds) - len(stuck)} did; the mean "
          "and its interval mix the two, so read the per-seed table.")


def _comparison_claim(config, c, v, r) -> str:
  """One bullet: variant `v` against reference `r`."""
  p = c["time_to_drop"]["logrank_p"]
  return (
      f"* {v['name']} against {r['name']} ({v['params']} parameters, "
      f"{_pct(v['params'], r['params'])}): "
      + _verdict(c, v, r, "eval_loss", "final eval loss", True) + "; "
      + _verdict(c, v, r, "generation_token_accuracy",
                 "cached-generation token accuracy", False)
      + f". First eval step below {config.experiment.loss_threshold:g} per "
      f"seed: {_steps(v['time_to_drop']['per_seed'])} ({_drop_text(c, v, r)};"
      " log-rank p = " + _or_na(p) + ")." + _split_text(config, v))


def _conclusions(config, variants, comparisons) -> list[str]:
  """The reference, then one bullet per comparison."""
  by_key = {v["key"]: v for v in variants}
  ref = variants[0]
  lines = [
      f"* {ref['name']} (reference, {ref['params']} parameters): eval loss "
      f"{report_lib.fmt(ref['eval_loss']['mean'])} at step "
      f"{config.train.num_steps}; first eval step below "
      f"{config.experiment.loss_threshold:g} per seed: "
      f"{_steps(ref['time_to_drop']['per_seed'])}."]
  return lines + [_comparison_claim(config, c, by_key[c["variant"]],
                                    by_key[c["reference"]])
                  for c in comparisons]


def _per_seed_section(config, variants) -> list[str]:
  """Final numbers and first steps, one column per seed."""
  e = config.experiment
  seed_rows = [[v["name"]] + [("-" if f is None else f)
                              for f in v["time_to_drop"]["per_seed"]]
               for v in variants]
  final_rows = [[v["name"]] + [
      f"{report_lib.fmt(loss)} ({report_lib.fmt(acc)})"
      for loss, acc in zip(v["eval_loss"]["values"],
                           v["generation_token_accuracy"]["values"])]
                for v in variants]
  return [
      "## Every seed", "",
      "Final eval loss per seed (cached-generation token accuracy in "
      "brackets); the means above mix whatever outcomes these show:", "",
      report_lib.md_table(["variant"] + [f"seed {s} final" for s in e.seeds],
                          final_rows), "",
      f"First eval step with loss below {e.loss_threshold:g}, per seed (- : "
      f"not by step {config.train.num_steps}):", "",
      report_lib.md_table(["variant"] + [f"seed {s}" for s in e.seeds],
                          seed_rows), "",
      "![time_to_drop.png](time_to_drop.png)",
      "![time_to_drop_per_seed.png](time_to_drop_per_seed.png)", ""]


def _steps_section(config, variants, at_steps) -> list[str]:
  """Eval loss at intermediate steps, and the explorer link."""
  e = config.experiment
  step_rows = [[v["name"]] + [
      report_lib.fmt(at_steps[v["key"]][s]["mean"],
                     at_steps[v["key"]][s]["std"]) for s in e.report_steps]
               for v in variants]
  return [
      "Eval loss at intermediate evaluations of the same runs (mean ± "
      "sample std; one schedule, so each column is what a run stopped "
      "there would report):", "",
      report_lib.md_table(["variant"] + [f"step {s}" for s in e.report_steps],
                          step_rows), "",
      "![loss_curves.png](loss_curves.png)", "",
      f"Every head of the {variants[0]['name']} model (seed {e.seeds[0]}) in "
      f"a browser, on the {e.generate_examples} held-out sequences its "
      "cached-generation prompts are cut from: "
      "[explorer.html](explorer.html). Another run's page, for example "
      f"seed {e.seeds[0]} of {variants[-1]['name']}: `python -m "
      "experiments.explore --workdir=runs/kv_behaviour/"
      f"{variants[-1]['key']}_seed{e.seeds[0]} --batch_from_task "
      f"--num_examples={e.generate_examples}`.", ""]


def _report(config, results) -> str:
  """report.md: the final numbers, comparisons, per-seed tables, claims."""
  e = config.experiment
  variants, rows = results["variants"], results["runs"]
  comparisons = results["comparisons"]
  took = report_lib.wall_time(results["wall_seconds"], results["reused_runs"])
  text = [
      f"# Sharing key/value heads: MHA, GQA and MQA on {config.task.name}",
      "", f"Command: {results['command']} "
      f"({len(variants) * len(e.seeds)} runs, {took}).", "",
      results["description"], "",
      "## Final numbers", "",
      report_lib.md_table(list(rows[0]), [list(r.values()) for r in rows]),
      "",
      "The unmatched rows are NOT matched in parameter count: sharing "
      "key/value heads removes parameters. The params-matched row widens "
      "every head of the shared-kv model (Dh) until its total parameter "
      "count is as close to MHA's as an even Dh allows (the params and "
      "cache columns give the exact counts); its cache is still smaller "
      "than MHA's.", "",
      f"## Each variant against {variants[0]['name']} (and the "
      "params-matched variant against the unmatched one)", "",
      "Differences are variant minus reference; intervals are Welch 95% "
      "intervals over seeds. 'Detectable' is the smallest true difference "
      f"{len(e.seeds)} vs {len(e.seeds)} seeds detect with 80% power at the "
      "5% level (pooled sample std), so an interval containing 0 rules out "
      "nothing smaller. The time-to-drop difference is a difference of "
      "mean steps, taken only when every seed of both dropped; the "
      "log-rank test keeps seeds that never dropped.", "",
      report_lib.md_table(
          ["variant", "reference", "params vs ref", "Δ eval loss [95%]",
           "detectable Δ loss", "Δ generation token acc [95%]",
           "detectable Δ acc", "Δ mean first step below threshold [95%]",
           "log-rank p"], _comparison_rows(variants, comparisons)), "",
      *_per_seed_section(config, variants),
      *_steps_section(config, variants, results["loss_at_steps"]),
      "## What this shows", ""] + _conclusions(config, variants, comparisons)
  return "\n".join(text)
