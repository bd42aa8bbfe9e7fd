r"""What sharing key/value heads costs a trained model: MHA vs GQA vs MQA.

  python -m experiments.kv_behaviour --workdir=runs/kv_behaviour
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/kv_behaviour/results.json

Trains one decoder per (variant, seed) of `configs/kv_behaviour.py` through
the shared training loop (same task, steps, data, learning-rate schedule
and initial seed for every variant; the schedule is constant after warmup,
so an intermediate evaluation is a shorter run of the same schedule). The
variants are K = H (MHA), 1 < K < H (GQA) and K = 1 (MQA) key/value heads,
plus K values trained again with the head width widened so that the model
has MHA's parameter count. Measures on held-out data: the eval loss at
every evaluation (the time until it first drops below
`experiment.loss_threshold`, per seed, as a survival curve), and at the end
the eval loss and accuracy and the accuracy of free-running generation with
the KV cache (`mha_jax.measure.continuations`). Every variant is compared with MHA
by Welch 95% intervals. Writes report.md, results.json, PNG figures and
explorer.html (every head of the first seed's MHA model, in a browser);
results.json is in the format `experiments.kv_cache --behaviour_results`
reads ("runs": one display row per variant, "variants": the numbers behind
them).

Shape letters: H query heads, K key/value heads, Dh head width, L layers.
"""

from __future__ import annotations

import math
import pathlib
import time

from absl import app
from absl import flags
from ml_collections import config_flags

from mha_jax.measure import report as report_lib
from mha_jax.measure import continuations
from mha_jax.measure import curves
from mha_jax.interp import explorer
from mha_jax.training import held_out
from experiments.kv_behaviour import variants as kv_variants
from mha_jax.measure import runs
from mha_jax.measure import stats
from mha_jax.training import train

COMMAND = "python -m experiments.kv_behaviour --workdir=runs/kv_behaviour"

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/kv_behaviour.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/kv_behaviour", "Output folder: report.md, results.json, "
    "PNGs and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")

FIGURES = ("time_to_drop.png", "time_to_drop_per_seed.png",
           "loss_curves.png")


def measure(run) -> dict:
  """One trained `runs.SeedRun`'s numbers (see `kv_variants.summarise`)."""
  e = run.config.experiment
  model = run.state.model()
  steps, losses = curves.read(run.run_dir, "eval", "loss")
  _, accs = curves.read(run.run_dir, "eval", "accuracy")
  # Held-out prompts drawn per training seed (the same for every variant
  # of that seed), so the spread over seeds includes the evaluation data.
  gen = continuations.evaluate_generation(
      model, run.config, num_examples=e.generate_examples,
      seed=held_out.ANALYSIS_SEED + run.seed)
  attn_params, cache_bytes = kv_variants.model_costs(model)
  return {"eval_loss": losses[-1], "eval_accuracy": accs[-1],
          "first_step_below": curves.first_below(steps, losses,
                                                 e.loss_threshold),
          "generation_token_accuracy": gen["token_accuracy"],
          "generation_sequence_accuracy": gen["sequence_accuracy"],
          "teacher_forced_accuracy": gen["teacher_forced_accuracy"],
          "params": kv_variants.param_count(model),
          "attention_params_per_layer": attn_params,
          "cache_bytes_per_token": cache_bytes,
          "curve": {"steps": steps, "loss": losses}}


def _write_explorer(run, workdir, title: str):
  """explorer.html in `workdir` of one trained `runs.SeedRun`.

  On the held-out sequences `measure` cuts its generation prompts from
  (same size and key), so the page's loss and accuracy are the run's
  teacher-forced numbers.
  """
  batch = held_out.analysis_batch(
      run.config, run.config.experiment.generate_examples,
      seed=held_out.ANALYSIS_SEED + run.seed)
  return explorer.write_explorer(
      run.state.model(), batch, pathlib.Path(workdir) / "explorer.html",
      loss=run.state.loss,
      init_model=train.create_train_state(run.config).model(), title=title)


def variant_specs(config) -> list[dict]:
  """The variants to train: each K of `experiment.kv_heads` at the config's
  head width, then each K of `experiment.matched_kv_heads` at the even
  head width that matches the first variant's parameter count."""
  m, e = config.model, config.experiment
  dh = m.head_dim or m.d_model // m.num_heads
  specs = [{"key": f"K{k}", "name": kv_variants.variant_name(m.num_heads, k),
            "num_kv_heads": k, "head_dim": dh, "matched": False}
           for k in e.kv_heads]
  ref = runs.variant(config, **{"model.num_kv_heads": e.kv_heads[0],
                                "model.head_dim": dh})
  for k in e.matched_kv_heads:
    mdh = kv_variants.matched_head_dim(ref, k)[0]
    specs.append({"key": f"K{k}_Dh{mdh}",
                  "name": f"{kv_variants.variant_name(m.num_heads, k)}, "
                          f"Dh={mdh} (params matched)",
                  "num_kv_heads": k, "head_dim": mdh, "matched": True})
  return specs


def description(config, specs):
  m, t, tr, e = config.model, config.task, config.train, config.experiment
  matched = [s for s in specs if s["matched"]]
  return (
      f"{m.num_layers}-layer {'attention-only ' if m.attention_only else ''}"
      f"decoders, D={m.d_model}, H={m.num_heads}, "
      f"Dh={specs[0]['head_dim']}, {m.positions} positions, trained on the "
      f"{t.name} task (T={t.seq_len}, V={t.vocab_size}, repeated segments "
      f"of {t.min_segment}-{t.max_segment} tokens) for {tr.num_steps} steps "
      f"of batch {t.batch_size} at learning rate {tr.learning_rate:g}, "
      f"linear warmup over {tr.warmup_steps} steps then "
      + ("constant" if tr.end_lr_fraction == 1.0 else
         f"cosine decay to {tr.end_lr_fraction:g}x")
      + f" (every variant the same schedule), evaluated every "
      f"{tr.eval_every} steps; seeds {tuple(e.seeds)}; only K differs"
      + (" (and Dh in the params-matched row" + ("s" if len(matched) > 1
                                                 else "") + ")"
         if matched else "")
      + ". Cells are mean ± sample std [95% t interval of the "
      f"mean] over seeds. Eval loss/accuracy: the training loop's held-out "
      f"evaluation at the last step, on the scored (predictable) tokens of "
      f"the repeat (chance: ln {t.vocab_size - 3} = "
      f"{math.log(t.vocab_size - 3):.2f}). Cached generation: "
      f"each model continues {e.generate_examples} held-out prompts (cut "
      f"before the first scored token) greedily with its KV cache; token "
      f"accuracy over the scored tokens, and the fraction of continuations "
      f"entirely right. Teacher-forced: the same scored tokens predicted "
      f"from the true sequence, so the gap to cached generation is errors "
      f"compounding in free-running decoding.")


def _pct(n, ref):
  return f"{100 * (n - ref) / ref:+.1f}%"


def comparison_pairs(variants) -> list[tuple[dict, dict]]:
  """`(reference, variant)` pairs to compare: every variant against the
  first (MHA), and each params-matched variant against the unmatched one
  of the same K (what widening the heads bought)."""
  ref = variants[0]
  pairs = [(ref, v) for v in variants[1:]]
  for v in variants:
    if v["matched"]:
      same = [u for u in variants if not u["matched"]
              and u["num_kv_heads"] == v["num_kv_heads"]]
      pairs += [(u, v) for u in same]
  return pairs


def _steps(first) -> str:
  return ", ".join("-" if f is None else str(f) for f in first)


def _comparison_rows(variants, comparisons):
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
        f"{loss['detectable']:.3f}" if loss["detectable"] is not None
        else "n/a",
        report_lib.difference(acc, interval_spec=".3f"),
        f"{acc['detectable']:.3f}" if acc["detectable"] is not None
        else "n/a",
        (report_lib.difference(md, 0, interval_spec=".0f") if md is not None
         else "n/a (a seed never dropped)"),
        f"{t['logrank_p']:.3f}" if t["logrank_p"] is not None else "n/a"])
  return rows


def _verdict(c, v, ref, key, what, better_low):
  """One clause on `key` of variant `v` against `ref`, no stronger than
  its interval."""
  d = c[key]
  unit = f"{what} {v[key]['mean']:.3f} vs {ref[key]['mean']:.3f}"
  if d["ci95"] is None:
    return f"{unit} (one seed: no interval)"
  lo, hi = d["ci95"]
  ival = f"difference {d['diff']:+.3f}, 95% interval [{lo:.3f}, {hi:.3f}]"
  if d["excludes_0"]:
    worse = (d["diff"] > 0) == better_low
    return f"{unit}: {'worse' if worse else 'better'} ({ival})"
  return (f"{unit}: no difference resolved ({ival}; {v['seeds']} seeds per "
          f"variant detect a true difference of about "
          f"{d['detectable']:.3f} with 80% power, not a smaller one)")


def _conclusions(config, variants, comparisons):
  e = config.experiment
  by_key = {v["key"]: v for v in variants}
  ref = variants[0]
  lines = []
  t = ref["time_to_drop"]
  lines.append(
      f"* {ref['name']} (reference, {ref['params']} parameters): eval loss "
      f"{ref['eval_loss']['mean']:.3f} at step {config.train.num_steps}; "
      f"first eval step below {e.loss_threshold:g} per seed: "
      f"{_steps(t['per_seed'])}.")
  for c in comparisons:
    v, r = by_key[c["variant"]], by_key[c["reference"]]
    t = v["time_to_drop"]
    md = c["time_to_drop"]["mean_difference"]
    p = c["time_to_drop"]["logrank_p"]
    if md is not None and md["ci95"] is not None:
      drop = (f"mean first step {md['diff']:+.0f} relative to "
              f"{r['name']}, 95% interval "
              f"{report_lib.interval(md['ci95'], 0)}")
    else:
      drop = (f"{t['reached']}/{v['seeds']} seeds dropped by step "
              f"{t['censored_at']}, so no mean is taken")
    stuck = [(s, loss) for s, f, loss in zip(
        e.seeds, t["per_seed"], v["eval_loss"]["values"]) if f is None]
    split = (" Two outcomes: " + ", ".join(
        f"seed {s} never got below {e.loss_threshold:g} (final loss "
        f"{loss:.3f})" for s, loss in stuck)
             + f", while the other {len(e.seeds) - len(stuck)} did; the mean "
             "and its interval mix the two, so read the per-seed table."
             if stuck and len(stuck) < len(e.seeds) else "")
    lines.append(
        f"* {v['name']} against {r['name']} ({v['params']} parameters, "
        f"{_pct(v['params'], r['params'])}): "
        + _verdict(c, v, r, "eval_loss", "final eval loss", True) + "; "
        + _verdict(c, v, r, "generation_token_accuracy",
                   "cached-generation token accuracy", False)
        + f". First eval step below {e.loss_threshold:g} per seed: "
        f"{_steps(t['per_seed'])} ({drop}; log-rank p = "
        + (f"{p:.3f}" if p is not None else "n/a") + ")." + split)
  return lines


def _time_text(wall_s, reused) -> str:
  """How long `run` took; with reused runs, the analysis alone."""
  return (f"{wall_s / 60:.1f} min wall on this machine"
          + (", analysis only: finished runs were reused" if reused else ""))


def _report(config, variants, rows, comparisons, at_steps, wall_s,
            reused=False):
  e = config.experiment
  ref = variants[0]
  step_rows = [[v["name"]] + [
      f"{at_steps[v['key']][s]['mean']:.3f} ± "
      f"{at_steps[v['key']][s]['std']:.3f}"
      if at_steps[v['key']][s]["std"] is not None
      else f"{at_steps[v['key']][s]['mean']:.3f}" for s in e.report_steps]
               for v in variants]
  seed_rows = [[v["name"]] + [("-" if f is None else f)
                              for f in v["time_to_drop"]["per_seed"]]
               for v in variants]
  final_rows = [[v["name"]] + [
      f"{loss:.3f} ({acc:.3f})" for loss, acc in zip(
          v["eval_loss"]["values"],
          v["generation_token_accuracy"]["values"])] for v in variants]
  text = [
      f"# Sharing key/value heads: MHA, GQA and MQA on {config.task.name}",
      "", f"Command: `{COMMAND}` ({len(variants) * len(e.seeds)} runs, "
      f"{_time_text(wall_s, reused)}).", "",
      description(config, variants), "",
      "## Final numbers", "",
      report_lib.md_table(list(rows[0]), [list(r.values()) for r in rows]), "",
      "The unmatched rows are NOT matched in parameter count: sharing "
      "key/value heads removes parameters. The params-matched row widens "
      "every head of the shared-kv model (Dh) until its total parameter "
      "count is as close to MHA's as an even Dh allows (the params and "
      "cache columns give the exact counts); its cache is still smaller "
      "than MHA's.", "",
      f"## Each variant against {ref['name']} (and the params-matched "
      "variant against the unmatched one)", "",
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
      "## Every seed", "",
      f"Final eval loss per seed (cached-generation token accuracy in "
      f"brackets); the means above mix whatever outcomes these show:", "",
      report_lib.md_table(["variant"] + [f"seed {s} final" for s in e.seeds],
                      final_rows), "",
      f"First eval step with loss below {e.loss_threshold:g}, per seed (- : "
      f"not by step {config.train.num_steps}):", "",
      report_lib.md_table(["variant"] + [f"seed {s}" for s in e.seeds],
                      seed_rows), "",
      "![time_to_drop.png](time_to_drop.png)",
      "![time_to_drop_per_seed.png](time_to_drop_per_seed.png)", "",
      "Eval loss at intermediate evaluations of the same runs (mean ± "
      "sample std; one schedule, so each column is what a run stopped "
      "there would report):", "",
      report_lib.md_table(["variant"] + [f"step {s}" for s in e.report_steps],
                      step_rows), "",
      "![loss_curves.png](loss_curves.png)", "",
      f"Every head of the {ref['name']} model (seed {e.seeds[0]}) in a "
      f"browser, on the {e.generate_examples} held-out sequences its "
      "cached-generation prompts are cut from: "
      "[explorer.html](explorer.html). Another run's page, for example "
      f"seed {e.seeds[0]} of {variants[-1]['name']}: `python -m "
      "experiments.explore --workdir=runs/kv_behaviour/"
      f"{variants[-1]['key']}_seed{e.seeds[0]} --batch_from_task "
      f"--num_examples={e.generate_examples}`.", "",
      "## What this shows", ""] + _conclusions(config, variants,
                                                comparisons)
  return "\n".join(text)


def _figures(workdir, config, variants, per_seed):
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


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train every (variant, seed), measure, write; returns what results.json
  holds."""
  start = time.time()
  workdir = pathlib.Path(workdir)
  e = config.experiment
  specs = variant_specs(config)
  per_seed = {}
  for v in specs:
    for r in runs.seed_runs(config, workdir, e.seeds,
                            f"{v['key']}_seed{{seed}}", reuse=reuse_runs,
                            **{"model.num_kv_heads": v["num_kv_heads"],
                               "model.head_dim": v["head_dim"]}):
      per_seed[r.run_dir.name] = measure(r)
      if v is specs[0] and r.seed == e.seeds[0]:
        # The reference every variant is compared with, in a browser.
        _write_explorer(r, workdir, f"{v['name']} ({r.config.model.num_heads} "
                        f"query heads), seed {r.seed}")
  variants = kv_variants.summarise(specs, e.seeds, per_seed,
                                   config.train.num_steps)
  comparisons = [kv_variants.compare(r, v)
                 for r, v in comparison_pairs(variants)]
  at_steps = kv_variants.loss_at_steps(specs, e.seeds, per_seed,
                                       e.report_steps)
  rows = kv_variants.table_rows(variants, e.loss_threshold)
  _figures(workdir, config, variants, per_seed)
  wall_s = time.time() - start
  results = {"command": COMMAND, "description": description(config, specs),
             "runs": rows, "variants": variants, "comparisons": comparisons,
             "loss_at_steps": at_steps, "per_seed": per_seed,
             "wall_seconds": wall_s, "reused_runs": reuse_runs,
             "config": config.to_dict()}
  return report_lib.write_outputs(
      workdir, results,
      _report(config, variants, rows, comparisons, at_steps, wall_s,
              reuse_runs))


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
