r"""What sharing key/value heads costs a trained model: MHA vs GQA vs MQA.

  python -m experiments.kv_behaviour --workdir=runs/kv_behaviour
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/kv_behaviour/results.json

Trains one decoder per (K, seed) of `configs/kv_behaviour.py` through the
shared training loop (same task, steps, data and initial seed for every K),
then measures on held-out data: the eval loss and accuracy of the training
loop, the first eval step below `experiment.loss_threshold`, and the
accuracy of free-running generation with the KV cache (each model continues
held-out prompts; `experiments.generate`). Writes report.md and
results.json; results.json is in the format `experiments.kv_cache
--behaviour_results` reads ("runs": one row per variant, "variants": the
numbers behind them).

Shape letters: H query heads, K key/value heads, Dh head width, L layers.
"""

from __future__ import annotations

import pathlib

import numpy as np

from configs import kv_behaviour as kv_behaviour_config
from experiments import common
from experiments import generate as generate_experiment

COMMAND = "python -m experiments.kv_behaviour --workdir=runs/kv_behaviour"


def variant_name(h: int, k: int) -> str:
  if k == h:
    return "MHA"
  return "MQA" if k == 1 else f"GQA (H/{h // k})"


def first_below(steps, losses, threshold):
  """The first step whose eval loss is below `threshold` (None: never)."""
  for s, v in zip(steps, losses):
    if v < threshold:
      return s
  return None


def model_costs(model):
  """Attention parameters per layer and KV-cache bytes per token (all
  layers, the cache dtype), read from the arrays themselves."""
  attn = model.blocks[0].attn
  params = sum(int(np.prod(a.shape)) for a in attn.core_params().values())
  caches = model.init_cache(batch=1)
  per_token = sum(c.k.nbytes + c.v.nbytes for c in caches) / caches[0].max_len
  return params, per_token


def run_one(config, run_dir):
  e = config.experiment
  state = common.train_run(config, run_dir)
  model = state.model()
  steps, losses = common.curve(run_dir, "eval", "loss")
  _, accs = common.curve(run_dir, "eval", "accuracy")
  gen = generate_experiment.evaluate_generation(
      model, config, num_examples=e.generate_examples)
  params, cache_bytes = model_costs(model)
  return {"eval_loss": losses[-1], "eval_accuracy": accs[-1],
          "first_step_below": first_below(steps, losses, e.loss_threshold),
          "generation_token_accuracy": gen["token_accuracy"],
          "generation_sequence_accuracy": gen["sequence_accuracy"],
          "teacher_forced_accuracy": gen["teacher_forced_accuracy"],
          "attention_params_per_layer": params,
          "cache_bytes_per_token": cache_bytes,
          "curve": {"steps": steps, "loss": losses}}


def summarise(config, per_seed):
  """One row of means and spreads per K, in the order of `kv_heads`."""
  e, h = config.experiment, config.model.num_heads
  variants = []
  for k in e.kv_heads:
    rs = [per_seed[f"K{k}_seed{s}"] for s in e.seeds]
    row = {"name": variant_name(h, k), "num_kv_heads": k,
           "seeds": len(rs),
           "attention_params_per_layer": rs[0]["attention_params_per_layer"],
           "cache_bytes_per_token": rs[0]["cache_bytes_per_token"]}
    for key in ("eval_loss", "eval_accuracy", "teacher_forced_accuracy",
                "generation_token_accuracy", "generation_sequence_accuracy"):
      vals = [r[key] for r in rs]
      row[key] = {"mean": float(np.mean(vals)), "std": float(np.std(vals)),
                  "min": float(np.min(vals)), "max": float(np.max(vals))}
    reached = [r["first_step_below"] for r in rs
               if r["first_step_below"] is not None]
    row["first_step_below"] = {
        "reached": len(reached),
        "mean": float(np.mean(reached)) if reached else None,
        "per_seed": [r["first_step_below"] for r in rs]}
    variants.append(row)
  return variants


def _spread(stat, digits=3):
  return (f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f} "
          f"[{stat['min']:.{digits}f}, {stat['max']:.{digits}f}]")


def table_rows(config, variants):
  """Rows for `experiments.kv_cache`'s table: display strings only."""
  e = config.experiment
  rows = []
  for v in variants:
    fs = v["first_step_below"]
    rows.append({
        "variant": v["name"], "K": v["num_kv_heads"],
        "attn params/layer": v["attention_params_per_layer"],
        "cache B/token": f"{v['cache_bytes_per_token']:.0f}",
        "eval loss": _spread(v["eval_loss"]),
        "eval accuracy": _spread(v["eval_accuracy"]),
        "teacher-forced acc (same prompts)": _spread(
            v["teacher_forced_accuracy"]),
        "cached generation: token acc": _spread(
            v["generation_token_accuracy"]),
        "whole continuation right": _spread(
            v["generation_sequence_accuracy"]),
        f"first step loss < {e.loss_threshold:g}": (
            f"{fs['mean']:.0f} ({fs['reached']}/{v['seeds']} seeds)"
            if fs["reached"] else f"never (0/{v['seeds']})"),
    })
  return rows


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


def run(config, workdir):
  workdir = pathlib.Path(workdir)
  e = config.experiment
  per_seed = {}
  for k in e.kv_heads:
    for seed in e.seeds:
      name = f"K{k}_seed{seed}"
      c = common.variant(config, **{"model.num_kv_heads": k,
                                    "train.seed": seed})
      per_seed[name] = run_one(c, workdir / name)
  variants = summarise(config, per_seed)
  rows = table_rows(config, variants)
  results = {"command": COMMAND, "description": description(config),
             "runs": rows, "variants": variants, "per_seed": per_seed,
             "config": config.to_dict()}
  common.write_outputs(workdir, results, _report(config, variants, rows))
  return results


if __name__ == "__main__":
  common.app_main(run, kv_behaviour_config.get_config, "kv_behaviour")
