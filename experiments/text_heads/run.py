"""Heads on real text, measuring: train the byte-level models and survey them.

`measure` trains the models of `config.experiment.variants` on the
training files of the corpus, measures every model on held-out files with
`experiments.text_heads.survey` (bits per byte beside n-gram models, every
head's scores with their floors, the taxonomy, ablations, and the scores
at every checkpoint), writes the explorer page of one model, runs the
induction detectors' controls (`experiments.text_heads.control`) and
returns the results dict. Shape letters: L layers, H heads, T length.
"""

from __future__ import annotations

import os
import pathlib
import platform
import time

import numpy as np

from experiments.text_heads import control
from experiments.text_heads import heads
from experiments.text_heads import survey
from mha_jax.interp import explorer
from mha_jax.measure import curves
from mha_jax.measure import runs as runs_lib
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import text_corpus
from mha_jax.training import train_state

# Scores whose best head per model the report sets beside its floors:
# (key, what it credits).
BEST = (
    ("previous_token", "previous byte"),
    ("fixed_offset_weight", "one fixed offset (0-max_offset)"),
    ("first_token", "first byte of the window (sink)"),
    ("line_start", "newline that began the line"),
    ("indentation", "indentation of the line"),
    ("open_bracket", "innermost open bracket"),
    ("word_start", "byte before the current word"),
    ("duplicate_token", "earlier copies of the same byte"),
    ("induction", "byte after an earlier copy of the byte (k = 1)"),
    ("span_induction", "byte after an earlier copy of the last 3 bytes"),
    ("span_induction_strict", "the same, keys beyond the fixed offsets, "
     "no one-byte runs"),
    ("repeat_induction", "byte after the earlier copy, repeated text"),
    ("rare_byte", "rarest earlier byte"),
)


def _measure_run(config, r, uni_counts, uniform):
  """One run's `survey`, with its n-gram floors, dynamics and landmarks;
  returns (that dict, the model, the untrained model, the held-out batch).

  `uniform` {seed: `survey.floors`}: computed once per seed, as every
  variant of a seed is measured on the same windows.
  """
  e = config.experiment
  batch = survey.held_out_batch(
      r.config, e.analysis_examples, held_out.ANALYSIS_SEED + r.seed)
  rep = survey.repeated_batch(batch, config.task.seq_len // 2)
  model = r.state.model()
  init = train_state.create_train_state(r.config).model()
  if r.seed not in uniform:  # the same windows for every variant
    uniform[r.seed] = survey.floors(
        batch, rep, counts=uni_counts, max_offset=e.max_offset)
  res = survey.survey(
      model, batch, rep, counts=uni_counts, thresholds=e.thresholds,
      max_offset=e.max_offset, init_model=init, uniform=uniform[r.seed])
  res["ngram"] = survey.ngram_bits(r.config, batch)
  # The bigram model reads one byte of context wherever it stands, so
  # its late-minus-early difference is what the text itself differs
  # by between those positions: the floor of the ICL score.
  res["ngram"]["bigram_icl"] = float(heads.in_context_score(
      survey.ngram_per_position(r.config, batch)["bigram"],
      tuple(e.early_positions), tuple(e.late_positions)).mean())
  res["dynamics"] = survey.dynamics(
      r.run_dir, batch, rep, early=tuple(e.early_positions),
      late=tuple(e.late_positions))
  res["landmarks"] = _landmarks(res["dynamics"], e.thresholds.induction)
  return res, model, init, batch


def _shown(workdir, res, model, init, batch, e, title):
  """Adds what the report shows of one model: its explorer page's
  snippet ("explorer_text") and the first 40 bytes' attention
  ("weights_example": `([L, H, 40, 40], [40])`, kept out of
  results.json)."""
  res["explorer_text"] = _explorer(workdir, model, init, batch, e, title)
  res["weights_example"] = (
      held_out.weights_of(model, {"inputs": batch["inputs"][:1]})
      ["self"][:, 0, :, :40, :40], batch["inputs"][0, :40])


def _corpus_info(corpus) -> dict:
  """The corpus, named, not located: a report says which text, not where
  a machine keeps it."""
  return {"corpus": corpus.name,
          "describe": (f"the standard library of Python "
                       f"{platform.python_version()}"
                       if corpus.name == text_corpus.STDLIB
                       else "a corpus given by path"),
          "train_files": len(corpus.train.documents),
          "train_bytes": corpus.train.num_bytes,
          "held_out_files": len(corpus.held_out.documents),
          "held_out_bytes": corpus.held_out.num_bytes}


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train (or reuse) and measure every variant's seeds, then the
  detectors' controls; returns the results dict ("corpus", "variants",
  their "welch" tests, "control", "runs" and the times)."""
  start, cpu_start = time.time(), _cpu_seconds()
  e = config.experiment
  workdir = pathlib.Path(workdir)
  corpus = tasks.text_corpus_of(config.task)  # fails early if it is bad
  uni_counts = survey.train_counts(config)[0]
  runs, by_variant, uniform = {}, {}, {}
  train_s = 0.0
  for variant in e.variants:
    overrides = survey.parse_variant(variant, repeat_prob=e.repeat_prob)
    by_variant[variant] = []
    seed_runs = runs_lib.seed_runs(config, workdir, e.seeds,
                                   f"{variant}_seed{{seed}}",
                                   reuse=reuse, **overrides)
    while True:
      t0 = time.time()
      r = next(seed_runs, None)  # trains the run (or loads it, reused)
      train_s += time.time() - t0
      if r is None:
        break
      res, model, init, batch = _measure_run(config, r, uni_counts, uniform)
      runs[r.run_dir.name] = res
      by_variant[variant].append(res)
      if variant == e.variants[-1] and r.seed == e.seeds[0]:
        _shown(workdir, res, model, init, batch, e,
               f"{variant}, seed {r.seed}")
  t0 = time.time()
  ctl = control.measure(config, workdir / "control", reuse=reuse)
  ctl["time_s"] = round(time.time() - t0, 1)
  variants = {v: _summary(rs) for v, rs in by_variant.items()}
  return {"corpus": _corpus_info(corpus),
          "variants": variants,
          "welch": welch_tests(variants),
          "control": ctl,
          "runs": runs,
          "wall_time_s": round(time.time() - start, 1),
          "train_time_s": round(train_s, 1),
          "cpu_time_s": round(_cpu_seconds() - cpu_start, 1)}


def _cpu_seconds() -> float:
  """User plus system CPU time of this process, all threads."""
  t = os.times()
  return t.user + t.system


def _landmarks(dyn, threshold) -> dict:
  """When the ICL score and the best induction score moved (per run)."""
  steps = dyn["steps"]
  icl, ind = np.asarray(dyn["icl"]), np.asarray(dyn["max_induction"])
  corr = (float(np.corrcoef(icl, ind)[0, 1])
          if np.std(icl) > 0 and np.std(ind) > 0 else None)
  return {"icl_half_step": curves.half_way_step(steps, icl),
          "induction_half_step": curves.half_way_step(steps, ind),
          "induction_first_step": curves.first_above(steps, ind, threshold),
          "corr_icl_induction": corr}


def _summary(rs) -> dict:
  """Per-seed values, mean, sample std and t interval of each headline."""
  def best(r, key):
    return float(np.max(r["scores"][key]))

  uniform_best = lambda r, key: float(
      np.max(r["floors"]["uniform"]["offset_profile"])
      if key == "fixed_offset_weight" else r["floors"]["uniform"][key])
  out = {
      "bpb": [r["bpb"] for r in rs],
      "unigram": [r["ngram"]["unigram"] for r in rs],
      "bigram": [r["ngram"]["bigram"] for r in rs],
      "bpb_minus_bigram": [r["bpb"] - r["ngram"]["bigram"] for r in rs],
      "init_bpb": [r["floors"]["init"]["bpb"] for r in rs],
      "icl": [r["dynamics"]["icl"][-1] for r in rs],
      "icl_init": [r["dynamics"]["icl"][0] for r in rs],
      "icl_bigram": [r["ngram"]["bigram_icl"] for r in rs],
      "icl_minus_bigram": [r["dynamics"]["icl"][-1] - r["ngram"]["bigram_icl"]
                           for r in rs],
      "repeat_gain": [r["repeat_bits"][0] - r["repeat_bits"][1] for r in rs],
      "repeat_gain_init": [r["dynamics"]["repeat_gain"][0] for r in rs],
      "icl_half_step": [r["landmarks"]["icl_half_step"] for r in rs],
  }
  for key, _ in BEST:
    out[f"best_{key}"] = [best(r, key) for r in rs]
    out[f"best_{key}_init"] = [float(np.max(r["floors"]["init"]["scores"]
                                            [key])) for r in rs]
    out[f"uniform_{key}"] = [uniform_best(r, key) for r in rs]
  for cls in heads.CLASSES:
    out[f"count_{cls}"] = [r["taxonomy"]["counts"][cls] for r in rs]
  # The strict span score against the plain one: the head the plain
  # score ranks first, and what the strict score makes of it.
  top = [_top_span_head(r) for r in rs]
  out["top_span_head_plain"] = [t["plain"] for t in top]
  out["top_span_head_strict"] = [t["strict"] for t in top]
  for key in ("span_induction", "span_induction_strict"):
    out[f"best_{key}_minus_init"] = [
        a - b for a, b in zip(out[f"best_{key}"], out[f"best_{key}_init"])]
  corr = [r["landmarks"]["corr_icl_induction"] for r in rs]
  summary = {k: stats.summary(v) for k, v in out.items()}
  summary["corr_icl_induction"] = (stats.summary([c for c in corr
                                                  if c is not None])
                                   if any(c is not None for c in corr)
                                   else None)
  summary["top_span_head_offset"] = [t["offset"] for t in top]
  summary["top_span_head_offset_weight"] = [t["offset_weight"] for t in top]
  summary["induction_first_step"] = [r["landmarks"]["induction_first_step"]
                                     for r in rs]
  summary["positional_offsets"] = sorted(
      int(d) for r in rs for d, lab in zip(
          np.ravel(r["scores"]["fixed_offset"]),
          np.ravel(r["taxonomy"]["label"])) if lab == "positional")
  summary["class_ablation"] = {}
  for cls in heads.CLASSES:
    have = [r["class_ablation"][cls] for r in rs if cls in r["class_ablation"]]
    if have:
      summary["class_ablation"][cls] = {
          k: stats.summary([h[k] for h in have])
          for k in ("heads", "bpb", "random_bpb", "repeat", "random_repeat")}
  return summary


def welch_tests(variants) -> dict:
  """The Welch tests the report quotes, from the per-seed values in the
  variants' summaries (`_summary`): the last variant's held-out bits per
  byte minus the first's (None with one variant), and, per variant and
  class, the bits per byte with the class ablated minus with as many
  random heads ablated."""
  names = list(variants)
  bpb = [variants[v]["bpb"]["values"] for v in (names[-1], names[0])]
  return {"bpb_last_minus_first": (stats.difference(*bpb)
                                   if len(names) > 1 else None),
          "class_ablation_minus_random": {
              v: {cls: stats.difference(a["bpb"]["values"],
                                        a["random_bpb"]["values"])
                  for cls, a in x["class_ablation"].items()}
              for v, x in variants.items()}}


def _top_span_head(r) -> dict:
  """The head with the best plain span-induction score in one run: its
  plain and strict scores, its best fixed offset and the weight there."""
  s = r["scores"]
  at = np.unravel_index(np.argmax(s["span_induction"]),
                        np.shape(s["span_induction"]))
  return {"plain": float(s["span_induction"][at]),
          "strict": float(s["span_induction_strict"][at]),
          "offset": int(s["fixed_offset"][at]),
          "offset_weight": float(s["fixed_offset_weight"][at])}


def _explorer(workdir, model, init, batch, e, title):
  """explorer.html on held-out code; returns the snippet's text."""
  snip, _ = survey.snippet_batch(
      {k: v[:8] for k, v in batch.items()}, e.explorer_length)
  first = tasks.NUM_SPECIAL
  labels = [text_corpus.byte_label(t, first_id=first)
            for t in snip["inputs"][0]]
  text = text_corpus.text_of(snip["inputs"][0], first_id=first)
  explorer.write_explorer(
      model, snip, workdir / "explorer.html", loss="xent", init_model=init,
      title=f"Heads on real text: {title}, held-out code",
      info=[("snippet (held-out file)", text)], labels={"inputs": labels},
      specials=False, raw_arrays=False)
  return text

