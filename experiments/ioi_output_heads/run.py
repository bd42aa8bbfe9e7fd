"""The output-head experiment's measurements: per-head direct effects on
every prompt, the groups chosen on the selection half, and on the
held-out half each group's joint effect against random groups of equal
size, its joint mean ablation, and copy suppression of its members.

Shape letters: N prompts, L layers, H query heads, M heads (flat, L * H),
G random groups, P names of the pool.

`measure` returns the results dict (every per-prompt number of the
held-out tests included); nothing here writes the report.
"""

from __future__ import annotations

import functools
import time

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.ioi_task import detectors
from experiments.ioi_task import forward
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from experiments.ioi_output_heads import ablation
from experiments.ioi_task import groups
from experiments.ioi_task import halves
from experiments.ioi_output_heads import head_effects
from experiments.ioi_output_heads import ov_circuit
from mha_jax.measure import bootstrap

META = ("end", "io", "s", "io_pos", "s1_pos", "s2_pos")
# Per-head measures summarised on each half ([M] means and intervals).
HEAD_MEASURES = ("effect", "io", "s", "other", "attention", "copy",
                 "io_specific", "s_specific", "agree")


@functools.partial(jax.jit, static_argnums=(0,))
def _effects(graphdef, state, tokens, meta, name_ids):
  model = nnx.merge(graphdef, state)
  logits, _ = forward.end_logits(model, tokens, meta["end"])
  return (head_effects.measure(model, tokens, meta, name_ids),
          forward.logit_diff(logits, meta["io"], meta["s"]))


@functools.partial(jax.jit, static_argnums=(0,))
def _ablated(graphdef, state, tokens, meta, means, mask):
  return ablation.ablated_logit_diff(nnx.merge(graphdef, state), tokens,
                                     meta, means, mask)


def effects(model, p, name_ids, *, chunk: int):
  """`({measure: [N, M]}, [N] logit difference)`: `head_effects.measure`
  on every prompt of `p`, `chunk` at a time, with the differences the
  groups read, and the model's own logit(IO) - logit(S) at END."""
  graphdef, state = nnx.split(model)
  parts, ld = [], []
  for i in range(0, len(p["end"]), chunk):
    meta = {k: jnp.asarray(p[k][i:i + chunk]) for k in META}
    got, diff = jax.tree.map(np.asarray, _effects(
        graphdef, state, jnp.asarray(p["tokens"][i:i + chunk]), meta,
        jnp.asarray(name_ids)))
    parts.append(got)
    ld.append(diff)
  m = {k: np.concatenate([x[k] for x in parts]).astype(np.float64)
       for k in parts[0]}
  m["attention"] = m["end_io"] - m["end_s"]
  m["io_specific"] = m["io"] - m["other"]
  m["s_specific"] = m["s"] - m["other"]
  return ({k: v.reshape(v.shape[0], -1) for k, v in m.items()},
          np.concatenate(ld).astype(np.float64))


def head_stats(m: dict, rows, draws: halves.Draws) -> dict:
  """`{measure: {"mean" [M], "ci95" [M, 2]}}` of `HEAD_MEASURES` on the
  prompts `rows`."""
  return {k: {"mean": m[k][rows].mean(0), "ci95": draws.ci(m[k][rows])}
          for k in HEAD_MEASURES}


def _head(i, n_h) -> list:
  return [int(i) // n_h, int(i) % n_h]


def _member(i, n_h, sel, held_summary) -> dict:
  """One group member: its selection-half numbers and held-out effect."""
  pick = lambda s: [float(s["mean"][i]), *map(float, s["ci95"][i])]
  return {"head": _head(i, n_h),
          "selection": {k: pick(sel[k]) for k in HEAD_MEASURES},
          "held_out": held_summary}


def confirm_group(members, m, rows, draws, pool, template, *, sign, e,
                  seed, ablate=None) -> dict:
  """A group's held-out test: its joint direct effect (the sum of its
  members' per-prompt effects) and that effect's logit(IO), logit(S) and
  other-names parts, beside `e.random_groups` random groups of the same
  size from `pool`; with `ablate(members) -> [N]` also the joint mean
  ablation's effect beside the random groups'."""
  joint = {k: m[k][rows][:, members].sum(1)
           for k in ("effect", "io", "s", "other")}
  rand = groups.random_groups(pool, len(members), e.random_groups, seed)
  rand_joint = m["effect"][rows][:, rand].sum(-1)  # [N, G]
  out = {"heads": [], "size": len(members),
         "random_heads": rand.tolist(),
         "joint": {k: draws.summary(v) for k, v in joint.items()},
         "random": {"per_group": rand_joint.mean(0),
                    "range95": np.percentile(rand_joint.mean(0), [2.5, 97.5]),
                    "mean": float(rand_joint.mean())},
         "minus_random": draws.summary(joint["effect"] - rand_joint.mean(1)),
         "by_template": halves.by_template(joint["effect"], template)}
  out["test"] = groups.as_far(float(joint["effect"].mean()),
                              rand_joint.mean(0), sign)
  side = (out["joint"]["effect"]["ci95"][0] > 0 if sign > 0
          else out["joint"]["effect"]["ci95"][1] < 0)
  out["confirmed"] = bool(side and out["test"]["p"] <= e.max_p)
  if ablate is not None:
    own = ablate(members)
    rand_ab = np.stack([ablate(r) for r in rand], 1)  # [N, G]
    out["ablation"] = {
        "joint": draws.summary(own),
        "random": {"per_group": rand_ab.mean(0), "mean": float(
            rand_ab.mean()), "range95": np.percentile(rand_ab.mean(0),
                                                      [2.5, 97.5])},
        "minus_random": draws.summary(own - rand_ab.mean(1)),
        "test": groups.as_far(float(own.mean()), rand_ab.mean(0), sign),
        "by_template": halves.by_template(own, template)}
  return out


def copy_suppression(tested, m, rows, draws, pool, ov, template, e) -> dict:
  """In context (the held-out prompts' `agree`) and through the OV
  circuit alone (`ov`: `ov_circuit.all_heads`' ranks `[M, P]`), each
  tested head beside the heads of `pool`; pass/fail by the config's
  criterion."""
  agree = m["agree"][rows]  # [N, M]
  top = (ov["vocab"] < e.cs_top_k).astype(np.float64)  # [M, P]
  share = top.mean(1)
  name_draws = bootstrap.draws(top.shape[1], e.resamples, e.seed + 7)
  pool_agree = agree[:, pool].mean(0)
  out = {"criterion": {"context_floor": e.cs_context_floor,
                       "ov_share": e.cs_ov_share, "top_k": e.cs_top_k},
         "baseline": {
             "agree_median": float(np.median(pool_agree)),
             "agree_p95": float(np.percentile(pool_agree, 95)),
             "ov_share_median": float(np.median(share[pool])),
             "ov_share_max": float(share[pool].max()),
             "heads": len(pool)},
         "heads": []}
  for i in tested:
    context = draws.summary(agree[:, i])
    ov_ci = bootstrap.interval(bootstrap.resampled_means(top[i],
                                                         name_draws))
    entry = {"head": _head(i, m["num_heads"]),
             "context": context,
             "context_by_template": halves.by_template(agree[:, i],
                                                       template),
             "ov_top_k_share": [float(share[i]), *map(float, ov_ci)],
             "ov_median_rank": float(np.median(ov["vocab"][i])),
             "ov_median_percentile": float(np.median(ov["vocab"][i])
                                           / ov["vocab_size"]),
             "ov_median_name_rank": float(np.median(ov["names"][i])),
             "ov_ranks": ov["vocab"][i]}
    entry["context_pass"] = bool(context["ci95"][0] > e.cs_context_floor)
    entry["ov_pass"] = bool(share[i] >= e.cs_ov_share)
    entry["passes"] = entry["context_pass"] and entry["ov_pass"]
    out["heads"].append(entry)
  return out


def _ablator(model, p, rows, ld, *, chunk: int):
  """`ablate(members) -> [N]`: on the prompts `rows` of `p`, the logit
  difference lost when the heads `members` (flat) take their ABC mean
  output (`ablation`); `ld [N]` the clean run's."""
  c = model.config
  graphdef, state = nnx.split(model)
  means = ablation.abc_means(model, p["corrupted"], p["template"],
                             chunk=chunk)
  means = [jnp.asarray(x[rows]) for x in means]
  meta = {k: jnp.asarray(p[k][rows]) for k in META}
  tokens = jnp.asarray(p["tokens"][rows])

  def ablate(members):
    mask = np.zeros(c.num_layers * c.num_heads, bool)
    mask[np.asarray(members)] = True
    got = _ablated(graphdef, state, tokens, meta, means,
                   jnp.asarray(mask.reshape(c.num_layers, c.num_heads)))
    return ld[rows] - np.asarray(got, np.float64)

  return ablate


def model_run(name: str, e) -> dict:
  """Everything of one model (module docstring)."""
  t0 = time.time()
  model, tok, prefix = models.load(name, seed=e.seed)
  c = model.config
  n_h = c.num_heads
  names = prompts.single_token_names(tok)
  p = prompts.build(tok, names, per_template_order=e.per_template_order,
                    seed=e.seed, prefix=prefix)
  name_ids = [names[n] for n in p["names"]]
  sel, held = halves.split(p["template"], p["order"],
                           share=e.selection_share, seed=e.seed)
  m, ld = effects(model, p, name_ids, chunk=e.chunk)
  m["num_heads"] = n_h
  ds = halves.Draws(p["template"][sel], resamples=e.resamples, seed=e.seed)
  dh = halves.Draws(p["template"][held], resamples=e.resamples,
                    seed=e.seed + 2)
  sel_stats = head_stats(m, sel, ds)
  floor = float(np.mean(detectors.uniform_floors(
      prompts.subset(p, sel))["end_io"]))
  admitted = groups.candidates(
      {k: sel_stats[k]["mean"] for k in ("effect",)},
      {k: sel_stats[k]["ci95"] for k in ("attention", "copy", "s_specific")},
      floor=floor)
  chosen = {k: groups.grow(sel_stats["effect"]["mean"],
                           sel_stats["effect"]["ci95"], admitted[k],
                           sign=groups.SIGN[k],
                           relative_floor=e.relative_floor,
                           max_group=e.max_group) for k in groups.KINDS}
  named = sorted({i for v in chosen.values() for i in v})
  pool = np.setdiff1d(np.arange(c.num_layers * n_h), named)
  held_stats = head_stats(m, held, dh)
  ablate = _ablator(model, p, held, ld, chunk=e.chunk) if e.ablate else None
  out_groups = {}
  for j, kind in enumerate(groups.KINDS):
    members = chosen[kind]
    if not members:
      out_groups[kind] = {"heads": [], "size": 0}
      continue
    g = confirm_group(members, m, held, dh, pool, p["template"][held],
                      sign=groups.SIGN[kind], e=e, seed=e.seed + 10 + j,
                      ablate=ablate)
    g["heads"] = [_head(i, n_h) for i in members]
    g["members"] = [_member(i, n_h, sel_stats, dh.summary(
        m["effect"][held][:, i])) for i in members]
    g["random_heads"] = [[_head(i, n_h) for i in r]
                         for r in g["random_heads"]]
    out_groups[kind] = g
  ov = jax.tree.map(np.asarray, ov_circuit.all_heads(model, name_ids))
  ov = {k: v.reshape(-1, v.shape[-1]) for k, v in ov.items()}
  ov["vocab_size"] = c.vocab_size
  cs = copy_suppression(named, m, held, dh, pool, ov, p["template"][held],
                        e)
  order = np.argsort(-sel_stats["effect"]["mean"])
  top = lambda idx: [{"head": _head(i, n_h),
                      **{k: [float(sel_stats[k]["mean"][i]),
                             *map(float, sel_stats[k]["ci95"][i])]
                         for k in HEAD_MEASURES},
                      "held_out_effect": float(held_stats["effect"]["mean"][i])}
                     for i in idx]
  return {
      "layers": c.num_layers, "heads": n_h, "num_names": len(name_ids),
      "num_prompts": len(p["end"]), "selection": sel.tolist(),
      "held_out": held.tolist(), "example": p["texts"][:2],
      "uniform_floor": floor,
      "task": {"selection": ds.summary(ld[sel]),
               "held_out": dh.summary(ld[held]),
               "held_out_by_template": halves.by_template(
                   ld[held], p["template"][held])},
      "candidates": {k: int(v.sum()) for k, v in admitted.items()},
      "groups": out_groups, "copy_suppression": cs,
      "top_positive": top(order[:10]), "top_negative": top(order[::-1][:5]),
      "heads_selection": sel_stats, "heads_held_out": held_stats,
      "pool_size": len(pool), "seconds": time.time() - t0}


def measure(config) -> dict:
  """Every model of the config (module docstring)."""
  e = config.experiment
  t0 = time.time()
  out = {"models": {}}
  for name in e.models:
    out["models"][name] = model_run(name, e)
    logging.info("ioi_output_heads: %s took %.0f s", name,
                 out["models"][name]["seconds"])
  out["wall_s"] = time.time() - t0
  # CPU time of this process: on shared cores the wall time says more
  # about the neighbours than about the run.
  out["cpu_s"] = time.process_time()
  out["backend"] = jax.default_backend()
  return out
