"""An induction model measured as a circuit, and its heads along training.

Shape letters: L layers, H heads, T length, S checkpoints, B examples.

`survey` gathers what experiment 6 (`experiments/circuits/`) reports per
model, on clean/corrupted pairs from `mha_jax.interp.corruption`, with the metric
`patching.logprob_metric` (mean log-probability of the targets the task's
loss counts: the second copy of the segment): per-head activation and
attribution patching, per-position patching on pairs of one fixed layout,
path patching from every head of one layer into the next, composition and
copying scores and direct logit attribution. `checkpoint_scores` follows
the heads' attention scores through a run's checkpoints.

These are analysis drivers: they jit inside, once per model structure (the
graphdef is static, the parameters are arguments), so every seed of a
setting reuses one compiled program.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.interp import calibration
from mha_jax.interp import composition
from mha_jax.interp import head_metrics
from mha_jax.interp import patching
from mha_jax.measure import curves
from mha_jax.training import saved_run
from mha_jax.training import train_state

DIRECTIONS = ("denoise", "noise")


def _sites(num_layers, name):
  return [f"blocks.{l}.{name}" for l in range(num_layers)]


def _setup(graphdef, state, pairs):
  """The model, the patching arguments of `pairs` and the reference."""
  model = nnx.merge(graphdef, state)
  clean, corrupt = pairs["inputs"], pairs["corrupted"]
  metric = patching.logprob_metric(pairs["targets"], pairs["loss_mask"])
  ref = patching.reference_metrics(model, clean, corrupt, metric)
  return model, dict(model=model, clean=clean, corrupted=corrupt,
                     metric=metric, reference=ref)


# `noising` is traced: one compiled program serves both directions.
@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _per_head(graphdef, state, pairs, noising, sender_layer, receiver_layer,
              grid=True):
  """Activation and attribution patching of every head's z `[L, H]` and,
  with `grid`, the path grid of `sender_layer` -> `receiver_layer`."""
  model, args = _setup(graphdef, state, pairs)
  z = _sites(model.config.num_layers, "attn.z")
  act = patching.activation_patching(sites=z, noising=noising, **args)
  attr = patching.attribution_patching(sites=z, noising=noising, **args)
  out = {"activation": jnp.stack([act[s] for s in z]),  # [L, H]
         "attribution": jnp.stack([attr[s] for s in z]),
         "reference": jnp.stack(args["reference"])}
  if grid:
    out["path"] = patching.path_patching_grid(
        sender_layer=sender_layer, receiver_layer=receiver_layer,
        noising=noising, **args)
  return out


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _joint_raw(graphdef, state, pairs, routes, noising, sender_layer,
               receiver_layer):
  """Per-example summed log-probs `[B]` of the clean and corrupted runs
  and `[S, B]` of each joint set of `routes [S, 4, H + 1]`."""
  model = nnx.merge(graphdef, state)
  metric = patching.per_example_logprob(pairs["targets"], pairs["loss_mask"])
  return {"patched": patching.joint_path_patching(
              model, pairs["inputs"], pairs["corrupted"], metric, routes,
              sender_layer=sender_layer, receiver_layer=receiver_layer,
              noising=noising, normalise=False),
          "clean": metric(model(pairs["inputs"])),
          "corrupted": metric(model(pairs["corrupted"]))}


def joint_sets(num_heads: int, prev: int):
  """`(names, routes [S, 4, H + 1])`: the sets of paths measured jointly.

  Per sender (`h<i>` a layer-0 head, `embed` the embedding): each route
  alone (`:q`, `:k`, `:v`, `:logits`), its paths through the layer-1
  heads (`:qkv`) and everything (`:all`, its whole output). Then every
  sender into one input or more (`all:q`, `all:k`, `all:v`, `all:kv`,
  `all:qkv`), every layer-0 head into layer 1 (`heads:qkv`) and
  everywhere (`heads:all`), and the AND of keys and values: the
  previous-token head into the keys with every sender (`and:all_v`) or
  the embedding (`and:embed_v`) into the values.
  """
  heads = list(range(num_heads))
  senders = {f"h{h}": h for h in heads} | {"embed": patching.EMBED}
  every = heads + [patching.EMBED]
  qkv = ("q", "k", "v")
  sets = {}
  for name, s in senders.items():
    for to in patching.ROUTES:
      sets[f"{name}:{to}"] = [(s, to)]
    sets[f"{name}:qkv"] = [(s, to) for to in qkv]
    sets[f"{name}:all"] = [(s, to) for to in patching.ROUTES]
  for ins in ("q", "k", "v", "kv", "qkv"):
    sets[f"all:{ins}"] = [(s, to) for s in every for to in ins]
  sets["heads:qkv"] = [(h, to) for h in heads for to in qkv]
  sets["heads:all"] = [(h, to) for h in heads for to in patching.ROUTES]
  sets["and:all_v"] = [(prev, "k")] + [(s, "v") for s in every]
  sets["and:embed_v"] = [(prev, "k"), (patching.EMBED, "v")]
  return list(sets), np.stack([patching.route(num_heads, p)
                               for p in sets.values()])


def _bootstrap_seed(pairs):
  """A bootstrap seed from the pairs themselves: each seed's own draws."""
  return int(np.asarray(pairs["inputs"]).sum()) % (2 ** 31)


def corruption_scores(model, pairs, *, prev: int,
                      sender_layer: int = 0, receiver_layer: int = 1,
                      resamples: int = 1000) -> dict:
  """One corruption's joint sets and per-head patching, as NumPy.

  Returns per direction ("denoise", "noise"): "fraction" `[S]` (the
  patching score of each set of `joint_sets`), "interval" `[S, 2]` (95%
  bootstrap over the examples), "metric" `[S]` (the raw patched mean
  log-prob), "activation" and "attribution" `[L, H]`; and "names" `[S]`,
  "reference" (the raw clean and corrupted mean log-prob) and "examples".
  """
  graphdef, state = nnx.split(model)
  names, routes = joint_sets(model.config.num_heads, prev)
  count = np.asarray(pairs["loss_mask"]).sum(-1)
  out = {"names": names, "examples": int(count.size)}
  for d in DIRECTIONS:
    noising = d == "noise"
    raw = jax.tree.map(np.asarray, _joint_raw(
        graphdef, state, pairs, jnp.asarray(routes), jnp.asarray(noising),
        sender_layer, receiver_layer))
    args = (raw["patched"], raw["clean"], raw["corrupted"], noising)
    heads = jax.tree.map(np.asarray, _per_head(
        graphdef, state, pairs, jnp.asarray(noising), sender_layer,
        receiver_layer, False))
    out[d] = {"fraction": calibration.pooled_fractions(*args),
              "interval": calibration.bootstrap_fractions(
                  *args, resamples=resamples, seed=_bootstrap_seed(pairs)),
              "metric": raw["patched"].sum(-1) / count.sum(),
              "activation": heads["activation"],
              "attribution": heads["attribution"]}
    out["reference"] = [float(raw["clean"].sum() / count.sum()),
                        float(raw["corrupted"].sum() / count.sum())]
  return out


@functools.partial(jax.jit, static_argnums=0)
def _per_position(graphdef, state, pairs, noising):
  model, args = _setup(graphdef, state, pairs)
  n = model.config.num_layers
  resid, z = _sites(n, "resid_pre"), _sites(n, "attn.z")
  kw = dict(sites=resid + z, per_position=True, noising=noising, **args)
  act = patching.activation_patching(batch_size=8, **kw)
  attr = patching.attribution_patching(**kw)
  split = lambda d: {"resid_pre": jnp.stack([d[s] for s in resid]),  # [L, T]
                     "z": jnp.stack([d[s] for s in z])}  # [L, H, T]
  return {"activation": split(act), "attribution": split(attr),
          "reference": jnp.stack(args["reference"])}


def _directions(fn, *args):
  """`{"denoise": fn(..., False), "noise": fn(..., True)}`, the flag
  passed as an array so that both calls share one compiled program."""
  return {d: fn(*args[:3], jnp.asarray(d == "noise"), *args[3:])
          for d in DIRECTIONS}


@functools.partial(jax.jit, static_argnums=0)
def _head_scores(graphdef, state, inputs):
  """`{"previous_token", "current_token", "induction"}`, each `[L, H]`."""
  model = nnx.merge(graphdef, state)
  n = model.config.num_layers
  _, acts = model(inputs, capture=_sites(n, "attn.pattern"))
  w = [acts[s] for s in _sites(n, "attn.pattern")]  # L x [B, H, T, T]
  return {"previous_token": jnp.stack([head_metrics.previous_token_score(x)
                                       for x in w]),
          "current_token": jnp.stack([head_metrics.offset_score(x, 0) for x in w]),
          "induction": jnp.stack([head_metrics.induction_score(x, inputs)
                                  for x in w])}


@functools.partial(jax.jit, static_argnums=(0, 3))
def _checkpoint_row(graphdef, state, batch, loss):
  """`_head_scores` and the task's loss on `batch`: one program."""
  row = _head_scores(graphdef, state, batch["inputs"])
  model = nnx.merge(graphdef, state)
  row["loss"] = train_state.compute_loss(model, batch, loss)[0]
  return row


def head_scores(model, inputs) -> dict:
  """Each head's previous-token, current-token (offset 0) and induction
  score on `inputs [B, T]`, as NumPy `[L, H]`."""
  graphdef, state = nnx.split(model)
  return jax.tree.map(np.asarray, _head_scores(graphdef, state, inputs))


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _weights_and_dla(graphdef, state, pairs, tokens, sender_layer,
                     receiver_layer):
  """The weight-based scores, the direct logit attribution and the head
  scores: one program (eager, the DLA's forward pass alone compiles its
  every op on its own)."""
  model = nnx.merge(graphdef, state)
  n, t = model.config.num_layers, pairs["inputs"].shape[1]
  per_layer = [composition.copying_scores(model, l, tokens) for l in range(n)]
  return {
      "composition": composition.composition_scores(
          model, sender_layer, receiver_layer),
      "composition_rotary": composition.composition_scores(
          model, sender_layer, receiver_layer, offsets=range(1, t)),
      "copying": {k: jnp.stack([c[k] for c in per_layer])
                  for k in per_layer[0]},
      "dla": composition.direct_logit_attribution(
          model, pairs["inputs"], pairs["targets"], pairs["loss_mask"],
          tokens=tokens),
      "scores": _head_scores(graphdef, state, pairs["inputs"]),
  }


def survey(model, pairs, position_pairs, *, tokens, corrupted=None,
           resamples: int = 1000, sender_layer: int = 0,
           receiver_layer: int = 1) -> dict:
  """Everything experiment 6 measures on one model, as NumPy.

  Args:
    model: a trained token `DecoderLM`.
    pairs: `corruption.induction_pairs` with each example's own layout.
    position_pairs: the same with one fixed layout (positions line up).
    tokens: the token ids that occur (the task's symbols), for the full OV
      circuits and the reference logit of the direct attribution.
    corrupted: `{kind: pairs}` of `corruption.KINDS` (the same clean
      sequences), each measured by `corruption_scores` under
      "corruptions", with the roles of `roles_of`; None: none.
    resamples: bootstrap resamples of the examples, for those.

  Returns a dict: "heads" (per direction, "denoise" and "noise": the
  "activation" and "attribution" patching scores of each head's `z`,
  `[L, H]`, the "path" grid of `path_patching_grid`, and the "reference"
  `[2]`, the metric of the clean and the corrupted run); "positions" (per
  direction, "activation" and "attribution" per position of "resid_pre"
  `[L, T]` and "z" `[L, H, T]`, and its own "reference"); "composition"
  (`[Hs, Hr]` per kind, rotary ignored) and "composition_rotary"
  (averaged over the offsets 1..T-1), "copying" (per kind `[L, H]`),
  "dla" (`direct_logit_attribution`) and "scores" (`head_scores` on the
  clean pairs); "composition_means" (`composition_means`).
  """
  graphdef, state = nnx.split(model)
  out = {"heads": _directions(_per_head, graphdef, state, pairs,
                              sender_layer, receiver_layer),
         "positions": _directions(_per_position, graphdef, state,
                                  position_pairs)}
  out.update(_weights_and_dla(graphdef, state, pairs, jnp.asarray(tokens),
                              sender_layer, receiver_layer))
  out = jax.tree.map(np.asarray, out)
  out["composition_means"] = composition_means(out["composition"],
                                               out["composition_rotary"])
  if corrupted:
    prev, _ = roles_of(out["scores"])
    out["corruptions"] = {
        kind: corruption_scores(model, p, prev=prev,
                                sender_layer=sender_layer,
                                receiver_layer=receiver_layer,
                                resamples=resamples)
        for kind, p in corrupted.items()}
  return out


def composition_means(comp, comp_rotary) -> dict:
  """Each sender head's composition averaged over the receiver heads, in
  float64: `[Hs]` per kind of `comp` (`[Hs, Hr]` each), and "k_rotary"
  of `comp_rotary["k"]`."""
  mean = lambda rows: [float(np.mean(np.asarray(r, np.float64)))
                       for r in rows]
  return {**{k: mean(comp[k]) for k in "qkv"},
          "k_rotary": mean(comp_rotary["k"])}


def checkpoint_scores(run_dir, batch) -> dict:
  """The heads' scores at step 0 and at every evaluation step of a run.

  Loads each checkpoint with `saved_run.load_state` (the run must have saved
  one at every evaluation; step 0 is the initial state, rebuilt from the
  run's config). Returns `{"steps": [S], "loss": [S]` (on `batch`, with
  the task's loss)`, "previous_token", "current_token", "induction": [S,
  L, H]}`.
  """
  steps, _ = curves.read(run_dir)
  rows = []
  for step in [0] + list(steps):
    state = saved_run.load_state(run_dir, step)[0]  # step 0: the initial state
    rows.append(_checkpoint_row(state.graphdef, state.params, batch,
                                state.loss))
  out = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}
  out["steps"] = np.asarray([0] + list(steps))
  return out


def roles_of(scores):
  """The layer-0 previous-token and current-token heads (argmax of each
  score, `head_scores`)."""
  return (int(np.argmax(scores["previous_token"][0])),
          int(np.argmax(scores["current_token"][0])))


def roles(result) -> dict:
  """The layer-0 previous-token and current-token heads of a `survey`
  result (argmax of each score) and the numbers that say what each does:
  `<role>_<q|k|v>_<noise|denoise>` (its path into that input of every
  layer-1 head), `<role>_<q|k|v>_comp` (mean composition over the layer-1
  heads), `<role>_act_<noise|denoise>` (patching its z); `k_feeder` /
  `v_feeder` (the layer-0 head whose noised path to the keys / values
  costs most) and `k_comp_top` / `v_comp_top` (the highest mean K / V
  composition)."""
  sc, comp = result["scores"], result["composition"]
  noise, denoise = result["heads"]["noise"], result["heads"]["denoise"]
  prev, cur = roles_of(sc)
  out = {"prev_head": prev, "cur_head": cur}
  for name in ("prev", "cur"):
    h = out[f"{name}_head"]
    for kind in "qkv":
      out[f"{name}_{kind}_noise"] = float(noise["path"][f"{kind}_all"][h])
      out[f"{name}_{kind}_denoise"] = float(denoise["path"][f"{kind}_all"][h])
      out[f"{name}_{kind}_comp"] = float(np.mean(comp[kind][h]))
    out[f"{name}_act_noise"] = float(noise["activation"][0, h])
    out[f"{name}_act_denoise"] = float(denoise["activation"][0, h])
  # The strongest single receiver, against all of them at once above.
  out["prev_k_noise_best_single"] = float(
      np.max(noise["path"]["k"][out["prev_head"]]))
  out["k_feeder"] = int(np.argmax(noise["path"]["k_all"]))
  out["v_feeder"] = int(np.argmax(noise["path"]["v_all"]))
  out["k_comp_top"] = int(np.argmax(np.mean(comp["k"], axis=1)))
  out["v_comp_top"] = int(np.argmax(np.mean(comp["v"], axis=1)))
  return out


def summarise(result, threshold: float) -> dict:
  """The per-model numbers experiment 6 quotes, from a `survey` result
  with "dynamics" (`checkpoint_scores`) and "curve" (the eval loss) added.

  `roles`, plus: the final eval loss; the role heads' scores and the mean
  induction score of the last layer; the largest noised query path and
  direct path; the largest denoised path; the Pearson correlation and
  largest gap between activation and attribution patching over the
  heads, per direction; the mean copying score and the summed direct
  logit attribution of each layer; and the steps by which the loss, the
  previous-token head and the last layer's mean induction score are half
  way (`curves.half_way_step`) and by which the two scores pass `threshold`
  (`curves.first_above`).
  """
  out = roles(result)
  dyn, sc = result["dynamics"], result["scores"]
  prev, steps = out["prev_head"], dyn["steps"]
  noise, denoise = result["heads"]["noise"], result["heads"]["denoise"]
  act_attr = {}
  for name, d in (("denoise", denoise), ("noise", noise)):
    a, b = d["activation"].ravel(), d["attribution"].ravel()
    act_attr[name] = {"pearson": float(np.corrcoef(a, b)[0, 1]),
                      "max_abs_diff": float(np.max(np.abs(a - b)))}
  induction = np.mean(dyn["induction"][:, -1], axis=-1)  # [S]
  prev_curve = dyn["previous_token"][:, 0, prev]  # [S]
  return dict(
      out,
      eval_loss=float(result["curve"]["loss"][-1]),
      prev_score=float(sc["previous_token"][0, prev]),
      cur_score=float(sc["current_token"][0, out["cur_head"]]),
      induction_l1_mean=float(np.mean(sc["induction"][-1])),
      q_noise_max=float(np.max(noise["path"]["q_all"])),
      direct_noise_max=float(np.max(np.abs(noise["path"]["logits"]))),
      denoise_path_max=float(max(np.max(denoise["path"][f"{k}_all"])
                                 for k in "qkv")),
      activation_vs_attribution=act_attr,
      copying_l1_mean=float(np.mean(result["copying"]["copying"][-1])),
      copying_l0_mean=float(np.mean(result["copying"]["copying"][0])),
      dla_l1_sum=float(np.sum(result["dla"]["heads"][-1])),
      dla_l0_sum=float(np.sum(result["dla"]["heads"][0])),
      dla_total=float(result["dla"]["total"]),
      loss_half_step=curves.half_way_step(steps, dyn["loss"]),
      prev_half_step=curves.half_way_step(steps, prev_curve),
      induction_half_step=curves.half_way_step(steps, induction),
      prev_formed_step=curves.first_above(steps, prev_curve, threshold),
      induction_formed_step=curves.first_above(steps, induction, threshold))


# The numbers the claims quote: (key, corruption, direction, set). In a
# set, `prev` / `cur` are the seed's role heads and `max` the layer-0 head
# with the largest value (`max:q`: the strongest query path).
HEADLINES = (
    ("fc_prev_k_noise", "first_copy", "noise", "prev:k"),
    ("fc_prev_k_denoise", "first_copy", "denoise", "prev:k"),
    ("fc_cur_v_noise", "first_copy", "noise", "cur:v"),
    ("fc_embed_v_noise", "first_copy", "noise", "embed:v"),
    ("fc_q_max_noise", "first_copy", "noise", "max:q"),
    ("fc_and_denoise", "first_copy", "denoise", "and:all_v"),
    ("fc_and_embed_denoise", "first_copy", "denoise", "and:embed_v"),
    ("fc_all_v_denoise", "first_copy", "denoise", "all:v"),
    ("fc_kv_denoise", "first_copy", "denoise", "all:kv"),
    ("fc_kv_noise", "first_copy", "noise", "all:kv"),
    ("fc_heads_qkv_denoise", "first_copy", "denoise", "heads:qkv"),
    ("fc_heads_qkv_noise", "first_copy", "noise", "heads:qkv"),
    ("fc_prev_direct_noise", "first_copy", "noise", "prev:logits"),
    ("fc_prev_through_noise", "first_copy", "noise", "prev:qkv"),
    ("sc_q_max_noise", "second_copy", "noise", "max:q"),
    ("sc_cur_q_noise", "second_copy", "noise", "cur:q"),
    ("sc_prev_q_noise", "second_copy", "noise", "prev:q"),
    ("sc_embed_q_noise", "second_copy", "noise", "embed:q"),
    ("sc_all_q_noise", "second_copy", "noise", "all:q"),
    ("sc_all_q_denoise", "second_copy", "denoise", "all:q"),
    ("key_prev_k_noise", "key", "noise", "prev:k"),
    ("key_prev_k_denoise", "key", "denoise", "prev:k"),
    ("key_cur_k_noise", "key", "noise", "cur:k"),
    ("key_all_k_denoise", "key", "denoise", "all:k"),
    ("val_cur_v_noise", "value", "noise", "cur:v"),
    ("val_cur_v_denoise", "value", "denoise", "cur:v"),
    ("val_embed_v_noise", "value", "noise", "embed:v"),
    ("val_embed_v_denoise", "value", "denoise", "embed:v"),
    ("val_all_v_denoise", "value", "denoise", "all:v"),
    ("nm_prev_k_noise", "no_match", "noise", "prev:k"),
    ("nm_cur_v_noise", "no_match", "noise", "cur:v"),
    ("nm_kv_denoise", "no_match", "denoise", "all:kv"),
)


def _resolve(spec, names, values, prev, cur):
  """`(set name, floor)` of a HEADLINES set: the floor is the largest
  value of the same route among the other layer-0 heads (None for sets
  that are not one head's)."""
  sender, route = spec.split(":")
  heads = [n for n in names if n.startswith("h") and n.endswith(f":{route}")]
  if sender == "max":
    name = max(heads, key=lambda n: values[names.index(n)])
  elif sender in ("prev", "cur"):
    name = f"h{prev if sender == 'prev' else cur}:{route}"
  else:
    return spec, None
  others = [values[names.index(n)] for n in heads if n != name]
  return name, (float(max(others)) if others else None)


def corruption_numbers(result) -> dict:
  """A `survey` result's HEADLINES, each `{"value", "interval",
  "metric", "floor", "set"}` (the fraction, its bootstrap interval over
  examples, the raw patched mean log-prob, the floor of `_resolve`), and
  per corruption the raw clean and corrupted metric (`reference`)."""
  prev, cur = roles_of(result["scores"])
  out = {}
  for key, kind, d, spec in HEADLINES:
    c = result["corruptions"][kind]
    names, values = list(c["names"]), c[d]["fraction"]
    name, floor = _resolve(spec, names, values, prev, cur)
    i = names.index(name)
    out[key] = {"value": float(values[i]),
                "interval": [float(x) for x in c[d]["interval"][i]],
                "metric": float(c[d]["metric"][i]), "floor": floor,
                "set": name}
  out["reference"] = {kind: [float(x) for x in c["reference"]]
                      for kind, c in result["corruptions"].items()}
  return out


def attribution_calibration(result, k: int = 1) -> dict:
  """Per layer and direction, attribution against activation patching of
  the heads' z over every corruption: `calibration.calibration` of the
  pooled points (slope, r) and the top-k agreement within each
  corruption, averaged; and "pooled_r" over both layers (the old
  statistic, which mostly measures how the layers differ)."""
  out = {}
  for d in DIRECTIONS:
    per = [result["corruptions"][kind][d]
           for kind in result["corruptions"]]
    act = np.stack([p["activation"] for p in per])  # [C, L, H]
    attr = np.stack([p["attribution"] for p in per])
    for layer in range(act.shape[1]):
      cal = calibration.calibration(act[:, layer], attr[:, layer], k=k)
      cal["top_k"] = float(np.mean([
          calibration.top_k_agreement(a, e, k)
          for a, e in zip(act[:, layer], attr[:, layer])]))
      out[f"{d}_l{layer}"] = cal
    out[f"{d}_pooled_r"] = calibration.calibration(act, attr)["pearson"]
  return out
