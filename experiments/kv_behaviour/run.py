"""What sharing key/value heads costs, measuring: train every variant and
seed, measure each run, summarise and compare.

Shape letters: H query heads, K key/value heads, Dh head width, L layers.

`measure` trains one decoder per (variant, seed) through the shared loop,
measures each (`measure_run`: eval curve, cached generation, costs), writes
explorer.html of the first seed's MHA model, and returns the results dict
in the format `experiments.kv_cache --behaviour_results` reads ("runs":
one display row per variant, "variants": the numbers behind them).
"""

from __future__ import annotations

import math
import pathlib
import time

from experiments.kv_behaviour import variants as kv_variants
from mha_jax.interp import explorer
from mha_jax.measure import continuations
from mha_jax.measure import curves
from mha_jax.measure import report as report_lib
from mha_jax.measure import runs
from mha_jax.training import held_out
from mha_jax.training import train_state


def measure(config, workdir, *, reuse: bool = False,
            command: str | None = None) -> dict:
  """Train every (variant, seed), measure, summarise; returns the results
  dict ("command", the command line that ran as the report names it,
  "runs", "variants", "comparisons", "loss_at_steps", "per_seed", ...)."""
  start = time.time()
  workdir = pathlib.Path(workdir)
  e = config.experiment
  specs = variant_specs(config)
  per_seed = {}
  for v in specs:
    for r in runs.seed_runs(config, workdir, e.seeds,
                            f"{v['key']}_seed{{seed}}", reuse=reuse,
                            **{"model.num_kv_heads": v["num_kv_heads"],
                               "model.head_dim": v["head_dim"]}):
      per_seed[r.run_dir.name] = measure_run(r)
      if v is specs[0] and r.seed == e.seeds[0]:
        # The reference every variant is compared with, in a browser.
        _write_explorer(r, workdir, f"{v['name']} ({r.config.model.num_heads} "
                        f"query heads), seed {r.seed}")
  variants = kv_variants.summarise(specs, e.seeds, per_seed,
                                   config.train.num_steps)
  return {"command": report_lib.command("experiments.kv_behaviour", command),
          "description": description(config, specs),
          "runs": kv_variants.table_rows(variants, e.loss_threshold),
          "variants": variants,
          "comparisons": [kv_variants.compare(r, v)
                          for r, v in comparison_pairs(variants)],
          "loss_at_steps": kv_variants.loss_at_steps(
              specs, e.seeds, per_seed, e.report_steps),
          "per_seed": per_seed, "wall_seconds": time.time() - start,
          "reused_runs": reuse, "config": config.to_dict()}


def measure_run(run) -> dict:
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

  On the held-out sequences `measure_run` cuts its generation prompts from
  (same size and key), so the page's loss and accuracy are the run's
  teacher-forced numbers.
  """
  batch = held_out.analysis_batch(
      run.config, run.config.experiment.generate_examples,
      seed=held_out.ANALYSIS_SEED + run.seed)
  return explorer.write_explorer(
      run.state.model(), batch, pathlib.Path(workdir) / "explorer.html",
      loss=run.state.loss,
      init_model=train_state.create_train_state(run.config).model(),
      title=title)


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


def description(config, specs) -> str:
  """What was trained and measured, in a paragraph (results.json keeps it
  for `experiments.kv_cache --behaviour_results`)."""
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
