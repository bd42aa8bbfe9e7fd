"""What sharing key/value heads costs, reporting: tables, figures, claims.

Shape letters: H query heads, K key/value heads, Dh head width.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures; nothing here trains or runs a model. The prose is
report.md.tmpl beside this file; `render` fills it from results.json
alone, so a committed report regenerates from its results.json.
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import curves
from mha_jax.measure import report as report_lib

FIGURES = ("time_to_drop.png", "time_to_drop_per_seed.png",
           "loss_curves.png")
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(workdir, config, results["variants"], results["per_seed"])
  return report_lib.write_rendered(workdir, results, render, config=config)


def render(saved: dict) -> str:
  """report.md from results.json's contents (`saved`, config included)."""
  return report_lib.fill(TEMPLATE, values(saved))


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


def _pct(n, ref) -> str:
  """`n` relative to `ref`, a signed percentage."""
  return report_lib.percent((n - ref) / ref, signed=True)


def _or_na(x) -> str:
  """`x` to 3 decimals, `n/a` where it was not computed (one seed)."""
  return report_lib.fmt(x) if x is not None else "n/a"


def _steps(first) -> str:
  """Per-seed first steps, `-` where a seed never got there."""
  return ", ".join("-" if f is None else str(f) for f in first)


def _comparison_rows(by_key, comparisons) -> list[list[str]]:
  """One row per comparison: the differences, what the seeds detect."""
  rows = []
  for c in comparisons:
    v, ref = by_key[c["variant"]], by_key[c["reference"]]
    loss, acc = c["eval_loss"], c["generation_token_accuracy"]
    md = c["time_to_drop"]["mean_difference"]
    rows.append([
        v["name"], ref["name"], _pct(v["params"], ref["params"]),
        report_lib.difference(loss, interval_spec=".3f"),
        _or_na(loss["detectable"]),
        report_lib.difference(acc, interval_spec=".3f"),
        _or_na(acc["detectable"]),
        (report_lib.difference(md, 0, interval_spec=".0f") if md is not None
         else "n/a (a seed never dropped)"),
        _or_na(c["time_to_drop"]["logrank_p"])])
  return rows


def _verdict(c, v, ref, key, what, better_low) -> str:
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


def _split_text(e, v) -> str:
  """A warning where some seeds never dropped and others did."""
  stuck = [(s, loss) for s, f, loss in zip(
      e["seeds"], v["time_to_drop"]["per_seed"], v["eval_loss"]["values"])
           if f is None]
  if not stuck or len(stuck) == len(e["seeds"]):
    return ""
  return (" Two outcomes: " + ", ".join(
      f"seed {s} never got below {e['loss_threshold']:g} (final loss "
      f"{report_lib.fmt(loss)})" for s, loss in stuck)
          + f", while the other {len(e['seeds']) - len(stuck)} did; the "
          "mean and its interval mix the two, so read the per-seed table.")


def _comparison_claim(e, c, v, r) -> str:
  """One bullet: variant `v` against reference `r`."""
  return (
      f"* {v['name']} against {r['name']} ({v['params']} parameters, "
      f"{_pct(v['params'], r['params'])}): "
      + _verdict(c, v, r, "eval_loss", "final eval loss", True) + "; "
      + _verdict(c, v, r, "generation_token_accuracy",
                 "cached-generation token accuracy", False)
      + f". First eval step below {e['loss_threshold']:g} per "
      f"seed: {_steps(v['time_to_drop']['per_seed'])} ({_drop_text(c, v, r)};"
      f" log-rank p = {_or_na(c['time_to_drop']['logrank_p'])})."
      + _split_text(e, v))


def _seed_tables(e, variants) -> dict:
  """Final numbers and first steps, one column per seed."""
  finals = [[v["name"]] + [
      f"{report_lib.fmt(loss)} ({report_lib.fmt(acc)})"
      for loss, acc in zip(v["eval_loss"]["values"],
                           v["generation_token_accuracy"]["values"])]
            for v in variants]
  firsts = [[v["name"]] + [("-" if f is None else f)
                           for f in v["time_to_drop"]["per_seed"]]
            for v in variants]
  return {
      "final_seed_table": report_lib.md_table(
          ["variant"] + [f"seed {s} final" for s in e["seeds"]], finals),
      "first_step_table": report_lib.md_table(
          ["variant"] + [f"seed {s}" for s in e["seeds"]], firsts)}


def _steps_table(e, variants, at_steps) -> str:
  """Eval loss (mean ± sample std) at intermediate steps."""
  rows = [[v["name"]] + [
      report_lib.fmt(at_steps[v["key"]][str(s)]["mean"],
                     at_steps[v["key"]][str(s)]["std"])
      for s in e["report_steps"]] for v in variants]
  return report_lib.md_table(
      ["variant"] + [f"step {s}" for s in e["report_steps"]], rows)


def values(saved: dict) -> dict:
  """The template's values, each written as the report shows it."""
  config, variants = saved["config"], saved["variants"]
  e, rows = config["experiment"], saved["runs"]
  by_key = {v["key"]: v for v in variants}
  ref = variants[0]
  return {
      "task": config["task"]["name"],
      "command": saved["command"],
      "num_runs": len(variants) * len(e["seeds"]),
      "wall_time": report_lib.wall_time(saved["wall_seconds"],
                                        saved["reused_runs"]),
      "description": saved["description"],
      "final_table": report_lib.md_table(
          list(rows[0]), [list(r.values()) for r in rows]),
      "reference": ref["name"],
      "num_seeds": len(e["seeds"]),
      "comparison_table": report_lib.md_table(
          ["variant", "reference", "params vs ref", "Δ eval loss [95%]",
           "detectable Δ loss", "Δ generation token acc [95%]",
           "detectable Δ acc", "Δ mean first step below threshold [95%]",
           "log-rank p"], _comparison_rows(by_key, saved["comparisons"])),
      **_seed_tables(e, variants),
      "threshold": f"{e['loss_threshold']:g}",
      "num_steps": config["train"]["num_steps"],
      "steps_table": _steps_table(e, variants, saved["loss_at_steps"]),
      "first_seed": e["seeds"][0],
      "generate_examples": e["generate_examples"],
      "other_variant": variants[-1]["name"],
      "other_key": variants[-1]["key"],
      "reference_params": ref["params"],
      "reference_loss": report_lib.fmt(ref["eval_loss"]["mean"]),
      "reference_steps": _steps(ref["time_to_drop"]["per_seed"]),
      "comparison_claims": "\n".join(
          _comparison_claim(e, c, by_key[c["variant"]],
                            by_key[c["reference"]])
          for c in saved["comparisons"]),
  }
