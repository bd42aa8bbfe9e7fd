"""The EAP experiment's measurements: edge scores by EAP and EAP-IG on
the scoring prompts (each compiled apart from its run, so the two times
are separate), then the exact metric of the top-|score| circuits, of
random circuits of the same sizes and of the hand-built circuit on the
held-out prompts, under each ablation.

Shape letters: N prompts, T tokens, V vocabulary, S senders, R receivers,
M circuits, K circuit sizes.

`measure` returns the results dict (per-prompt metrics included);
nothing here writes the report.
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

from experiments.eap_ioi import circuits
from experiments.ioi_task import forward
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from experiments.ioi_task import stats
from mha_jax.interp import eap
from mha_jax.interp import eap_graph
from mha_jax.measure import bootstrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
METHODS = eap.METHODS  # ("eap", "eap-ig")
TOP_EDGES = 20  # the strongest edges of each method listed in the report


def per_prompt_metric(end, io, s):
  """logits `[N, T, V]` -> `[N]`: logit(IO) - logit(S) at each prompt's
  END (right padding is never read: attention is causal)."""
  def metric(logits):
    return forward.logit_diff(logits[jnp.arange(logits.shape[0]), end], io,
                              s)
  return metric


@functools.partial(jax.jit, static_argnums=(0, 7, 8))
def _scores(graphdef, state, clean, corrupted, end, io, s, method, steps):
  m = per_prompt_metric(end, io, s)
  return eap.edge_scores(nnx.merge(graphdef, state), clean, corrupted,
                         lambda logits: jnp.mean(m(logits)), method=method,
                         steps=steps)


@functools.partial(jax.jit, static_argnums=(0, 8))
def _circuits(graphdef, state, clean, corrupted, mean_inputs, end, io, s,
              ablation, masks):
  mean = ablation == "mean"
  return eap.circuit_metric(
      nnx.merge(graphdef, state), clean, None if mean else corrupted,
      per_prompt_metric(end, io, s), masks, ablation=ablation,
      mean_inputs=mean_inputs if mean else None)


@functools.partial(jax.jit, static_argnums=(0,))
def _logit_diff(graphdef, state, tokens, end, io, s):
  logits, _ = forward.end_logits(nnx.merge(graphdef, state), tokens, end)
  return forward.logit_diff(logits, io, s)


def _args(p):
  return tuple(jnp.asarray(p[k]) for k in ("tokens", "corrupted", "end",
                                            "io", "s"))


def timed_scores(graphdef, state, p, method: str, steps: int):
  """`(EdgeScores, {"prompts", "compile_s", "run_s"})`: compiled first
  (lowering and XLA), then run to completion and timed apart."""
  clean, corrupted, end, io, s = _args(p)
  t0 = time.perf_counter()
  compiled = _scores.lower(graphdef, state, clean, corrupted, end, io, s,
                           method, steps).compile()
  t1 = time.perf_counter()
  scores = jax.block_until_ready(compiled(state, clean, corrupted, end, io,
                                          s))
  t2 = time.perf_counter()
  logging.info("eap_ioi: %s on %d prompts: compile %.0f s, run %.0f s",
               method, len(end), t1 - t0, t2 - t1)
  return scores, {"prompts": int(len(end)), "compile_s": t1 - t0,
                  "run_s": t2 - t1, "steps": steps if method != "eap" else 1}


def hand_built(e) -> list[list[int]]:
  """The hand-built circuit's heads: from the IOI results file the config
  names (its circuit for `e.model`), else the config's own list."""
  if not e.hand_built_from:
    return [list(h) for h in e.hand_built_heads]
  saved = json.loads((ROOT / e.hand_built_from).read_text())
  if e.model not in saved["circuits"]:
    raise ValueError(f"hand_built: {e.hand_built_from} holds no circuit "
                     f"for model {e.model!r} (it has "
                     f"{sorted(saved['circuits'])})")
  return circuits.hand_built_heads(saved["circuits"][e.model])


def _sizes(num_edges: int, fractions) -> list[int]:
  """The edge count of each fraction (at least 1 edge)."""
  return [max(1, int(round(f * num_edges))) for f in fractions]


def masks_to_run(scores: dict, graph, e, hand_mask) -> dict:
  """`{name: [M_name, S, R] bool}`: each method's top-|score| circuits at
  `e.fractions`, `e.random_draws` random circuits of each of those sizes,
  the empty circuit, the hand-built one, and the top-|score| EAP-IG
  circuit and random circuits of the hand-built one's edge count."""
  counts = _sizes(graph.num_edges, e.fractions)
  k_hand = int(hand_mask.sum())
  out = {m: np.asarray(eap_graph.top_edges(scores[m], counts))
         for m in METHODS}
  rnd = circuits.random_masks(graph, counts + [k_hand], e.random_draws,
                              e.seed)
  out["random"] = rnd[:-1].reshape((-1,) + graph.shape)  # size-major
  out["empty"] = np.zeros((1,) + graph.shape, bool)
  out["hand"] = hand_mask[None]
  out["eap-ig_at_hand"] = np.asarray(eap_graph.top_edges(scores["eap-ig"],
                                                         [k_hand]))
  out["random_at_hand"] = rnd[-1]
  return out


def evaluate(graphdef, state, pe, mean_tokens, ablation, masks) -> dict:
  """`{name: [M_name, N]}` per-prompt metrics of every circuit in `masks`
  on the held-out prompts `pe`, in one compiled call."""
  names = list(masks)
  sizes = [len(masks[n]) for n in names]
  clean, corrupted, end, io, s = _args(pe)
  t0 = time.perf_counter()
  m = np.asarray(_circuits(graphdef, state, clean, corrupted,
                           jnp.asarray(mean_tokens), end, io, s, ablation,
                           jnp.asarray(np.concatenate([masks[n]
                                                       for n in names]))))
  logging.info("eap_ioi: %d circuits (%s ablation) took %.0f s", len(m),
               ablation, time.perf_counter() - t0)
  parts = np.split(m, np.cumsum(sizes)[:-1])
  return dict(zip(names, parts)), time.perf_counter() - t0


def curves(m: dict, m_clean, e, idx) -> dict:
  """Each method's and each random draw's faithfulness curve, and the
  hand-built comparison, from `evaluate`'s per-prompt metrics."""
  k = len(e.fractions)
  empty = m["empty"][0]
  one = functools.partial(circuits.curve, m_empty=empty, m_clean=m_clean,
                          fractions=e.fractions, idx=idx)
  rnd = m["random"].reshape(k, e.random_draws, -1)
  hand = np.concatenate([m["hand"], m["eap-ig_at_hand"],
                         m["random_at_hand"]])
  f = circuits.faithfulness(hand, empty, m_clean, idx)
  diff = f["samples"][:, 1] - f["samples"][:, 0]
  return {"methods": {meth: one(m[meth]) for meth in METHODS},
          "random": [one(rnd[:, d]) for d in range(e.random_draws)],
          "at_hand": {"hand": [f["value"][0], *f["ci95"][0]],
                      "eap-ig": [f["value"][1], *f["ci95"][1]],
                      "random": [[f["value"][i], *f["ci95"][i]]
                                 for i in range(2, len(hand))],
                      "eap-ig_minus_hand": [
                          float(f["value"][1] - f["value"][0]),
                          *bootstrap.interval(diff).tolist()]},
          "m_empty": stats.summary(empty, idx),
          "per_prompt": {n: v for n, v in m.items()}}


def measure(config) -> dict:
  """Scores, timings, curves and the hand-built comparison (module
  docstring)."""
  e = config.experiment
  t_start = time.time()
  model, tok, prefix = models.load(e.model, seed=e.seed)
  eap_graph.check_model(model, "eap_ioi")  # pre-norm only, named
  graph = eap_graph.graph(model)
  c = model.config
  names = prompts.single_token_names(tok)
  p = prompts.build(tok, names, per_template_order=e.per_template_order,
                    seed=e.seed, prefix=prefix)
  score_idx, eval_idx = circuits.split(len(p["end"]), e.score_prompts,
                                       e.eval_prompts, e.seed)
  ps, pe = prompts.subset(p, score_idx), prompts.subset(p, eval_idx)
  graphdef, state = nnx.split(model)
  idx = bootstrap.draws(len(eval_idx), e.resamples, e.seed)
  ld = {name: np.asarray(_logit_diff(graphdef, state, jnp.asarray(q[k]),
                                     *(jnp.asarray(q[x]) for x in
                                       ("end", "io", "s"))))
        for name, q, k in (("score_clean", ps, "tokens"),
                           ("score_abc", ps, "corrupted"),
                           ("eval_clean", pe, "tokens"),
                           ("eval_abc", pe, "corrupted"))}
  out = {"model": e.model, "layers": c.num_layers, "heads": c.num_heads,
         "kv_heads": c.num_kv_heads or c.num_heads,
         "norm_placement": c.norm_placement,
         "graph": {"senders": len(graph.senders),
                   "receivers": len(graph.receivers),
                   "edges": graph.num_edges},
         "prompts": {"total": len(p["end"]), "names": len(names),
                     "score_idx": score_idx, "eval_idx": eval_idx,
                     "example": [ps["texts"][0], pe["texts"][0]]},
         "task": {k: stats.summary(v, idx if k.startswith("eval") else
                                   bootstrap.draws(len(v), e.resamples,
                                                   e.seed))
                  for k, v in ld.items()}}
  scores, timing = {}, {}
  for method in METHODS:
    scores[method], timing[method] = timed_scores(graphdef, state, ps,
                                                  method, e.ig_steps)
  for n in e.timing_prompts:
    _, timing[f"eap-ig_{n}"] = timed_scores(
        graphdef, state, prompts.subset(ps, np.arange(n)), "eap-ig",
        e.ig_steps)
  out["timing"] = timing
  heads = {m: circuits.ranked_heads(scores[m]) for m in METHODS}
  out["scores"] = {m: {"top_edges": eap_graph.ranked_edges(scores[m],
                                                           TOP_EDGES),
                       "heads": heads[m]} for m in METHODS}
  hand = hand_built(e)
  hand_mask = circuits.head_mask(graph, hand, c.num_heads)
  out["hand_built"] = {
      "heads": hand, "source": e.hand_built_from or "config",
      "edges": int(hand_mask.sum()),
      "fraction": float(hand_mask.sum() / graph.num_edges),
      "overlap": [circuits.overlap(heads["eap-ig"], hand, k)
                  for k in e.overlap_k],
      "overlap_eap": [circuits.overlap(heads["eap"], hand, k)
                      for k in e.overlap_k]}
  out["sizes"] = {"fractions": list(e.fractions),
                  "counts": _sizes(graph.num_edges, e.fractions)}
  masks = masks_to_run(scores, graph, e, hand_mask)
  out["curves"] = {}
  for ablation in e.ablations:
    m, seconds = evaluate(graphdef, state, pe, ps["tokens"], ablation,
                          masks)
    out["curves"][ablation] = curves(m, ld["eval_clean"], e, idx) | {
        "seconds": seconds, "circuits": sum(len(v) for v in masks.values())}
  out["wall_s"] = time.time() - t_start
  # CPU time of this process: on cores shared with other jobs, the wall
  # time alone says more about the neighbours than about the run.
  out["cpu_s"] = time.process_time()
  out["backend"] = jax.default_backend()
  out["devices"] = jax.device_count()
  return out
