"""Measure Wang et al.'s criteria and the backup heads of each model's
IOI circuit; returns the results dict (no report here).

Shape letters: N prompts, L layers, H query heads, R bootstrap resamples.

F(S) is the mean over prompts of logit(IO) - logit(S) at END with every
head outside the set S knocked out (`knockout`): F(M) the whole model,
F(C) the circuit. Wang et al. (2022, section 4):
  faithfulness  F(C) close to F(M): here F(C) / F(M), beside random
                head sets of |C| heads drawn from the heads outside C;
  completeness  for subsets K of C, F(C \\ K) close to F(M \\ K) (a
                complete circuit loses what the model loses): here K is
                each class and random halves of C;
  minimality    for each head v of C some K with F(C \\ K) - F(C \\ (K +
                v)) large: here K empty and K the rest of v's class.
Every value is kept per prompt; intervals are 95% percentile bootstraps
over prompts (one set of draws per model, so differences are paired) and,
for the main ratios, over templates (whole templates drawn).
"""

from __future__ import annotations

import functools
import json
import pathlib
import time

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.ioi_task import circuit as circuit_lib
from experiments.ioi_task import detectors
from experiments.ioi_task import forward
from experiments.ioi_task import knockout
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from experiments.ioi_task import stats
from mha_jax.measure import bootstrap

def classes_from(results: dict, model: str) -> dict:
  """`{label: [[layer, head], ...]}`: the ioi run's non-empty classes of
  `model` (its results.json, loaded)."""
  if model not in results.get("circuits", {}):
    raise ValueError(f"classes_from: the ioi results hold circuits for "
                     f"{sorted(results.get('circuits', {}))}, not {model!r}")
  return circuit_lib.classes(results["circuits"][model])


@functools.partial(jax.jit, static_argnums=0)
def _z(graphdef, state, tokens, end):
  return knockout.captured_z(nnx.merge(graphdef, state), tokens, end)


@functools.partial(jax.jit, static_argnums=0)
def _knocked(graphdef, state, tokens, end, io, s, replacement, keep):
  return knockout.knocked_logit_diff(nnx.merge(graphdef, state), tokens,
                                     end, io, s, replacement, keep)


@functools.partial(jax.jit, static_argnums=0)
def _dla(graphdef, state, tokens, meta, name_ids, replacement, keep):
  return detectors.measure(nnx.merge(graphdef, state), tokens, meta,
                           name_ids,
                           patch=knockout.patch(replacement, keep))["dla"]


def ratio(num, den, idx, weights) -> dict:
  """mean(num) / mean(den) (`[N]` each) with its interval over prompts
  (draws `idx [R, N]`) and over templates (counts `weights [R, N]`)."""
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  by_prompt = (bootstrap.resampled_means(num, idx)
               / bootstrap.resampled_means(den, idx))
  by_template = (bootstrap.weighted_means(num, weights)
                 / bootstrap.weighted_means(den, weights))
  return {"value": float(num.mean() / den.mean()),
          "ci95": bootstrap.interval(by_prompt).tolist(),
          "ci95_templates": bootstrap.interval(by_template).tolist()}


def _heads(pairs) -> list:
  return [[int(l), int(h)] for l, h in pairs]


def criteria(run, replacements, classes, shape, e, idx, weights) -> dict:
  """Faithfulness (mean and resample ablation, random circuits),
  completeness and minimality of the circuit `classes` on one model's
  prompts. `run(replacement, keep [L, H]) -> [N]` logit differences;
  `replacements`: `{"mean": ..., "resample": ...}`, each `[L, N, T, H,
  Dv]`; the mean one serves every criterion, the resampled one the
  circuit's faithfulness too."""
  circuit = circuit_lib.union(classes)
  f = lambda keep, rep="mean": run(replacements[rep], keep)
  full = f(np.ones(shape, bool))
  c_mask = knockout.circuit_mask(shape, circuit)
  out = {"circuit": _heads(circuit), "size": len(circuit),
         "classes": classes, "full": stats.summary(full, idx),
         "empty": stats.summary(f(np.zeros(shape, bool)), idx)}
  for name in ("mean", "resample"):
    fc = f(c_mask, name)
    out[name] = {"circuit": stats.summary(fc, idx),
                 "fraction": ratio(fc, full, idx, weights),
                 "gap": stats.summary(full - fc, idx)}
  # Random circuits of the same size, from the heads outside C.
  rng = np.random.default_rng(e.seed)
  outside = [(l, h) for l in range(shape[0]) for h in range(shape[1])
             if not c_mask[l, h]]
  rand = []
  for _ in range(e.random_circuits):
    pick = rng.choice(len(outside), size=len(circuit), replace=False)
    heads = [outside[i] for i in sorted(pick)]
    fr = f(knockout.circuit_mask(shape, heads))
    rand.append({"heads": _heads(heads), "mean": float(fr.mean()),
                 "fraction": float(fr.mean() / full.mean())})
  fractions = np.asarray([r["fraction"] for r in rand])
  out["random"] = {
      "draws": rand, "fraction_mean": float(fractions.mean()),
      "fraction_std": float(fractions.std(ddof=1)),
      "fraction_max": float(fractions.max()),
      "at_or_above_circuit": int(
          (fractions >= out["mean"]["fraction"]["value"]).sum())}
  # Completeness: each class, then random subsets of C (each head in with
  # probability 1/2), neither empty nor all of C, each new.
  ks = [(f"class: {label}", heads) for label, heads in classes.items()]
  seen = {frozenset(map(tuple, heads)) for _, heads in ks}
  left = 2 ** len(circuit) - 2 - len(seen - {frozenset(circuit)})
  for i in range(min(e.random_subsets, left)):
    half = frozenset()
    while not 0 < len(half) < len(circuit) or half in seen:
      half = frozenset(circuit[j] for j in np.flatnonzero(
          rng.random(len(circuit)) < 0.5))
    seen.add(half)
    ks.append((f"random subset {i + 1}", sorted(half)))
  complete = []
  for label, k in ks:
    without_c = f(c_mask & knockout.keep_mask(shape, k))
    without_m = f(knockout.keep_mask(shape, k))
    complete.append({"k": label, "heads": _heads(k),
                     "circuit_minus_k": stats.summary(without_c, idx),
                     "model_minus_k": stats.summary(without_m, idx),
                     "difference": stats.summary(without_c - without_m,
                                                 idx)})
  out["completeness"] = complete
  worst = max(complete, key=lambda c: abs(c["difference"]["mean"]))
  out["completeness_worst"] = {
      "k": worst["k"],
      "fraction": abs(worst["difference"]["mean"]) / float(full.mean())}
  # Minimality: each head alone, and after the rest of its class.
  first_class = {}
  for label, heads in classes.items():
    for l, h in heads:
      first_class.setdefault((l, h), (label, heads))
  minimal = []
  for v in circuit:
    label, heads = first_class[v]
    rest = [tuple(x) for x in heads if tuple(x) != v]
    row = {"head": _heads([v])[0], "class": label, "k": []}
    for k in ([], rest) if rest else ([],):
      before = f(c_mask & knockout.keep_mask(shape, k))
      after = f(c_mask & knockout.keep_mask(shape, k + [v]))
      row["k"].append({"heads": _heads(k),
                       "change": stats.summary(before - after, idx)})
    minimal.append(row)
  out["minimality"] = minimal
  return out


def backup(dla, knocked, shape, e, idx_half_b, before=None) -> dict:
  """Which heads take over when the output heads `knocked` are knocked
  out: `dla(keep [L, H]) -> [N, L, H]` direct effects. Heads are ranked by
  their mean change on the even prompts (half A) and measured on the odd
  ones (half B), so the choice does not inflate the measured change."""
  keep = knockout.keep_mask(shape, knocked)
  if before is None:  # the intact model's, shared by every group
    before = np.asarray(dla(np.ones(shape, bool)), np.float64)
  after = np.asarray(dla(keep), np.float64)
  change = after - before  # [N, L, H]
  a, b = change[0::2], change[1::2]
  score = np.where(keep, a.mean(0), -np.inf).reshape(-1)
  top = np.argsort(-score)[:e.backup_top]
  rows = []
  for flat in top:
    l, h = divmod(int(flat), shape[1])
    rows.append({"head": [l, h],
                 "before": stats.summary(before[1::2, l, h], idx_half_b),
                 "after": stats.summary(after[1::2, l, h], idx_half_b),
                 "change": stats.summary(b[:, l, h], idx_half_b)})
  knocked_dla = sum(before[1::2, l, h] for l, h in knocked)
  others = np.where(keep[None], change, 0.0).sum((1, 2))[1::2]
  return {"knocked": _heads(knocked), "heads": rows,
          "knocked_direct_before": stats.summary(knocked_dla, idx_half_b),
          "others_change": stats.summary(others, idx_half_b)}


def measure_model(name, classes, e) -> dict:
  """Every measure of one model."""
  t0 = time.time()
  model, tok, prefix = models.load(name, seed=e.seed)
  names = prompts.single_token_names(tok)
  p = prompts.build(tok, names, per_template_order=e.per_template_order,
                    seed=e.prompt_seed, prefix=prefix)
  n = len(p["end"])
  graphdef, state = nnx.split(model)
  tokens, abc = jnp.asarray(p["tokens"]), jnp.asarray(p["corrupted"])
  end, io, s = (jnp.asarray(p[k]) for k in ("end", "io", "s"))
  z_abc = np.asarray(_z(graphdef, state, abc, end))
  partners = knockout.resample_partners(p["template"], e.seed)

  def run(replacement, keep):
    return np.asarray(_knocked(graphdef, state, tokens, end, io, s,
                               replacement, jnp.asarray(keep)), np.float64)

  replacements = {
      "mean": jnp.asarray(knockout.template_means(z_abc, p["template"])),
      "resample": jnp.asarray(z_abc[:, partners])}
  c = model.config
  shape = (c.num_layers, c.num_heads)
  idx = bootstrap.draws(n, e.resamples, e.seed)
  weights, _ = bootstrap.group_weights(p["template"], resamples=e.resamples,
                                       seed=e.seed)
  logits, _ = forward.end_logits(model, abc, end)
  out = {"model": name, "num_prompts": n, "layers": c.num_layers,
         "heads": c.num_heads, "prompt_seed": e.prompt_seed,
         "example": p["texts"][:2],
         "abc": stats.summary(np.asarray(forward.logit_diff(logits, io, s)),
                              idx)}
  out |= criteria(run, replacements, classes, shape, e, idx, weights)
  full = np.asarray(out["full"]["per_prompt"])
  circuit = np.asarray(out["mean"]["circuit"]["per_prompt"])
  out["templates"] = [
      {"template": int(t), "full": float(full[p["template"] == t].mean()),
       "circuit": float(circuit[p["template"] == t].mean())}
      for t in np.unique(p["template"])]
  groups = backup_groups(e, name, classes)
  out["backup"] = []
  if groups:
    meta = {k: jnp.asarray(p[k]) for k in ("end", "io", "s", "s1_pos",
                                           "s2_pos", "io_pos")}
    name_ids = jnp.asarray([names[x] for x in p["names"]])
    dla = lambda keep: _dla(graphdef, state, tokens, meta, name_ids,
                            replacements["mean"], jnp.asarray(keep))
    half_b = bootstrap.draws(len(full[1::2]), e.resamples, e.seed + 1)
    before = np.asarray(dla(np.ones(shape, bool)), np.float64)
    for label, heads in groups:
      out["backup"].append({"group": label} | backup(
          dla, [tuple(x) for x in heads], shape, e, half_b, before))
  out["seconds"] = time.time() - t0
  return out


def backup_groups(e, name: str, classes: dict) -> list:
  """`[(label, heads)]` knocked out in turn for the backup measure: the
  circuit's output heads, then the name-mover group that
  `e.name_mover_results` (the ioi_output_heads run's results.json) holds
  for `name`, where there is one."""
  groups = []
  if classes.get("output heads"):
    groups.append(("output heads", classes["output heads"]))
  if e.name_mover_results:
    saved = json.loads(pathlib.Path(e.name_mover_results).read_text())
    movers = saved["models"].get(name, {}).get("groups", {}).get(
        "name_movers", {}).get("heads", [])
    if movers:
      groups.append(("name movers (ioi_output_heads)", movers))
  return groups


SOURCES = ("held_out", "ioi")


def circuits_of(e) -> dict:
  """`{model: classes}` for every model of the run: `e.circuits[model]`
  (keyed as the ioi results' classes, `name_movers` ...) where given;
  else, by `e.circuit_source`, the classes chosen on one half of 128
  prompts and confirmed on the other ("held_out": `e.name_mover_results`
  and `e.classes_results`) or the ioi run's 16-prompt classes ("ioi":
  `e.circuit_results`)."""
  if e.circuit_source not in SOURCES:
    raise ValueError(f"circuits_of: `circuit_source` must be one of "
                     f"{SOURCES}, got {e.circuit_source!r}")
  read = lambda path: (json.loads(pathlib.Path(path).read_text())
                       if path else {"circuits": {}, "models": {}})
  saved = read(e.circuit_results if e.circuit_source == "ioi" else "")
  out = {}
  for name in e.models:
    given = e.circuits.get(name)
    if given is not None:
      known = [key for _, key, _ in circuit_lib.CLASSES]
      if set(given) - set(known):
        raise ValueError(f"circuits_of: `circuits.{name}` may name the "
                         f"classes {known}, got {sorted(given)}")
      entry = {}
      for where, key, _ in circuit_lib.CLASSES:
        if key in given:
          (entry if where is None else entry.setdefault(where, {}))[key] = {
              "heads": list(given[key])}
      out[name] = circuit_lib.classes(entry)
    elif e.circuit_source == "held_out":
      out[name] = circuit_lib.held_out_classes(
          read(e.name_mover_results), read(e.classes_results), name)
    else:
      out[name] = classes_from(saved, name)
  return out


def measure(config) -> dict:
  e = config.experiment
  t_start = time.time()
  out = {"models": {}}
  for name, classes in circuits_of(e).items():
    logging.info("ioi_circuit: %s, circuit of %d heads", name,
                 len(circuit_lib.union(classes)))
    out["models"][name] = measure_model(name, classes, e)
  out["wall_s"] = time.time() - t_start
  out["cpu_s"] = time.process_time()
  out["backend"] = jax.default_backend()
  return out
