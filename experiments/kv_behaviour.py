r"""What sharing key/value heads costs a trained model: MHA vs GQA vs MQA.

  python -m experiments.kv_behaviour --workdir=runs/kv_behaviour
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/kv_behaviour/results.json

Trains one decoder per (K, seed) of `configs/kv_behaviour.py` through the
shared training loop (same task, steps, data and initial seed for every K),
then measures on held-out data: the eval loss and accuracy of the training
loop, the first eval step below `experiment.loss_threshold`, and the
accuracy of free-running generation with the KV cache (each model continues
held-out prompts; `mha_jax.continuations`). Writes report.md and
results.json; results.json is in the format `experiments.kv_cache
--behaviour_results` reads ("runs": one row per variant, "variants": the
numbers behind them).

Shape letters: H query heads, K key/value heads, Dh head width, L layers.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments import common
from mha_jax import continuations
from mha_jax import curves
from mha_jax import kv_variants
from mha_jax import runs

COMMAND = "python -m experiments.kv_behaviour --workdir=runs/kv_behaviour"

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/kv_behaviour.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/kv_behaviour", "Output folder: report.md, results.json "
    "and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")


def measure(run) -> dict:
  """One trained `runs.SeedRun`'s numbers (see `kv_variants.summarise`)."""
  e = run.config.experiment
  model = run.state.model()
  steps, losses = curves.read(run.run_dir, "eval", "loss")
  _, accs = curves.read(run.run_dir, "eval", "accuracy")
  gen = continuations.evaluate_generation(
      model, run.config, num_examples=e.generate_examples)
  params, cache_bytes = kv_variants.model_costs(model)
  return {"eval_loss": losses[-1], "eval_accuracy": accs[-1],
          "first_step_below": curves.first_below(steps, losses,
                                                 e.loss_threshold),
          "generation_token_accuracy": gen["token_accuracy"],
          "generation_sequence_accuracy": gen["sequence_accuracy"],
          "teacher_forced_accuracy": gen["teacher_forced_accuracy"],
          "attention_params_per_layer": params,
          "cache_bytes_per_token": cache_bytes,
          "curve": {"steps": steps, "loss": losses}}


def description(config):
  m, t, tr, e = config.model, config.task, config.train, config.experiment
  return (
      f"{m.num_layers}-layer {'attention-only ' if m.attention_only else ''}"
      f"decoders, D={m.d_model}, H={m.num_heads}, Dh={m.d_model // m.num_heads}"
      f", {m.positions} positions, trained on the {t.name} task (T={t.seq_len}"
      f", V={t.vocab_size}, repeated segments of {t.min_segment}-"
      f"{t.max_segment} tokens) for {tr.num_steps} steps of batch "
      f"{t.batch_size}, seeds {tuple(e.seeds)}; only K differs. Cells are "
      f"mean ± std [min, max] over seeds. Eval loss/accuracy: the training "
      f"loop's held-out evaluation on the scored (predictable) tokens of the "
      f"repeat. Cached generation: each model continues "
      f"{e.generate_examples} held-out prompts (cut before the first scored "
      f"token) greedily with its KV cache; token accuracy over the scored "
      f"tokens, and the fraction of continuations entirely right. "
      f"Teacher-forced: the same scored tokens predicted from the true "
      f"sequence (not the model's own output), so the gap to cached "
      f"generation is errors compounding in free-running decoding.")


def _report(config, variants, rows):
  text = [f"# Sharing key/value heads: MHA, GQA and MQA on "
          f"{config.task.name}", "", f"Command: `{COMMAND}`", "",
          description(config), "",
          common.md_table(list(rows[0]), [list(r.values()) for r in rows]),
          "", "Per-seed first eval step below the threshold: "
          + "; ".join(f"{v['name']} {v['first_step_below']['per_seed']}"
                      for v in variants) + "."]
  return "\n".join(text)


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train every (K, seed), measure, write; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  e = config.experiment
  per_seed = {}
  for k in e.kv_heads:
    for r in runs.seed_runs(config, workdir, e.seeds, f"K{k}_seed{{seed}}",
                            reuse=reuse_runs, **{"model.num_kv_heads": k}):
      per_seed[r.run_dir.name] = measure(r)
  variants = kv_variants.summarise(config.model.num_heads, e.kv_heads,
                                   e.seeds, per_seed)
  rows = kv_variants.table_rows(variants, e.loss_threshold)
  results = {"command": COMMAND, "description": description(config),
             "runs": rows, "variants": variants, "per_seed": per_seed,
             "config": config.to_dict()}
  return common.write_outputs(workdir, results,
                              _report(config, variants, rows))


def main(argv):
  common.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
