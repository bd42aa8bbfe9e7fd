"""The upstream IOI classes' measurements: each path-patching round's
senders ranked on the selection half, the class chosen by the group
rule, and on the held-out half the class's joint path effect against
random sets of its size, its members' own effects and the attention
pattern that names its kind.

Shape letters: N prompts, L layers, H query heads, K kv heads, S
senders, G random groups.

A round's effect is the logit difference at END when the sender's ABC
output reaches the receivers' inputs (Wang et al.'s path patching,
`ioi_task.paths`), minus the clean run's: negative where the clean run
needs what the sender sends. `measure` returns the results dict (every
per-prompt number of the held-out tests included); nothing here writes
the report.
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

from experiments.ioi_task import detectors
from experiments.ioi_task import forward
from experiments.ioi_task import groups
from experiments.ioi_task import halves
from experiments.ioi_task import models
from experiments.ioi_task import paths
from experiments.ioi_task import prompts

META = ("end", "io", "s", "io_pos", "s1_pos", "s2_pos")
# The rounds in order: (name, the receivers' input, where the receivers
# come from: the output heads or an earlier round's kind).
ROUNDS = (("s_inhibition", "q", "output"),
          ("induction_duplicate", "kv", "s_inhibition"),
          ("previous_token", "kv", "induction"))
# A class lowers the logit difference when its ABC output is sent.
SIGN = -1


@functools.partial(jax.jit, static_argnums=(0, 5, 7))
def _path(graphdef, state, target, source, meta, receivers, senders,
          through_mlps):
  return paths.path_patching(nnx.merge(graphdef, state), target, source,
                             meta, receivers, senders,
                             through_mlps=through_mlps)


@functools.partial(jax.jit, static_argnums=(0,))
def _clean(graphdef, state, tokens, meta, name_ids):
  model = nnx.merge(graphdef, state)
  logits, _ = forward.end_logits(model, tokens, meta["end"])
  return (forward.logit_diff(logits, meta["io"], meta["s"]),
          detectors.measure(model, tokens, meta, name_ids))


def receivers_of(heads, kind: str, n_h: int, n_kv: int) -> tuple:
  """The `paths.path_patching` receivers of `heads [[layer, head]]`:
  their queries (`kind` "q"), or the keys and values of their kv heads
  ("kv"), sorted, each once."""
  if kind == "q":
    return tuple(sorted((int(l), int(h), "q") for l, h in heads))
  per = n_h // n_kv
  return tuple(sorted({(int(l), int(h) // per, x) for l, h in heads
                       for x in ("k", "v")}))


def senders_of(receivers, n_h: int) -> np.ndarray:
  """`[S]` flat heads (layer * H + head) of every layer before the last
  receiver's: the heads that can send to some receiver."""
  return np.arange(max(r[0] for r in receivers) * n_h)


def masks(sets, num_layers: int, n_h: int) -> np.ndarray:
  """`[S, L, H]` bool: each set of flat heads as a sender mask."""
  out = np.zeros((len(sets), num_layers * n_h), bool)
  for i, s in enumerate(sets):
    out[i, np.asarray(s, int)] = True
  return out.reshape(len(sets), num_layers, n_h)


def path_effects(model, p, rows, receivers, sets, clean_ld, *,
                 through_mlps: bool) -> np.ndarray:
  """`[N, S]`: on the prompts `rows` of `p`, the path-patched logit
  difference of each sender set in `sets` (flat heads) minus the clean
  run's `clean_ld [N]`."""
  c = model.config
  graphdef, state = nnx.split(model)
  meta = {k: jnp.asarray(p[k][rows]) for k in META}
  got = _path(graphdef, state, jnp.asarray(p["tokens"][rows]),
              jnp.asarray(p["corrupted"][rows]), meta, receivers,
              jnp.asarray(masks(sets, c.num_layers, c.num_heads)),
              through_mlps)
  return np.asarray(got, np.float64).T - clean_ld[:, None]


def _head(i, n_h) -> list:
  return [int(i) // n_h, int(i) % n_h]


def kind_of(det, rows, flat, n_h, draws) -> dict:
  """Whether head `flat` attends from S2 more to S1 (duplicate token) or
  to the token after S1 (induction) on the prompts `rows`: the paired
  interval of the two attention weights."""
  l, h = _head(flat, n_h)
  d = det["s2_s1"][rows, l, h] - det["s2_after_s1"][rows, l, h]
  ci = draws.ci(d)
  return {"s2_s1_minus_after": [float(d.mean()), *map(float, ci)],
          "kind": detectors.repeat_kind(ci)}


def previous_of(det, rows, flat, n_h, floor, draws) -> dict:
  """Attention from the token after S1 to S1, beside its uniform floor
  (a previous-token head's pattern)."""
  l, h = _head(flat, n_h)
  v = det["after_s1_s1"][rows, l, h]
  ci = draws.ci(v)
  return {"after_s1_s1": [float(v.mean()), *map(float, ci)],
          "floor": float(floor), "above_floor": bool(ci[0] > floor)}


def run_round(model, p, split, receivers, named, clean_ld, e, seed
              ) -> dict:
  """One round: every sender's effect on the selection half, the class
  (`groups.grow`, sign negative), and on the held-out half the class
  jointly, each member alone and `e.random_groups` random sets of its
  size drawn from the senders in no class (`named`: flat heads already
  in one)."""
  n_h = model.config.num_heads
  (sel, ds), (held, dh) = split
  t0 = time.time()
  senders = senders_of(receivers, n_h)
  eff = path_effects(model, p, sel, receivers, [[i] for i in senders],
                     clean_ld[sel], through_mlps=e.path_through_mlps)
  mean, ci = eff.mean(0), ds.ci(eff)
  chosen = groups.grow(mean, ci, np.ones(len(senders), bool), sign=SIGN,
                       relative_floor=e.relative_floor,
                       max_group=e.max_group)
  members = senders[chosen].tolist()
  order = np.argsort(mean)
  out = {"receivers": [list(r) for r in receivers],
         "senders": len(senders),
         "selection": {"mean": mean, "ci95": ci},
         "top": [{"head": _head(senders[i], n_h),
                  "selection": [float(mean[i]), *map(float, ci[i])]}
                 for i in order[:e.top]],
         "heads": [_head(i, n_h) for i in members],
         "selection_seconds": time.time() - t0}
  if not members:
    out["confirmed"] = False
    return out
  pool = np.setdiff1d(senders, sorted(set(named) | set(members)))
  rand = groups.random_groups(pool, len(members), e.random_groups, seed)
  sets = [members] + [[i] for i in members] + rand.tolist()
  t1 = time.time()
  got = path_effects(model, p, held, receivers, sets, clean_ld[held],
                     through_mlps=e.path_through_mlps)
  joint, single, rand_eff = got[:, 0], got[:, 1:1 + len(members)], got[
      :, 1 + len(members):]
  template = p["template"][held]
  out["held_out"] = {
      "joint": dh.summary(joint),
      "by_template": halves.by_template(joint, template),
      "members": [dict(head=_head(i, n_h), **dh.summary(single[:, j]))
                  for j, i in enumerate(members)],
      "random_heads": [[_head(i, n_h) for i in r] for r in rand],
      "random": {"per_group": rand_eff.mean(0),
                 "range95": np.percentile(rand_eff.mean(0), [2.5, 97.5]),
                 "mean": float(rand_eff.mean())},
      "minus_random": dh.summary(joint - rand_eff.mean(1)),
      "test": groups.as_far(float(joint.mean()), rand_eff.mean(0), SIGN),
      "seconds": time.time() - t1}
  h = out["held_out"]
  out["confirmed"] = bool(h["joint"]["ci95"][1] < 0
                          and h["test"]["p"] <= e.max_p)
  return out


def output_heads(e, name: str, sel) -> list:
  """The receivers of the first round: the positive output heads (name
  movers, S suppressors) the ioi_output_heads run confirmed on its
  held-out half, chosen on the same selection half as here (checked),
  or the config's own for a model that file does not hold."""
  given = e.output_heads.get(name) if "output_heads" in e else None
  if given is not None:
    return [list(map(int, x)) for x in given]
  saved = json.loads(pathlib.Path(e.output_heads_results).read_text())
  if name not in saved["models"]:
    raise ValueError(f"ioi_classes: {e.output_heads_results} holds no "
                     f"model {name!r} (it holds {sorted(saved['models'])})"
                     "; give its heads in `output_heads`")
  entry = saved["models"][name]
  if entry["selection"] != [int(i) for i in sel]:
    raise ValueError(f"ioi_classes: the selection half of {name!r} differs "
                     f"from {e.output_heads_results}'s; the output heads "
                     "would have been chosen on prompts held out here")
  return [h for kind in ("name_movers", "s_suppressors")
          for h in entry["groups"][kind]["heads"]
          if entry["groups"][kind].get("confirmed")]


def study(model, p, name_ids, halves_, outputs, e) -> dict:
  """Every round on `model` with the prompts `p` split into `halves_`
  `(selection, held_out)` indices, the first round received by the
  output heads `outputs [[layer, head]]` (module docstring)."""
  c = model.config
  n_h = c.num_heads
  sel, held = halves_
  ds = halves.Draws(p["template"][sel], resamples=e.resamples, seed=e.seed)
  dh = halves.Draws(p["template"][held], resamples=e.resamples,
                    seed=e.seed + 2)
  graphdef, state = nnx.split(model)
  meta = {k: jnp.asarray(p[k]) for k in META}
  ld, det = jax.tree.map(lambda x: np.asarray(x, np.float64), _clean(
      graphdef, state, jnp.asarray(p["tokens"]), meta,
      jnp.asarray(name_ids)))
  floor = float(np.mean(detectors.uniform_floors(
      prompts.subset(p, sel))["after_s1_s1"]))
  named = [l * n_h + h for l, h in outputs]
  split = ((sel, ds), (held, dh))
  rounds, heads_of = {}, {"output": outputs}
  for j, (rname, inp, source) in enumerate(ROUNDS):
    if not heads_of.get(source):
      rounds[rname] = {"skipped": f"no {source} heads to receive"}
      continue
    receivers = receivers_of(heads_of[source], inp, n_h, c.num_kv_heads)
    if max(r[0] for r in receivers) == 0:
      rounds[rname] = {"skipped": "the receivers are in layer 0"}
      continue
    t0 = time.time()
    r = run_round(model, p, split, receivers, named, ld, e,
                  seed=e.seed + 10 + j)
    members = [l * n_h + h for l, h in r["heads"]]
    named += members
    ok = r["confirmed"]  # a class feeds the next round only then
    if rname == "induction_duplicate":
      r["kinds"] = [{"head": _head(i, n_h),
                     "selection": kind_of(det, sel, i, n_h, ds),
                     "held_out": kind_of(det, held, i, n_h, dh)}
                    for i in members]
      heads_of["induction"] = [k["head"] for k in r["kinds"]
                               if ok and k["selection"]["kind"]
                               == "induction"]
    if rname == "previous_token":
      r["previous"] = [{"head": _head(i, n_h),
                        "selection": previous_of(det, sel, i, n_h, floor,
                                                 ds),
                        "held_out": previous_of(det, held, i, n_h, floor,
                                                dh)}
                       for i in members]
    heads_of[rname] = r["heads"] if ok else []
    rounds[rname] = r
    logging.info("ioi_classes: %s took %.0f s", rname, time.time() - t0)
  return {"layers": c.num_layers, "heads": n_h, "kv_heads": c.num_kv_heads,
          "num_prompts": len(p["end"]), "selection": sel.tolist(),
          "held_out": held.tolist(), "output_heads": outputs,
          "task": {"selection": ds.summary(ld[sel]),
                   "held_out": dh.summary(ld[held])},
          "rounds": rounds}


def model_run(name: str, e) -> dict:
  """One model: its prompts, halves and output heads, then `study`."""
  t0 = time.time()
  model, tok, prefix = models.load(name, seed=e.seed)
  names = prompts.single_token_names(tok)
  p = prompts.build(tok, names, per_template_order=e.per_template_order,
                    seed=e.seed, prefix=prefix)
  sel, held = halves.split(p["template"], p["order"],
                           share=e.selection_share, seed=e.seed)
  out = study(model, p, [names[n] for n in p["names"]], (sel, held),
              output_heads(e, name, sel), e)
  return out | {"example": p["texts"][:2], "seconds": time.time() - t0}


def measure(config) -> dict:
  """Every model of the config (module docstring)."""
  e = config.experiment
  t0 = time.time()
  out = {"models": {name: model_run(name, e) for name in e.models}}
  out["wall_s"] = time.time() - t0
  # CPU time of this process: on shared cores the wall time says more
  # about the neighbours than about the run.
  out["cpu_s"] = time.process_time()
  out["backend"] = jax.default_backend()
  return out
