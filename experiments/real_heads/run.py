"""The experiment's measurements, model by model; every statistic the
report quotes is computed here, so report.py only formats results.json.

Shape letters: N inputs, L layers, H heads, D random draws, S heads
ablated one at a time, G repeat distances.

For each model of `experiment.models`: the survey (`survey_model`), the
causal tests (`causal_model`), Gemma 3's induction against the repeat
distance (`distance.measure`, for `experiment.distance_models`) and the
KV cache of the GQA model against its MHA twin (`kv_model`). One model is
held at a time.
"""

from __future__ import annotations

import gc
import time

from absl import logging
import numpy as np

from experiments.real_heads import causal
from experiments.real_heads import distance
from experiments.real_heads import inputs
from experiments.real_heads import kv_twin
from experiments.real_heads import models
from experiments.real_heads import scores
from experiments.real_heads import survey
from mha_jax.measure import bootstrap
from mha_jax.measure import stats
from mha_jax.sae import buffer

KINDS = ("induction", "previous", "sink")  # head types ablated
# Which survey score picks each type's heads, and on which inputs.
PICKED_BY = {"induction": "induction", "previous": "previous",
             "sink": "first"}
ABLATIONS = ("zero", "mean")
METRICS = ("repeated", "prose")  # second-copy loss, next-token loss


def _round(x, digits: int = 4):
  return np.round(np.asarray(x, np.float64), digits)


def survey_inputs(e, info, encode) -> dict:
  """{"repeated": `[N, 2 n + 1]`, "prose": `[N, T]`} of the survey."""
  return {"repeated": buffer.repeated_tokens(
      e.repeat_inputs, e.repeat_len, e.token_range, seed=e.seed,
      bos=info["bos"]),
          "prose": inputs.prose(encode, e.text_inputs, e.text_len,
                                seed=e.seed)}


def _rows(length: int) -> np.ndarray:
  """Query rows that count: every one but position 0."""
  return np.arange(length) >= 1


def _scores_of(model, data, e, n=None) -> dict:
  """name -> `[N, L, H]` of the reported scores, each on its inputs."""
  out = {}
  no_loss = np.zeros(0, np.int32)
  for kind, ids in data.items():
    ids = ids[:n]
    s = scores.measure(model, ids, _rows(ids.shape[1]), chunk=e.chunk,
                       local=e.local, positions=no_loss)["scores"]
    for name, (on, _) in survey.SCORES.items():
      if on == kind:
        out[name] = s[name]
  return out


def survey_model(model, data, e) -> dict:
  """Every score per head with its interval, floors and standouts, and
  Sink_0^eps."""
  idx = {k: bootstrap.draws(len(v), e.resamples, e.seed)
         for k, v in data.items()}
  trained = _scores_of(model, data, e)
  n_floor = max(e.chunk, min(e.repeat_inputs, e.text_inputs) // 3
                // e.chunk * e.chunk)
  floors = {"reinit": _scores_of(models.reinitialised(model, e.floor_seed),
                                 data, e, n_floor),
            "shuffled": _scores_of(models.shuffled(model, e.floor_seed),
                                   data, e, n_floor)}
  uniform = {kind: scores.uniform(ids, _rows(ids.shape[1]), local=e.local)
             for kind, ids in data.items()}
  out = {"floor_inputs": n_floor, "scores": {}}
  for name, (on, direction) in survey.SCORES.items():
    iv = survey.head_intervals(trained[name], idx[on])
    floor_means = {k: v[name].mean(0) for k, v in floors.items()}
    u = float(uniform[on][name].mean())
    floor = survey.floor_of(
        np.concatenate([m.ravel() for m in floor_means.values()] + [[u]]),
        direction)
    out["scores"][name] = {
        "on": on, "direction": direction,
        "per_input": _round(trained[name]),
        "mean": _round(iv["mean"]), "lo": _round(iv["lo"]),
        "hi": _round(iv["hi"]), "uniform": u,
        **{k: _round(m) for k, m in floor_means.items()},
        "rank": survey.ranks(iv["mean"], direction),
        "floor": floor, **survey.standout(iv, floor, direction, e.top_k)}
  out["sink"] = {
      "trained": survey.sink_share(trained["first"], idx["prose"],
                                   e.sink_eps),
      **{k: float((v["first"].mean(0) > e.sink_eps).mean())
         for k, v in floors.items()},
      "uniform": float(uniform["prose"]["first"].mean() > e.sink_eps)}
  return out


def causal_inputs(e, info, encode) -> dict:
  """The ablation inputs, disjoint from the survey's: fresh random tokens
  and the next prose documents."""
  n = e.causal_inputs
  return {"repeated": buffer.repeated_tokens(
      n, e.repeat_len, e.token_range, seed=e.seed + 1, bos=info["bos"]),
          "prose": inputs.prose(encode, n, e.causal_text_len, seed=e.seed,
                                skip=e.text_inputs)}


def _positions(e) -> dict:
  """The scored targets: the second copy (after its first token) and
  every prose target."""
  return {"repeated": np.flatnonzero(inputs.second_copy(e.repeat_len)),
          "prose": np.arange(e.causal_text_len - 1)}


def _effect(ablated, clean, random_runs, e) -> dict:
  """One set's effect on one metric: the loss change (per input, mean,
  bootstrap interval over inputs), the random sets' mean change (t
  interval over draws), the set minus random (per-input paired, bootstrap
  interval) and the share of random draws that changed the loss at least
  as much."""
  d = np.asarray(ablated) - clean  # [N]
  r = np.asarray(random_runs) - clean[None]  # [D, N]
  per_draw = r.mean(1)
  vs = d - r.mean(0)
  boot = lambda v: stats.bootstrap_interval(v, resamples=e.resamples,
                                            seed=e.seed)
  return {"change": float(d.mean()), "ci": boot(d),
          "random": stats.summary(per_draw),
          "minus_random": float(vs.mean()), "minus_random_ci": boot(vs),
          "random_at_least": float((per_draw >= d.mean()).mean())}


def causal_model(model, data, survey_out, e) -> dict:
  """Top-k heads of each type ablated (zero and mean) against random
  sets, and single heads ablated alone."""
  c = model.config
  pos = _positions(e)
  ones = lambda ids: np.ones(ids.shape[1], bool)
  clean = {}
  mean_z = {}
  for m in METRICS:
    r = scores.measure(model, data[m], ones(data[m]), chunk=e.chunk,
                       local=0, positions=pos[m], with_scores=False)
    clean[m], mean_z[m] = r["nll"].mean(1), r["mean_z"]
  first = scores.measure(model, data["repeated"], ones(data["repeated"]),
                         chunk=e.chunk, local=0, with_scores=False,
                         positions=np.flatnonzero(inputs.first_copy(
                             e.repeat_len)))["nll"].mean(1)
  sets = {k: survey_out["scores"][PICKED_BY[k]]["top"] for k in KINDS}
  # The random sets hold none of the named heads of ANY kind, so a draw
  # never carries (say) the top previous-token head into the induction
  # comparison.
  named = sorted({tuple(lh) for heads in sets.values() for lh in heads})
  draws = causal.random_sets(c.num_layers, c.num_heads, e.top_k,
                             e.random_draws, seed=e.seed, exclude=named)
  clean_all = {**clean, "first_copy": first}
  out = {"clean": {**{k: _round(v) for k, v in clean_all.items()},
                   "mean": {k: float(v.mean()) for k, v in clean_all.items()}},
         "sets": sets,
         "random_sets": draws, "random_excludes": named}
  for a in ABLATIONS:
    repl = {m: (mean_z[m] if a == "mean" else np.zeros_like(mean_z[m]))
            for m in METRICS}
    run = lambda heads, m: causal.loss(model, data[m], pos[m], heads,
                                       repl[m], chunk=e.chunk)
    ablated = {k: {m: run(h, m) for m in METRICS} for k, h in sets.items()}
    rand = {m: np.stack([run(h, m) for h in draws]) for m in METRICS}
    out[a] = {
        "ablated": {k: {m: _round(v) for m, v in x.items()}
                    for k, x in ablated.items()},
        "random": {m: _round(v) for m, v in rand.items()},
        "effect": {k: {m: _effect(ablated[k][m], clean[m], rand[m], e)
                       for m in METRICS} for k in KINDS}}
  out["single"] = single_heads(model, data, pos, clean_all, mean_z, e)
  return out


def single_heads(model, data, pos, clean, mean_z, e) -> dict:
  """Zero ablation of one head at a time: every head of layer 0 and the
  `single_top` others of largest estimated effect on the second-copy loss
  (attribution over all heads). Per head and input: the change of the
  second-copy loss (also under mean ablation, which keeps the head's
  average output and removes only what depends on the input), of the
  first copy's loss (a head that makes the first copy less surprising,
  or the second more predictable, shows in one and not the other) and,
  for layer 0, of the prose loss; each mean with its bootstrap
  interval."""
  c = model.config
  rep = data["repeated"]
  zeros = scores.no_patch(model, rep.shape[1])[1]
  est = causal.attribution(model, rep, pos["repeated"], zeros,
                           chunk=e.chunk)
  order = [divmod(int(i), c.num_heads)
           for i in np.argsort(-np.abs(est).ravel(), kind="stable")]
  heads = [(0, h) for h in range(c.num_heads)]
  heads += [lh for lh in order if lh[0] != 0][:e.single_top]
  second = np.flatnonzero(inputs.second_copy(e.repeat_len))
  first = np.flatnonzero(inputs.first_copy(e.repeat_len))
  all_targets = np.arange(rep.shape[1] - 1)
  prose_zeros = scores.no_patch(model, data["prose"].shape[1])[1]
  boot = lambda v: stats.bootstrap_interval(v, resamples=e.resamples,
                                            seed=e.seed)
  out = {"heads": heads, "attribution": _round(est, 5), "second": [],
         "first": [], "prose": [], "second_mean_ablation": []}
  for lh in heads:
    nll = scores.measure(model, rep, np.ones(rep.shape[1], bool),
                         chunk=e.chunk, local=0, positions=all_targets,
                         with_scores=False, replacement=zeros,
                         select=causal.selection([lh], c.num_layers,
                                                 c.num_heads))["nll"]
    parts = {"second": nll[:, second].mean(1) - clean["repeated"],
             "first": nll[:, first].mean(1) - clean["first_copy"]}
    parts["second_mean_ablation"] = causal.loss(
        model, rep, pos["repeated"], [lh], mean_z["repeated"],
        chunk=e.chunk) - clean["repeated"]
    if lh[0] == 0:
      parts["prose"] = causal.loss(model, data["prose"], pos["prose"], [lh],
                                   prose_zeros, chunk=e.chunk) - clean[
                                       "prose"]
    for k in ("second", "first", "prose", "second_mean_ablation"):
      d = parts.get(k)
      out[k].append(None if d is None else {
          "per_input": _round(d), "mean": float(d.mean()), "ci": boot(d)})
  return out


def kv_model(model, e) -> dict:
  """Cache bytes per token and seconds per decoded token of the GQA model
  and its MHA twin, and whether the twin's logits equal the model's."""
  twin = kv_twin.mha_twin(model)
  prompt = buffer.repeated_tokens(1, e.kv_prompt // 2, e.token_range,
                                  seed=e.seed)
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  gap = float(np.abs(np.asarray(model(jnp.asarray(prompt)))
                     - np.asarray(twin(jnp.asarray(prompt)))).max())
  out = {"logit_max_abs_diff": gap}
  for name, m in (("gqa", model), ("mha", twin)):
    t = kv_twin.decode_seconds(m, prompt, e.kv_new, max_len=e.kv_max_len,
                               repeats=e.kv_repeats)
    out[name] = {"bytes_per_token": kv_twin.cache_bytes_per_token(m),
                 "per_token_s": t["per_token"],
                 "summary": stats.summary(t["per_token"]),
                 "tokens": t["tokens"]}
  out["same_tokens"] = bool((out["gqa"]["tokens"]
                             == out["mha"]["tokens"]).all())
  out["speed_ratio"] = stats.difference(out["mha"]["per_token_s"],
                                        out["gqa"]["per_token_s"])
  return out


def measure(config) -> dict:
  """Every model's survey, causal tests, distances and KV cache, with the
  wall time."""
  e = config.experiment
  start = time.perf_counter()
  out = {"models": {}}
  for name in e.models:
    t0 = time.perf_counter()
    model, encode, info = models.load(name, config)
    data = survey_inputs(e, info, encode)
    s = survey_model(model, data, e)
    logging.info("real_heads: %s surveyed after %.0f s", name,
                 time.perf_counter() - t0)
    r = {"info": info, "survey": s,
         "causal": causal_model(model, causal_inputs(e, info, encode), s, e)}
    logging.info("real_heads: %s ablated after %.0f s", name,
                 time.perf_counter() - t0)
    if name in e.distance_models:
      r["distance"] = distance.measure(
          model, info, e, s["scores"]["induction"]["mean"])
      r["distance"]["summary"] = distance.summarise(
          r["distance"], info["windows"], e)
    r["kv"] = kv_model(model, e)
    r["wall_s"] = time.perf_counter() - t0
    out["models"][name] = r
    del model
    gc.collect()
  out["wall_s"] = time.perf_counter() - start
  return out
