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

from mha_jax.interp import composition
from mha_jax.interp import head_metrics
from mha_jax.interp import patching
from mha_jax.measure import curves
from mha_jax.training import train

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
@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _per_head(graphdef, state, pairs, noising, sender_layer, receiver_layer):
  model, args = _setup(graphdef, state, pairs)
  z = _sites(model.config.num_layers, "attn.z")
  act = patching.activation_patching(sites=z, noising=noising, **args)
  attr = patching.attribution_patching(sites=z, noising=noising, **args)
  return {"activation": jnp.stack([act[s] for s in z]),  # [L, H]
          "attribution": jnp.stack([attr[s] for s in z]),
          "path": patching.path_patching_grid(
              sender_layer=sender_layer, receiver_layer=receiver_layer,
              noising=noising, **args),
          "reference": jnp.stack(args["reference"])}


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
  row["loss"] = train.compute_loss(model, batch, loss)[0]
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


def survey(model, pairs, position_pairs, *, tokens, sender_layer: int = 0,
           receiver_layer: int = 1) -> dict:
  """Everything experiment 6 measures on one model, as NumPy.

  Args:
    model: a trained token `DecoderLM`.
    pairs: `corruption.induction_pairs` with each example's own layout.
    position_pairs: the same with one fixed layout (positions line up).
    tokens: the token ids that occur (the task's symbols), for the full OV
      circuits and the reference logit of the direct attribution.

  Returns a dict: "heads" (per direction, "denoise" and "noise": the
  "activation" and "attribution" patching scores of each head's `z`,
  `[L, H]`, the "path" grid of `path_patching_grid`, and the "reference"
  `[2]`, the metric of the clean and the corrupted run); "positions" (per
  direction, "activation" and "attribution" per position of "resid_pre"
  `[L, T]` and "z" `[L, H, T]`, and its own "reference"); "composition"
  (`[Hs, Hr]` per kind, rotary ignored) and "composition_rotary"
  (averaged over the offsets 1..T-1), "copying" (per kind `[L, H]`),
  "dla" (`direct_logit_attribution`) and "scores" (`head_scores` on the
  clean pairs).
  """
  graphdef, state = nnx.split(model)
  out = {"heads": _directions(_per_head, graphdef, state, pairs,
                              sender_layer, receiver_layer),
         "positions": _directions(_per_position, graphdef, state,
                                  position_pairs)}
  out.update(_weights_and_dla(graphdef, state, pairs, jnp.asarray(tokens),
                              sender_layer, receiver_layer))
  return jax.tree.map(np.asarray, out)


def checkpoint_scores(run_dir, batch) -> dict:
  """The heads' scores at step 0 and at every evaluation step of a run.

  Loads each checkpoint with `train.load_state` (the run must have saved
  one at every evaluation; step 0 is the initial state, rebuilt from the
  run's config). Returns `{"steps": [S], "loss": [S]` (on `batch`, with
  the task's loss)`, "previous_token", "current_token", "induction": [S,
  L, H]}`.
  """
  steps, _ = curves.read(run_dir)
  rows = []
  for step in [0] + list(steps):
    state = train.load_state(run_dir, step)[0]  # step 0: the initial state
    rows.append(_checkpoint_row(state.graphdef, state.params, batch,
                                state.loss))
  out = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}
  out["steps"] = np.asarray([0] + list(steps))
  return out


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
  out = {"prev_head": int(np.argmax(sc["previous_token"][0])),
         "cur_head": int(np.argmax(sc["current_token"][0]))}
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
