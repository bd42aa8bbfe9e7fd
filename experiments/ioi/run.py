"""The IOI experiment's measurements: the logit difference of each model
with its controls, then, on the model that does the task, activation
patching per head and role and path patching to the name movers, the
S-inhibition heads and the heads that feed them (every model of
`circuit_models` that does the task).

Shape letters: N prompts, L layers, H query heads, R roles, S senders.

`measure` returns the results dict (every per-prompt number included);
nothing here writes the report. Every interval is a percentile bootstrap
over prompts, all statistics of one prompt set sharing its resamples
(`bootstrap.draws`), so differences between heads are paired.
"""

from __future__ import annotations

import functools
import time

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.ioi import head_patching
from experiments.ioi_task import detectors
from experiments.ioi_task import forward
from experiments.ioi_task import paths
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from experiments.ioi_task import stats
from mha_jax.measure import bootstrap

META = ("end", "io", "s", "io_pos", "s1_pos", "s2_pos")


def _meta(p) -> dict:
  return {k: jnp.asarray(p[k]) for k in META}


def _uniform_patterns(num_layers: int) -> dict:
  """Every layer's pattern replaced by uniform causal weights."""
  def uniform(x):  # [N, H, T, T]
    t = x.shape[-1]
    w = jnp.tril(jnp.ones((t, t), x.dtype))
    return jnp.broadcast_to(w / w.sum(-1, keepdims=True), x.shape)
  return {f"blocks.{l}.attn.pattern": uniform for l in range(num_layers)}


@functools.partial(jax.jit, static_argnums=(0, 6))
def _logit_diff(graphdef, state, tokens, end, io, s, uniform: bool):
  model = nnx.merge(graphdef, state)
  patch = _uniform_patterns(model.config.num_layers) if uniform else None
  logits, _ = forward.end_logits(model, tokens, end, patch=patch)
  top = jnp.argmax(logits, -1)
  return forward.logit_diff(logits, io, s), top == io


def logit_diffs(model, tokens, meta, *, chunk: int, uniform=False):
  """`([N] logit difference, [N] bool: IO is the top token)`, `chunk`
  prompts per forward pass."""
  graphdef, state = nnx.split(model)
  out = [_logit_diff(graphdef, state, *(jnp.asarray(a[i:i + chunk]) for a in
                                        (tokens, meta["end"], meta["io"],
                                         meta["s"])), uniform)
         for i in range(0, len(tokens), chunk)]
  return (np.concatenate([np.asarray(o[0]) for o in out]),
          np.concatenate([np.asarray(o[1]) for o in out]))


def task_summary(model, p, idx, *, chunk: int, shuffled_model) -> dict:
  """The logit difference on clean, ABC, uniform-attention and
  shuffled-weights runs: per prompt, means with intervals, share of
  prompts preferring IO, and the clean mean per order and template."""
  out = {}
  runs = {"clean": (model, p["tokens"], False),
          "abc": (model, p["corrupted"], False),
          "uniform": (model, p["tokens"], True),
          "shuffled": (shuffled_model, p["tokens"], False)}
  for name, (m, tokens, uniform) in runs.items():
    ld, top = logit_diffs(m, tokens, p, chunk=chunk, uniform=uniform)
    out[name] = stats.summary(ld, idx) | {
        "positive": stats.summary((ld > 0).astype(float), idx),
        "top1": float(np.mean(top))}
  ld = np.asarray(out["clean"]["per_prompt"])
  abc = np.asarray(out["abc"]["per_prompt"])
  out["clean_minus_abc"] = stats.summary(ld - abc, idx)
  out["by_order"] = {o: float(ld[p["order"] == i].mean())
                     for i, o in enumerate(prompts.ORDERS)}
  out["by_template"] = [float(ld[p["template"] == t].mean())
                        for t in range(len(prompts.TEMPLATES))]
  return out


@functools.partial(jax.jit, static_argnums=(0, 8, 9))
def _activation_chunk(graphdef, state, target, source, end, io, s, masks,
                      layers, batch):
  return head_patching.activation_patching(
      nnx.merge(graphdef, state), target, source,
      {"end": end, "io": io, "s": s}, masks, layers=layers, batch_size=batch)


def _activation(graphdef, state, target, source, end, io, s, masks, batch,
                chunks, num_layers):
  """`[L, H, R, N]` in `chunks` groups of layers, each run from its first
  block: fewer blocks per patch for one more compiled program each."""
  cuts = np.linspace(0, num_layers, chunks + 1).round().astype(int)
  return np.concatenate([np.asarray(_activation_chunk(
      graphdef, state, target, source, end, io, s, masks, (int(a), int(b)),
      batch)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a])


@functools.partial(jax.jit, static_argnums=(0,))
def _detect(graphdef, state, tokens, meta, name_ids):
  return detectors.measure(nnx.merge(graphdef, state), tokens, meta,
                           name_ids)


@functools.partial(jax.jit, static_argnums=(0,))
def _direct(graphdef, state, target, source, meta):
  return head_patching.direct_path(nnx.merge(graphdef, state), target,
                                   source, meta)


@functools.partial(jax.jit, static_argnums=(0, 5, 7, 8))
def _path(graphdef, state, target, source, meta, receivers, senders, batch,
          through_mlps):
  return paths.path_patching(nnx.merge(graphdef, state), target,
                                     source, meta, receivers, senders,
                                     through_mlps=through_mlps,
                                     batch_size=batch)


def _fractions(patched, clean, corrupt, idx, shape) -> dict:
  """`stats.patched_fraction` of `patched [..., N]` (flattened), with
  `fraction` and `ci95` reshaped to `shape` and the per-prompt values
  kept."""
  n = patched.shape[-1]
  flat = np.asarray(patched).reshape(-1, n).T  # [N, M]
  f = stats.patched_fraction(flat, clean, corrupt, idx)
  return {"fraction": f["fraction"].reshape(shape),
          "ci95": f["ci95"].reshape(shape + (2,)),
          "samples": f["samples"], "per_prompt": np.asarray(patched)}


def _heads(indices, num_heads) -> list:
  return [[int(i) // num_heads, int(i) % num_heads] for i in indices]


def _class(frac, *, k_max, num_heads, candidates=None) -> dict:
  """`stats.separated` on a patching fraction over heads, restricted to
  `candidates` (flat head indices; None: every head)."""
  means, samples = frac["fraction"].reshape(-1), frac["samples"]
  keep = (np.arange(len(means)) if candidates is None
          else np.asarray(candidates))
  sep = stats.separated(means[keep], samples[:, keep], k_max=k_max)
  members = keep[sep["members"]].tolist()
  return {"heads": _heads(members, num_heads), "flat": members,
          "gap_ci95": sep["gap_ci95"], "considered": len(keep)}


def _compare(values_a, values_b, idx) -> dict:
  """Paired per-prompt difference a - b `[N, M]` -> mean and interval per
  column."""
  d = np.asarray(values_a, np.float64) - np.asarray(values_b, np.float64)
  return {"mean": d.mean(0), "ci95": bootstrap.interval(
      bootstrap.resampled_means(d, idx))}


def circuit(model, p, e, name_ids) -> dict:
  """Activation and path patching of `model` on the prompt set `p`
  (noising: ABC into clean, as Wang et al.), with the per-head detectors
  and the classes each comparison separates."""
  c = model.config
  n_h = c.num_heads
  graphdef, state = nnx.split(model)
  idx = bootstrap.draws(len(p["end"]), e.resamples, e.seed)
  meta = _meta(p)
  clean, abc = (jnp.asarray(p[k]) for k in ("tokens", "corrupted"))
  ld_clean, _ = logit_diffs(model, p["tokens"], p, chunk=e.chunk)
  ld_abc, _ = logit_diffs(model, p["corrupted"], p, chunk=e.chunk)
  out = {"n": len(p["end"]), "clean": stats.summary(ld_clean, idx),
         "abc": stats.summary(ld_abc, idx),
         "norm_placement": c.norm_placement}
  roles = tuple(e.roles)
  masks = head_patching.role_masks(p, clean.shape[1], roles)
  t0 = time.time()
  noised = np.asarray(_activation(graphdef, state, clean, abc, meta["end"],
                                  meta["io"], meta["s"], masks, e.batch,
                                  e.layer_chunks, c.num_layers))
  out["activation"] = _fractions(noised, ld_clean, ld_abc, idx,
                                 (c.num_layers, n_h, len(roles)))
  out["activation"]["roles"] = list(roles)
  out["activation"]["seconds"] = time.time() - t0
  logging.info("ioi: activation patching took %.0f s", time.time() - t0)
  if e.denoise:
    all_mask = head_patching.role_masks(p, clean.shape[1], ("all",))
    denoised = np.asarray(_activation(graphdef, state, abc, clean,
                                      meta["end"], meta["io"], meta["s"],
                                      all_mask, e.batch, e.layer_chunks,
                                      c.num_layers))
    f = _fractions(denoised, ld_clean, ld_abc, idx, (c.num_layers, n_h, 1))
    # Restored share (patched - abc) / (clean - abc) = 1 - fraction.
    out["denoise"] = {"fraction": 1 - f["fraction"], "ci95": 1 - f["ci95"][
        ..., ::-1], "per_prompt": f["per_prompt"]}
  det = jax.tree.map(np.asarray, _detect(graphdef, state, clean, meta,
                                         jnp.asarray(name_ids)))
  out["detectors"] = {k: {"mean": v.mean(0), "ci95": bootstrap.interval(
      bootstrap.resampled_means(v, idx)), "per_prompt": v}
      for k, v in det.items()}
  floors = detectors.uniform_floors(p)
  out["floors"] = {k: float(np.mean(v)) for k, v in floors.items()}
  flat = lambda v: v.reshape(v.shape[0], -1)  # [N, L * H]
  end_io_vs_s = _compare(flat(det["end_io"]), flat(det["end_s"]), idx)
  copy = {"mean": flat(det["copy"]).mean(0), "ci95": bootstrap.interval(
      bootstrap.resampled_means(flat(det["copy"]), idx))}
  # Output heads: the direct path to the logits separates them; where
  # they attend from END and what their OV does to a name says which
  # kind each is (Wang et al.'s name movers attend to IO and copy it).
  direct = np.asarray(_direct(graphdef, state, clean, abc, meta))
  out["direct"] = _fractions(direct, ld_clean, ld_abc, idx,
                             (c.num_layers, n_h))
  heads = _class(out["direct"], k_max=e.k_max, num_heads=n_h)
  heads["checks"] = [_output_kind(h, i, end_io_vs_s, copy,
                                  out["floors"]["end_io"])
                     for h, i in zip(heads["heads"], heads["flat"])]
  heads["confirmed"] = [ch["head"] for ch in heads["checks"]
                        if ch["kind"] == "name mover"]
  out["name_movers"] = heads
  negative = {"fraction": -out["direct"]["fraction"],
              "samples": -out["direct"]["samples"]}
  out["negative_movers"] = _class(negative, k_max=e.k_max, num_heads=n_h)
  out["dup_attention"] = _attention_class(det["s2_s1"], idx, e, n_h,
                                          floors["s2_s1"])
  out["ind_attention"] = _attention_class(det["s2_after_s1"], idx, e, n_h,
                                          floors["s2_after_s1"])
  out["paths"] = _path_rounds(graphdef, state, clean, abc, meta, ld_clean,
                              ld_abc, idx, e, heads["heads"], n_h, det)
  return out


def _output_kind(head, i, end_io_vs_s, copy, floor) -> dict:
  """What an output head is, from two paired intervals: attention from
  END to IO minus to S1 + S2, and its copy score (its value at IO read
  out: the IO name minus the other names; negative: its OV suppresses
  the name it attends to). A name mover attends to IO and copies; an
  S suppressor attends to S and suppresses it, which also raises
  IO - S; a negative name mover attends to IO and suppresses it. A head
  "attends" to one name over the other only where the interval clears
  `floor` (what uniform attention puts on one name) on that side: a
  difference smaller than a uniform head's is no preference."""
  att_lo, att_hi = end_io_vs_s["ci95"][i]
  cp_lo, cp_hi = copy["ci95"][i]
  att = "IO" if att_lo > floor else "S" if att_hi < -floor else None
  cp = "copies" if cp_lo > 0 else "suppresses" if cp_hi < 0 else None
  kind = {("IO", "copies"): "name mover",
          ("S", "suppresses"): "S suppressor",
          ("IO", "suppresses"): "negative name mover",
          ("S", "copies"): "S copier"}.get((att, cp), "not resolved")
  if att is None:
    kind = "attends to neither name more than uniform"
  return {"head": head, "io_minus_s": [float(end_io_vs_s["mean"][i]),
                                       *end_io_vs_s["ci95"][i].tolist()],
          "copy": [float(copy["mean"][i]), *copy["ci95"][i].tolist()],
          "attends": att, "ov": cp, "kind": kind}


def _attention_class(values, idx, e, n_h, floor) -> dict:
  """The heads an attention measure `[N, L, H]` separates from the rest
  (paired intervals), above the uniform floor's mean."""
  v = values.reshape(values.shape[0], -1)
  samples = bootstrap.resampled_means(v, idx)
  sep = stats.separated(v.mean(0), samples, k_max=e.k_max,
                        floor=float(np.mean(floor)))
  return {"heads": _heads(sep["members"], n_h), "gap_ci95": sep["gap_ci95"]}


def _senders(receivers, n_h) -> np.ndarray:
  """Every head of the layers before the last receiver's."""
  last = max(r[0] for r in receivers)
  return np.asarray([(l, h) for l in range(last) for h in range(n_h)],
                    np.int32)


def _path_rounds(graphdef, state, clean, abc, meta, ld_clean, ld_abc, idx,
                 e, movers, n_h, det) -> dict:
  """Path patching into the output heads' queries (Wang et al.'s
  S-inhibition class: what tells END's queries which name is S), then
  into those senders' keys and values (duplicate-token and induction
  heads), then into theirs (previous-token heads, which induction heads'
  keys read); a round without receivers is not run. Beside the first
  round, one into the output heads' own keys and values: a head that
  attends to S can also be told at the keys which name is repeated."""
  if not movers:
    return {"skipped": "no output head was separated"}
  kv = lambda prev: tuple(sorted({(l, h // (n_h // e.num_kv_heads), x)
                                  for l, h in prev for x in ("k", "v")}))
  one = functools.partial(_path_round, graphdef, state, clean, abc, meta,
                          ld_clean, ld_abc, idx, e, n_h)
  rounds = (("s_inhibition", lambda prev: tuple((l, h, "q")
                                                for l, h in prev)),
            ("duplicate_induction", kv), ("previous_token", kv))
  out = {}
  if e.output_kv_round:
    out["output_kv"] = one(kv(movers))
  prev = movers
  for name, to in rounds[:e.path_rounds]:
    out[name] = one(to(prev))
    if "skipped" in out[name]:
      break
    heads = out[name]["heads"]
    if name == "duplicate_induction":
      out[name]["kinds"] = [_kind(det, l, h, idx) for l, h in heads]
    if name == "previous_token":
      out[name]["previous"] = [
          {"head": [l, h], "after_s1_s1": [
              float(det["after_s1_s1"][:, l, h].mean()),
              *bootstrap.interval(bootstrap.resampled_means(
                  det["after_s1_s1"][:, l, h], idx)).tolist()]}
          for l, h in heads]
    if not heads:
      break
    prev = heads
  return out


def _path_round(graphdef, state, clean, abc, meta, ld_clean, ld_abc, idx, e,
                n_h, receivers) -> dict:
  """One round of path patching: every head of the layers before the last
  receiver's sends, one at a time, into `receivers`; the separated
  senders are the round's heads."""
  senders = _senders(receivers, n_h)
  if len(senders) == 0:
    return {"skipped": "the receivers are in layer 0"}
  t0 = time.time()
  patched = np.asarray(_path(graphdef, state, clean, abc, meta, receivers,
                             jnp.asarray(senders), e.batch,
                             e.path_through_mlps))
  frac = _fractions(patched, ld_clean, ld_abc, idx, (len(senders),))
  sep = stats.separated(frac["fraction"], frac["samples"], k_max=e.k_max)
  logging.info("ioi: path patching into %s took %.0f s", receivers,
               time.time() - t0)
  return {"receivers": [list(r) for r in receivers],
          "senders": senders.tolist(), "fraction": frac["fraction"],
          "ci95": frac["ci95"], "per_prompt": patched,
          "heads": senders[sep["members"]].tolist(),
          "gap_ci95": sep["gap_ci95"], "seconds": time.time() - t0}


def _kind(det, l, h, idx) -> dict:
  """Whether head (l, h) attends from S2 more to S1 (duplicate token) or
  to the token after S1 (induction): the paired interval of the two."""
  d = det["s2_s1"][:, l, h] - det["s2_after_s1"][:, l, h]
  ci = bootstrap.interval(bootstrap.resampled_means(d, idx)).tolist()
  return {"head": [l, h], "s2_s1_minus_after": [float(d.mean()), *ci],
          "kind": detectors.repeat_kind(ci)}


def measure(config) -> dict:
  """Every model's task numbers; the circuit of each model in
  `circuit_models` that does the task (or every one, with
  `force_circuit`)."""
  e = config.experiment
  t_start = time.time()
  out = {"models": {}, "circuits": {}, "circuit_skipped": []}
  for name in e.models:
    t0 = time.time()
    model, tok, prefix = models.load(name, seed=e.seed)
    names = prompts.single_token_names(tok)
    p = prompts.build(tok, names, per_template_order=e.per_template_order,
                      seed=e.seed, prefix=prefix)
    idx = bootstrap.draws(len(p["end"]), e.resamples, e.seed)
    logging.info("ioi: %s loaded, %d names, %d prompts", name, len(names),
                 len(p["end"]))
    task = task_summary(model, p, idx, chunk=e.chunk,
                        shuffled_model=models.shuffled(model, e.seed))
    c = model.config
    does_task = (task["clean"]["ci95"][0] > 0
                 and task["clean"]["positive"]["mean"] >= e.min_positive)
    entry = {"task": task, "does_task": bool(does_task),
             "names": p["names"], "num_prompts": len(p["end"]),
             "example": p["texts"][:2], "layers": c.num_layers,
             "heads": c.num_heads, "kv_heads": c.num_kv_heads or c.num_heads,
             "seconds": 0.0}
    if name in e.circuit_models and (does_task or e.force_circuit):
      pc = prompts.build(tok, names, per_template_order=e.circuit_per_order,
                         seed=e.seed + 1, prefix=prefix)
      ec = e.copy_and_resolve_references()
      with ec.unlocked():
        ec.num_kv_heads = entry["kv_heads"]
      name_ids = [names[n] for n in p["names"]]
      out["circuits"][name] = {"model": name} | circuit(model, pc, ec,
                                                         name_ids)
    elif name in e.circuit_models:
      out["circuit_skipped"].append(name)
    entry["seconds"] = time.time() - t0
    out["models"][name] = entry
    del model
  out["wall_s"] = time.time() - t_start
  # CPU time of this process: on cores shared with other jobs, the wall
  # time alone says more about the neighbours than about the run.
  out["cpu_s"] = time.process_time()
  out["backend"] = jax.default_backend()
  return out
