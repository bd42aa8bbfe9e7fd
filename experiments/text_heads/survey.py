"""A byte-level language model measured on held-out files.

Shape letters: L layers, B examples, H heads, T length, n length of a
repeated segment (T = 2 n), V byte values.

What experiments/text_heads reports for each trained model, as library
functions (they jit their own steps, as `mha_jax.interp.interventions` does):

  * `held_out_batch`: windows of the held-out files (the text task's
    "held_out" split), drawn from a seed, never seen in training;
  * `ngram_bits`: bits per byte of a unigram and a bigram model counted on
    the TRAINING files, measured on the same held-out windows as a model;
  * `repeated_batch`: the first n bytes of each held-out window, given
    twice (Olsson et al.'s repeated-sequence test on real text);
  * `per_position_loss`, `bits_per_byte`: the model's next-byte loss;
  * `survey`: every head's scores (`text_heads.text_scores` on natural
    text, the induction score on repeated text), their floors (uniform
    attention, and the same model untrained, laid out by
    `mha_jax.interp.survey.floored`), the taxonomy
    (`text_heads.classify`), each head's and each class's ablation effect
    on held-out bits per byte and on the repeated half;
  * `dynamics`: bits per byte, the in-context-learning score and the best
    induction score at every checkpoint of a run.
"""

from __future__ import annotations

import functools
import math
import re

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from experiments.text_heads import heads as text_heads
from mha_jax.interp import head_metrics
from mha_jax.interp import survey as head_survey
from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import text_corpus
from mha_jax.training import saved_run

LN2 = math.log(2.0)
_FIRST = tasks.NUM_SPECIAL


def parse_variant(name: str, *, repeat_prob: float) -> dict:
  """`"L4+MLP"` -> `{"model.num_layers": 4, "model.attention_only": False,
  "task.repeat_prob": 0.0}` (`"L<layers>"`: attention-only; `"+MLP"`: an
  MLP in every block; `"+rep"`: `repeat_prob` of the training windows
  hold a repeated span, see `tasks.text_batch`)."""
  m = re.fullmatch(r"L(\d+)(\+MLP)?(\+rep)?", name)
  if not m or int(m.group(1)) < 1:
    raise ValueError(f"config.experiment.variants: {name!r} is not "
                     "'L<layers>', optionally followed by '+MLP' and '+rep' "
                     "(e.g. 'L2', 'L4+MLP', 'L2+rep')")
  return {"model.num_layers": int(m.group(1)),
          "model.attention_only": m.group(2) is None,
          "task.repeat_prob": repeat_prob if m.group(3) else 0.0}


def held_out_batch(config, num_examples: int, seed: int) -> dict:
  """`num_examples` held-out windows (the text task's batch dict)."""
  batch = held_out.analysis_batch(held_out.text_config(config), num_examples,
                                  seed=seed)
  return jax.tree.map(np.asarray, batch)


@functools.lru_cache(maxsize=4)
def _train_counts(task_items):
  task = ml_collections.ConfigDict(dict(task_items))
  task.split = "train"
  return text_corpus.byte_counts(tasks.text_split(task))


def train_counts(config):
  """`(unigram [V], bigram [V, V])` byte counts of the training files."""
  return _train_counts(tuple(sorted(config.task.to_dict().items())))


def ngram_per_position(config, batch) -> dict:
  """Bits of n-gram models of the training files at every position of
  `batch`: {"unigram", "bigram"} -> `[B, T]`.

  Unigram: counts plus one. Bigram: each byte's counts after the previous
  byte plus the unigram distribution as a prior of weight one byte
  (Dirichlet smoothing), so an unseen pair gets the unigram probability.
  Both on exactly the (input, target) pairs the model is scored on.
  """
  uni, bi = train_counts(config)
  p_uni = (uni + 1.0) / (uni.sum() + text_corpus.NUM_BYTES)
  p_bi = (bi + p_uni[None, :]) / (bi.sum(axis=1, keepdims=True) + 1.0)
  x = np.asarray(batch["inputs"]) - _FIRST
  y = np.asarray(batch["targets"]) - _FIRST
  return {"unigram": -np.log2(p_uni[y]), "bigram": -np.log2(p_bi[x, y])}


def ngram_bits(config, batch) -> dict:
  """Mean bits per byte of `ngram_per_position` on `batch`."""
  return {k: float(v.mean())
          for k, v in ngram_per_position(config, batch).items()}


def repeated_batch(batch, n: int) -> dict:
  """Bytes 0..n-1 of each window, then the same n bytes again.

  `inputs [B, 2n]`; targets are the next byte (the second copy's last
  target is the window's byte n); `loss_mask` leaves out position n - 1,
  whose target (the start of the repeat) no text predicts. Needs windows
  of at least n + 1 bytes.
  """
  x = np.concatenate([np.asarray(batch["inputs"]),
                      np.asarray(batch["targets"])[:, -1:]], axis=1)
  if x.shape[1] < n + 1:
    raise ValueError(f"repeated_batch: windows of {x.shape[1]} bytes are "
                     f"shorter than n + 1 = {n + 1}")
  seq = np.concatenate([x[:, :n], x[:, :n + 1]], axis=1)  # [B, 2n+1]
  mask = np.ones(seq.shape[1] - 1, np.float32)
  mask[n - 1] = 0.0
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:],
          "loss_mask": np.broadcast_to(mask, (x.shape[0], 2 * n)).copy()}


@functools.partial(jax.jit, static_argnums=0)
def _loss_and_weights(graphdef, state, inputs, targets):
  logits, weights = nnx.merge(graphdef, state)(inputs, return_weights=True)
  loss = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), targets)
  return loss, weights["self"]


def per_position_loss(model, batch, gates=None) -> np.ndarray:
  """Next-byte loss in BITS at every position, `[B, T]`; `gates [L, H]`
  multiplies each head's output (0 removes it)."""
  return held_out.per_position_loss(model, batch, gates) / LN2


def bits_per_byte(model, batch, gates=None) -> float:
  """Mean next-byte loss in bits over `batch`'s `loss_mask`."""
  loss = per_position_loss(model, batch, gates)
  mask = np.asarray(batch["loss_mask"])
  return float((loss * mask).sum() / mask.sum())


def _halves(loss, n):
  """Mean bits on the first copy (0..n-2) and the second (n..2n-1)."""
  return float(loss[:, :n - 1].mean()), float(loss[:, n:].mean())


_text_scores = jax.jit(text_heads.text_scores,
                       static_argnames=("max_offset", "span", "first_id"))
_target_score = jax.jit(text_heads.target_score)
_previous_token = jax.jit(head_metrics.previous_token_score)


def _weights(model, batch):
  weights = held_out.weights_of(model, {"inputs": batch["inputs"]})
  return weights["self"]  # [L, B, H, T, T]


def head_scores(model, batch, rep_batch, *, counts, max_offset: int,
                span: int = 3) -> dict:
  """name -> `[L, H]`: `text_heads.text_scores` on `batch` and
  "repeat_induction" (weight on the byte after the earlier copy) on
  `rep_batch`."""
  w = _weights(model, batch)
  tokens = np.asarray(batch["inputs"])
  per_layer = [_text_scores(wl, tokens, counts=counts, max_offset=max_offset,
                            span=span) for wl in w]
  out = {k: np.stack([np.asarray(p[k]) for p in per_layer])
         for k in per_layer[0]}
  out["repeat_induction"] = repeat_induction(model, rep_batch)
  return out


def repeat_induction(model, rep_batch) -> np.ndarray:
  """`[L, H]`: each head's weight on the byte after the earlier copy."""
  w = _weights(model, rep_batch)
  t = w.shape[-1]
  targets = text_heads.repeat_targets(t, t // 2)
  return np.stack([np.asarray(_target_score(wl, targets)) for wl in w])


def floors(batch, rep_batch, *, counts, max_offset: int,
           span: int = 3) -> dict:
  """name -> the score of uniform causal attention on the same sequences.

  "offset_profile" `[max_offset + 1]`: uniform's weight at each offset
  (the floor of a head's fixed-offset weight is the entry at its offset).
  """
  tokens = np.asarray(batch["inputs"])
  b, t = tokens.shape
  u = head_metrics.uniform_causal_weights(b, t)
  s = _text_scores(u, tokens, counts=counts, max_offset=max_offset, span=span)
  out = {k: float(np.asarray(v)[0]) for k, v in s.items()}
  out["offset_profile"] = np.asarray(
      text_heads.offset_profile(u, max_offset))[0]
  rb, rt = np.shape(rep_batch["inputs"])
  out["repeat_induction"] = float(_target_score(
      head_metrics.uniform_causal_weights(rb, rt),
      text_heads.repeat_targets(rt, rt // 2))[0])
  return out


def _class_floors(fl, scores):
  """The floors `text_heads.classify` compares each head's scores with."""
  out = {k: fl[k] for k in ("first_token", "repeat_induction", "line_start",
                            "indentation", "open_bracket", "word_start")}
  out["fixed_offset_weight"] = np.asarray(fl["offset_profile"])[
      np.asarray(scores["fixed_offset"], int)]
  return out


def ablation(model, batch, rep_batch) -> dict:
  """Each head removed alone: `[L, H]` increase of held-out bits per byte
  ("bpb") and of the bits on the repeated half ("repeat")."""
  n = np.shape(rep_batch["inputs"])[1] // 2
  ones = held_out.head_gates(model)
  clean = bits_per_byte(model, batch, ones)
  clean_rep = _halves(per_position_loss(model, rep_batch, ones), n)[1]
  out = {"bpb": np.zeros(ones.shape), "repeat": np.zeros(ones.shape),
         "clean_bpb": clean, "clean_repeat": clean_rep}
  for l in range(ones.shape[0]):
    for h in range(ones.shape[1]):
      g = ones.copy()
      g[l, h] = 0.0
      out["bpb"][l, h] = bits_per_byte(model, batch, g) - clean
      out["repeat"][l, h] = _halves(per_position_loss(model, rep_batch, g),
                                    n)[1] - clean_rep
  return out


def class_ablation(model, batch, rep_batch, label, *, draws: int = 4,
                   seed: int = 0) -> dict:
  """Every head of a class removed at once, beside as many random heads.

  `label [L, H]` (`classify`'s). Per class with at least one head:
  "heads", the increase of held-out bits per byte ("bpb") and of the
  repeated half's bits ("repeat"), and the mean of both over `draws`
  random sets of as many heads ("random_bpb", "random_repeat").
  """
  n = np.shape(rep_batch["inputs"])[1] // 2
  ones = held_out.head_gates(model)
  label = np.asarray(label)
  clean = bits_per_byte(model, batch, ones)
  clean_rep = _halves(per_position_loss(model, rep_batch, ones), n)[1]

  def effect(off):
    g = ones.copy()
    g.ravel()[off] = 0.0
    return (bits_per_byte(model, batch, g) - clean,
            _halves(per_position_loss(model, rep_batch, g), n)[1] - clean_rep)

  rng = np.random.default_rng(seed)
  out = {}
  for cls in text_heads.CLASSES:
    heads = np.flatnonzero(label.ravel() == cls)
    if not heads.size:
      continue
    bpb, rep = effect(heads)
    rand = [effect(rng.choice(label.size, heads.size, replace=False))
            for _ in range(draws)]
    out[cls] = {"heads": int(heads.size), "bpb": bpb, "repeat": rep,
                "random_bpb": float(np.mean([r[0] for r in rand])),
                "random_repeat": float(np.mean([r[1] for r in rand]))}
  return out


def survey(model, batch, rep_batch, *, counts, thresholds, max_offset: int,
           init_model=None, uniform=None, span: int = 3) -> dict:
  """Everything the report says about one trained model.

  Returns "bpb", "repeat_bits" (first copy, second copy), "scores" (name
  -> `[L, H]`, `head_scores`), "floors" ("uniform": `floors`; "init": the
  untrained model's scores and bits per byte, given `init_model`),
  "taxonomy" (`text_heads.classify`), "ablation" (`ablation`) and
  "class_ablation" (`class_ablation`). `uniform`: `floors` of the same
  batches when the caller has them already (they depend on the text
  only, so models measured on the same windows share them).
  """
  n = np.shape(rep_batch["inputs"])[1] // 2
  kw = dict(counts=counts, max_offset=max_offset, span=span)

  def measure(m):
    return {"scores": head_scores(m, batch, rep_batch, **kw),
            "bpb": bits_per_byte(m, batch)}

  s = head_survey.floored(
      model, measure,
      uniform=((lambda: floors(batch, rep_batch, **kw)) if uniform is None
               else lambda: uniform),
      init_model=init_model,
      ablate=lambda m: ablation(m, batch, rep_batch))
  scores, fl = s["trained"]["scores"], s["uniform"]
  taxonomy = text_heads.classify(scores, _class_floors(fl, scores),
                                 thresholds)
  out = {
      "bpb": s["trained"]["bpb"],
      "repeat_bits": _halves(per_position_loss(model, rep_batch), n),
      "scores": scores,
      "floors": {"uniform": fl},
      "taxonomy": taxonomy,
      "ablation": s["ablation"],
      "class_ablation": class_ablation(model, batch, rep_batch,
                                       taxonomy["label"]),
  }
  if "init" in s:
    out["floors"]["init"] = s["init"]
  return out


def dynamics(run_dir, batch, rep_batch, *, early, late) -> dict:
  """Measured at step 0 and at every checkpoint of a run.

  Returns lists over steps: "steps", "bpb" (held-out), "icl"
  (`text_heads.in_context_score` of the per-position bits on `batch`),
  "repeat_gain" (bits on the first copy minus the second: what copying
  from the earlier copy saves), "max_induction" (best
  `repeat_induction` over all heads) and "max_previous_token" (best
  previous-token score, read from the same repeated-text patterns: one
  forward pass with weights per checkpoint).
  """
  steps = saved_run.checkpoint_steps(run_dir)
  n = np.shape(rep_batch["inputs"])[1] // 2
  out = {k: [] for k in ("steps", "bpb", "icl", "repeat_gain",
                         "max_induction", "max_previous_token")}
  for step in [0] + list(steps):
    state = saved_run.load_state(run_dir, step)[0]  # step 0: the initial state
    model = state.model()
    loss = per_position_loss(model, batch)
    rep_loss, w = _loss_and_weights(state.graphdef, state.params,
                                    rep_batch["inputs"], rep_batch["targets"])
    first, second = _halves(np.asarray(rep_loss) / LN2, n)
    targets = text_heads.repeat_targets(2 * n, n)
    out["steps"].append(int(step))
    out["bpb"].append(float(loss.mean()))
    out["icl"].append(float(text_heads.in_context_score(loss, early,
                                                        late).mean()))
    out["repeat_gain"].append(first - second)
    out["max_induction"].append(max(float(np.max(_target_score(wl, targets)))
                                    for wl in w))
    out["max_previous_token"].append(max(
        float(np.max(_previous_token(wl))) for wl in w))
  return out


def snippet_batch(batch, length: int) -> tuple[dict, int]:
  """A batch of `length` bytes of each window, starting at its first line
  start (so the explorer shows whole lines); returns (batch, start)."""
  x = np.concatenate([np.asarray(batch["inputs"]),
                      np.asarray(batch["targets"])[:, -1:]], axis=1)
  room = x.shape[1] - length - 1
  if room < 0:
    raise ValueError(f"snippet_batch: windows of {x.shape[1]} bytes cannot "
                     f"hold {length + 1}")
  newline = np.flatnonzero(x[0, :room] == text_heads.NEWLINE + _FIRST)
  start = int(newline[0]) + 1 if newline.size else 0
  seq = x[:, start:start + length + 1]
  return ({"inputs": seq[:, :-1], "targets": seq[:, 1:],
           "loss_mask": np.ones((x.shape[0], length), np.float32)}, start)
