"""Heads on real text, reporting: tables, figures and claims from the results.

`write` turns the results dict of `run.measure` into report.md, its PNG
figures (`figures.draw`) and results.json. Shape letters: L layers, H heads.
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments.text_heads import control as control_lib
from experiments.text_heads import figures as text_figures
from experiments.text_heads import heads
from experiments.text_heads import run as run_lib
from mha_jax.measure import report as report_lib
from mha_jax.measure import stats
from mha_jax.training import tasks


def _ms(x, digits=3):
  return report_lib.fmt(x["mean"], x["std"], digits)


def _paired(x, digits=3):
  """A summary of per-seed differences as `+mean [lo, hi]`."""
  return report_lib.difference({"diff": x["mean"], "ci95": x["ci95"]},
                               digits, interval_spec=f".{digits}f",
                               missing="n/a")


def _ci(x, digits=3):
  return f"{_ms(x, digits)} {report_lib.interval(x['ci95'], digits)}"


def _head_rows(r):
  s, abl, lab = r["scores"], r["ablation"], r["taxonomy"]["label"]
  n_layers, n_heads = lab.shape
  rows = []
  for l in range(n_layers):
    for h in range(n_heads):
      rows.append([report_lib.head_name(l, h), lab[l, h],
                   f"{s['first_token'][l, h]:.2f}",
                   f"{s['repeat_induction'][l, h]:.2f}",
                   f"{int(s['fixed_offset'][l, h])}: "
                   f"{s['fixed_offset_weight'][l, h]:.2f}",
                   f"{s['line_start'][l, h]:.2f}",
                   f"{s['indentation'][l, h]:.2f}",
                   f"{s['open_bracket'][l, h]:.2f}",
                   f"{s['word_start'][l, h]:.2f}",
                   f"{s['span_induction'][l, h]:.2f}",
                   f"{s['span_induction_strict'][l, h]:.2f}",
                   f"{s['rare_byte'][l, h]:.2f}",
                   f"{s['entropy'][l, h]:.2f}",
                   f"{abl['bpb'][l, h]:+.3f}", f"{abl['repeat'][l, h]:+.3f}"])
  u = r["floors"]["uniform"]
  rows.append(["uniform causal", "-", f"{u['first_token']:.2f}",
               f"{u['repeat_induction']:.2f}",
               f"{np.max(u['offset_profile']):.2f}",
               f"{u['line_start']:.2f}", f"{u['indentation']:.2f}",
               f"{u['open_bracket']:.2f}", f"{u['word_start']:.2f}",
               f"{u['span_induction']:.2f}",
               f"{u['span_induction_strict']:.2f}",
               f"{u['rare_byte']:.2f}", f"{u['entropy']:.2f}", "-", "-"])
  return rows


HEAD_COLUMNS = ["head", "class", "first byte", "repeat induction",
                "best offset: weight", "line start", "indentation",
                "open bracket", "word start", "3-byte induction",
                "strict 3-byte induction", "rare byte",
                "entropy (nats)", "ablation Δbpb", "ablation Δrepeat bits"]


def _steps(values):
  return ", ".join("never" if v is None else str(v) for v in values)


def _best_rows(summary, variants):
  rows = []
  first = summary[variants[0]]
  for key, what in run_lib.BEST:
    rows.append([f"{key} ({what})"]
                + [f"{_ms(summary[v][f'best_{key}'], 2)} (init "
                   f"{summary[v][f'best_{key}_init']['mean']:.2f})"
                   for v in variants]
                + [f"{first[f'uniform_{key}']['mean']:.3f}"])
  return rows


def _setup_lines(config, results) -> list[str]:
  """The title, the setup and times, and the bits per byte."""
  e, t, tr, m = config.experiment, config.task, config.train, config.model
  summary, runs, info = results["variants"], results["runs"], results[
      "corpus"]
  variants = list(summary)
  seen = tr.num_steps * t.batch_size * t.seq_len
  reused = results["train_time_s"] < 5 * len(runs)
  lines = [
      "# Heads on real text: byte-level models of Python code",
      "",
      f"Command: {report_lib.command('experiments.text_heads')} "
      "(config `configs/text.py`). Corpus "
      f"`{info['corpus']}` ({info['describe']}): {info['train_files']} "
      f"training files ({info['train_bytes'] / 1e6:.1f} MB) and "
      f"{info['held_out_files']} held-out files "
      f"({info['held_out_bytes'] / 1e6:.1f} MB), split by file with seed "
      f"{t.split_seed} (held-out share {t.held_out_fraction}). Models: "
      f"{', '.join(variants)} ('L<n>': n layers, attention only; '+MLP': "
      f"an MLP of width {m.mlp_dim or 4 * m.d_model} in every block), "
      f"d_model {m.d_model}, {m.num_heads} heads per layer, "
      f"{m.positions} positions, windows of T = {t.seq_len} bytes (ids = "
      f"byte + {tasks.NUM_SPECIAL}), {tr.num_steps} steps of "
      f"{t.batch_size} windows at learning rate {tr.learning_rate:g}: "
      f"{seen / 1e6:.2f} MB of training text per model "
      f"({100 * seen / max(info['train_bytes'], 1):.1f}% of the training "
      "files' bytes). "
      f"Seeds {list(e.seeds)}. Every number is measured on "
      f"{e.analysis_examples} windows of the held-out files, drawn afresh "
      "per seed; spreads are the sample std over seeds (ddof 1), intervals "
      "95% t intervals over seeds (of the per-seed differences where two "
      "things are compared on the same windows). Wall time of this "
      f"command: {results['wall_time_s'] / 60:.1f} min, of which training "
      f"{results['train_time_s'] / 60:.1f} min"
      + (" (runs reused)" if reused else "")
      + f"; CPU time {results['cpu_time_s'] / 60:.1f} min.",
      "",
      "## Held-out bits per byte",
      "",
      "Unigram: byte counts of the training files plus one. Bigram: counts "
      "of each byte after the previous one, with the unigram distribution "
      "as a prior of weight one. Both are scored on exactly the "
      "(previous byte, byte) pairs the models are scored on.",
      "",
      report_lib.md_table(
          ["model", "bits per byte", "unigram", "bigram",
           "model - bigram [95%]", "untrained model", "per seed"],
          [[v, _ci(x["bpb"]), f"{x['unigram']['mean']:.3f}",
            f"{x['bigram']['mean']:.3f}",
            _paired(x["bpb_minus_bigram"]),
            f"{x['init_bpb']['mean']:.3f}",
            ", ".join(f"{b:.3f}" for b in x["bpb"]["values"])]
           for v, x in summary.items()]),
      "",
  ]
  if len(variants) > 1:
    a, b = variants[0], variants[-1]
    d = stats.difference(summary[b]["bpb"]["values"],
                         summary[a]["bpb"]["values"])
    lines += [f"{b} minus {a}: {d['diff']:+.3f} bits per byte, Welch 95% "
              f"interval {report_lib.interval(d['ci95'])}.", ""]
  return lines


def _heads_lines(config, results) -> list[str]:
  """The best heads beside their floors, the taxonomy, and every head
  of the first seed's models."""
  e, t = config.experiment, config.task
  summary, runs = results["variants"], results["runs"]
  variants = list(summary)
  thr = e.thresholds
  first_seed = e.seeds[0]
  lines = [
      "## Which heads grew: the best head of each model beside its floors",
      "",
      "Each score is the mean weight a head puts on the keys it credits, "
      "over the queries that have such keys (definitions in "
      "`experiments/text_heads/heads.py`); cells are the best head of the "
      "model, "
      "mean ± std over seeds, with the same model untrained in brackets; "
      "the last column is uniform causal attention on the same windows. "
      "'repeated text' scores queries in the second copy of "
      f"{t.seq_len // 2} held-out bytes given twice.",
      "",
      report_lib.md_table(["score (best head)"] + variants + ["uniform causal"],
                      _best_rows(summary, variants)),
      "",
      "## Taxonomy",
      "",
      "A head clears a class when its class score is at least the "
      "threshold AND at least "
      f"{thr.floor_ratio:g} times the score of uniform attention: sink = "
      f"weight on the window's first byte >= {thr.sink:g}; induction = "
      f"weight on the byte after the earlier copy in repeated text >= "
      f"{thr.induction:g}; positional = weight at one fixed offset "
      f"0-{e.max_offset} >= {thr.positional:g} (offset 0 is the byte "
      "itself, 1 the previous byte); syntactic-looking = weight on the "
      "newline that began the line, on the line's indentation, on the "
      "innermost open bracket or on the byte before the current word >= "
      f"{thr.syntactic:g}. A head that clears "
      "several classes is counted once, in the first of sink, induction, "
      "positional, syntactic; 'other' clears none. Number of heads per "
      "model, mean ± std over seeds (per seed in brackets):",
      "",
      report_lib.md_table(
          ["model"] + list(heads.CLASSES) + ["heads"],
          [[v] + [f"{_ms(x[f'count_{c}'], 1)} ("
                  + ", ".join(f"{int(n)}" for n in x[f"count_{c}"]["values"])
                  + ")" for c in heads.CLASSES]
           + [str(int(sum(x[f"count_{c}"]["mean"]
                          for c in heads.CLASSES)))]
           for v, x in summary.items()]),
      "",
  ]
  for v in variants:
    r = runs[f"{v}_seed{first_seed}"]
    lines += [f"### {v}, seed {first_seed}: every head", "",
              "Ablation: the head's output set to zero; Δbpb on the held-out "
              f"windows (clean {r['ablation']['clean_bpb']:.3f}), Δrepeat "
              "bits on the second copy of the repeated text (clean "
              f"{r['ablation']['clean_repeat']:.3f}).", "",
              report_lib.md_table(HEAD_COLUMNS, _head_rows(r)), ""]
  return lines


_DETECTOR_NAMES = {
    "repeat_induction": "repeated text (the taxonomy's)",
    "span_induction": "3-byte span, plain",
    "span_induction_strict": "3-byte span, strict",
}


def _control_verdict(x) -> str:
  """'passed' when a detector fires in every seed of the trained deep
  model and in no seed at init or of the shallow model, else why not."""
  deep, shallow = x
  ok_pos = deep["seeds_firing"] == deep["seeds"]
  ok_neg = deep["seeds_firing_init"] == 0 and shallow["seeds_firing"] == 0
  if ok_pos and ok_neg:
    return "passed"
  return "FAILED (" + ", ".join(
      w for w, bad in (("did not fire in every trained seed", not ok_pos),
                       ("fired where no induction head exists", not ok_neg))
      if bad) + ")"


def _control_lines(config, results) -> list[str]:
  """The detectors on models whose answer is known (control.py)."""
  thr = config.experiment.thresholds
  ctl = results["control"]
  cc, s = ctl["config"], ctl["summary"]
  deep, shallow = (f"L{d}" for d in cc["layers"])
  rows = []
  for k in control_lib.DETECTORS:
    for label, depth, which, must in (
        (f"{deep} trained", deep, "trained", "fire"),
        (f"{deep} at init", deep, "init", "stay silent"),
        (f"{shallow} trained", shallow, "trained", "stay silent")):
      x = s[depth][k]
      fired = x["seeds_firing" if which == "trained" else "seeds_firing_init"]
      rows.append([_DETECTOR_NAMES[k], label, must,
                   f"{_ms(x[which], 2)} ("
                   + ", ".join(f"{v:.2f}" for v in x[which]["values"]) + ")",
                   f"{x['uniform']['mean']:.3f}",
                   f"{fired} of {x['seeds']}"])
  verdicts = "; ".join(
      f"{_DETECTOR_NAMES[k]} {_control_verdict((s[deep][k], s[shallow][k]))}"
      for k in control_lib.DETECTORS)
  layers = sorted({l for l in s[deep]["repeat_induction"]["best_layer"]})
  return [
      "## Controls: the induction detectors on models whose answer is known",
      "",
      "Experiment 1's models (`configs/induction.py`: attention-only, "
      f"{cc['steps']} steps on sequences of {cc['seq_len']} random tokens "
      "with one segment repeated; seeds "
      f"{cc['seeds']}) scored by this experiment's own code "
      "(`survey.head_scores`, `experiments/text_heads/control.py`) on "
      f"{cc['examples']} held-out sequences per seed: the span scores on "
      "the sequences as they are, the repeated-text score on their first "
      f"{cc['seq_len'] // 2} tokens given twice, as for the text models. "
      f"The trained {deep} models have induction heads (experiment 1's own "
      "induction score of their best head "
      f"{_ms(s[deep]['experiment1_induction'], 2)} "
      f"here), so a detector must fire there; at initialisation, and in "
      f"the trained {shallow} models, which have no earlier layer to tell a "
      "key what came before it, it must not. A head fires when its score "
      f"is >= {thr.induction:g} and >= {thr.floor_ratio:g} times uniform "
      "attention's on the same sequences (the taxonomy's induction rule). "
      "Cells: the best head, mean ± std over seeds (per seed).",
      "",
      report_lib.md_table(["detector", "model", "must", "best head",
                           "uniform", "seeds with a head firing"], rows),
      "",
      f"Verdict: {verdicts}. In the trained {deep} models the best "
      "repeated-text head is in layer "
      + " or ".join(str(l) for l in layers) + " (per seed: "
      + ", ".join(str(l) for l in s[deep]["repeat_induction"]["best_layer"])
      + f"; layers count from 0, and experiment 1's induction heads are in "
      "layer 1). Wall time of the controls: "
      f"{ctl['time_s'] / 60:.1f} min.",
      "",
  ]


def _strict_lines(config, results) -> list[str]:
  """The plain and the strict span score of the text models, side by side."""
  e = config.experiment
  thr = e.thresholds
  summary, runs = results["variants"], results["runs"]
  variants = list(summary)
  first = summary[variants[0]]
  rows = []
  for v in variants:
    x = summary[v]
    rows.append([
        v,
        f"{_ms(x['best_span_induction'], 2)} "
        f"({x['best_span_induction_init']['mean']:.2f})",
        _paired(x["best_span_induction_minus_init"], 2),
        f"{_ms(x['best_span_induction_strict'], 3)} "
        f"({x['best_span_induction_strict_init']['mean']:.3f})",
        _paired(x["best_span_induction_strict_minus_init"], 3),
        ", ".join(f"{d}: {w:.2f}" for d, w in zip(
            x["top_span_head_offset"], x["top_span_head_offset_weight"])),
        ", ".join(f"{a:.2f} -> {b:.3f}" for a, b in zip(
            x["top_span_head_plain"]["values"],
            x["top_span_head_strict"]["values"]))])
  return [
      "## A span score that does not credit the previous byte",
      "",
      "The plain 3-byte span score credits the key after any earlier "
      "occurrence of the query's last 3 bytes. Inside a run of 4 or more "
      "equal bytes (the spaces of indented code) the previous byte is "
      "such a key, so a previous-byte head scores there without copying "
      "anything. The strict score keeps only keys more than "
      f"{e.max_offset} positions back (no offset the positional class "
      f"tests, 0-{e.max_offset}, can score) and drops queries whose 3 "
      "bytes are one byte repeated (`heads.strict_span_induction_targets`)."
      " Best head per model, mean ± std over seeds (the same model "
      "untrained in brackets); trained minus untrained with its 95% t "
      "interval over seeds (paired: the same windows); and the head the "
      "plain score ranks first in each seed: its best fixed offset and "
      "the weight there, and its plain -> strict score. Uniform "
      f"attention: plain {first['uniform_span_induction']['mean']:.3f}, "
      f"strict {first['uniform_span_induction_strict']['mean']:.3f}.",
      "",
      report_lib.md_table(
          ["model", "plain: best head (init)", "trained - init [95%]",
           "strict: best head (init)", "trained - init [95%]",
           "plain's top head per seed, offset: weight",
           "its plain -> strict"], rows),
      "",
  ]


def _report(config, results) -> str:
  """report.md: the setup, the heads, ablations, dynamics, claims."""
  e, tr = config.experiment, config.train
  summary = results["variants"]
  variants = list(summary)
  thr = e.thresholds
  first_seed = e.seeds[0]
  lines = (_setup_lines(config, results) + _heads_lines(config, results)
           + _control_lines(config, results) + _strict_lines(config, results))
  abl_rows = []
  for v, x in summary.items():
    for cls, a in x["class_ablation"].items():
      abl_rows.append([v, cls, f"{a['heads']['mean']:.1f} in "
                       f"{a['heads']['n']} seeds",
                       _ms(a["bpb"]), _ms(a["random_bpb"]), _ms(a["repeat"]),
                       _ms(a["random_repeat"])])
  lines += [
      "## Ablation by class",
      "",
      "All heads of a class set to zero at once, beside the mean over 4 "
      "random sets of as many heads of the same model; mean ± std over the "
      "seeds whose model has the class.",
      "",
      report_lib.md_table(["model", "class", "heads", "Δ held-out bpb",
                       "Δ bpb, random heads", "Δ repeat bits",
                       "Δ repeat bits, random heads"], abl_rows),
      "",
      "## In-context learning over training",
      "",
      "ICL score (Olsson et al.): mean bits per byte at positions "
      f"{e.late_positions[0]}-{e.late_positions[1] - 1} minus positions "
      f"{e.early_positions[0]}-{e.early_positions[1] - 1} of the held-out "
      "windows (negative: later bytes, with more context, are predicted "
      "better). Repeat gain: bits per byte on the first copy of the "
      "repeated text minus the second (what reading the earlier copy "
      "saves). Both at every checkpoint (every "
      f"{tr.checkpoint_every} steps) and at initialisation. 'Half-way': "
      "the first checkpoint by which the curve has covered half of its "
      f"change; induction formed: the first checkpoint with a head >= "
      f"{thr.induction:g} on repeated text. The bigram model's own late "
      "minus early difference on the same windows (it reads one byte of "
      "context at every position) is what the text differs by between "
      "the two ranges: the floor of the ICL score.",
      "",
      report_lib.md_table(
          ["model", "ICL score [95%]", "at init", "bigram model",
           "ICL minus bigram [95%]", "repeat gain (bits)",
           "at init", "ICL half-way step", "induction formed at",
           "corr(ICL, best induction) over checkpoints"],
          [[v, _ci(x["icl"]), _ms(x["icl_init"]), _ms(x["icl_bigram"]),
            _ci(x["icl_minus_bigram"]), _ms(x["repeat_gain"]),
            _ms(x["repeat_gain_init"]), _ms(x["icl_half_step"], 0),
            _steps(x["induction_first_step"]),
            "-" if x["corr_icl_induction"] is None
            else _ms(x["corr_icl_induction"], 2)]
           for v, x in summary.items()]),
      "",
      "## Figures",
      "",
      f"Every head of {variants[-1]} (seed {first_seed}) on a held-out "
      "snippet of code, in a browser: [explorer.html](explorer.html).",
      "",
  ] + [f"![{f}]({f})" for f in results["figures"]] + [
      "",
      "## What this shows",
      "",
  ] + _claims(config, summary, variants, results["control"])
  return "\n".join(lines)


def _sign_words(ci, below, within, above):
  """One of three phrases by where a 95% interval lies against zero."""
  if ci is None:
    return within
  return below if ci[1] < 0 else above if ci[0] > 0 else within


def _claims(config, summary, variants, results_control):
  """The findings, worded from the numbers (no stronger than they are)."""
  e = config.experiment
  first = summary[variants[0]]
  out = []
  beats = [v for v in variants
           if (summary[v]["bpb_minus_bigram"]["ci95"] or [1, 1])[1] < 0]
  out.append(
      f"* Text: {len(beats)} of {len(variants)} models beat the bigram "
      "model on held-out files (95% interval of the paired difference "
      "below zero): "
      + "; ".join(f"{v} {_ms(summary[v]['bpb'])} against "
                  f"{summary[v]['bigram']['mean']:.3f}" for v in variants)
      + f" bits per byte (unigram {first['unigram']['mean']:.3f}).")
  if len(variants) > 1:
    a, b = variants[0], variants[-1]
    d = stats.difference(summary[b]["bpb"]["values"],
                         summary[a]["bpb"]["values"])
    out.append(f"* Size: {b} minus {a} is {d['diff']:+.3f} bits per byte "
               f"(Welch 95% interval {report_lib.interval(d['ci95'])}): "
               + _sign_words(d["ci95"], f"{b} is better.",
                             "no difference resolved at 3 seeds.",
                             f"{b} is WORSE."))
  for key, name in (("previous_token", "previous-byte"),
                    ("line_start", "line-start"),
                    ("indentation", "indentation"),
                    ("open_bracket", "open-bracket"),
                    ("word_start", "word-start"),
                    ("first_token", "first-byte (sink)")):
    cells = [f"{v} {_ms(summary[v][f'best_{key}'], 2)} (untrained "
             f"{summary[v][f'best_{key}_init']['mean']:.2f})"
             for v in variants]
    out.append(f"* Best {name} head: " + "; ".join(cells)
               + f"; uniform attention {first[f'uniform_{key}']['mean']:.3f}.")
  counts = "; ".join(
      f"{v}: " + ", ".join(
          f"{c} {summary[v][f'count_{c}']['mean']:.1f}"
          for c in heads.CLASSES) for v in variants)
  out.append(f"* Taxonomy (mean number of heads per class over seeds): "
             f"{counts}.")
  offsets = {}
  for v in variants:
    for d in summary[v]["positional_offsets"]:
      offsets[d] = offsets.get(d, 0) + 1
  if offsets:
    out.append("* The positional heads, all models and seeds, by offset: "
               + ", ".join(f"{n} at offset {d}"
                           for d, n in sorted(offsets.items())) + ".")
  for v in variants:
    for cls, a in summary[v]["class_ablation"].items():
      if cls == "other" or a["bpb"]["n"] < len(e.seeds):
        continue
      d = stats.difference(a["bpb"]["values"], a["random_bpb"]["values"])
      out.append(
          f"* Removing the {cls} heads of {v} ({a['heads']['mean']:.1f} per "
          f"model) costs {_ms(a['bpb'])} bits per byte, as many random heads "
          f"{_ms(a['random_bpb'])} (difference {d['diff']:+.3f}, Welch 95% "
          f"interval {report_lib.interval(d['ci95'])}).")
  return out + _induction_claims(config, summary, variants, results_control)


def _induction_claims(config, summary, variants, results_control):
  """Whether induction heads formed, and what the ICL score shows."""
  e = config.experiment
  thr = e.thresholds
  first = summary[variants[0]]
  seen = config.train.num_steps * config.task.batch_size * config.task.seq_len
  out = []
  formed = {v: [s for s in summary[v]["induction_first_step"]
                if s is not None] for v in variants}
  ind = "; ".join(f"{v} {_ms(summary[v]['best_repeat_induction'], 2)}"
                  for v in variants)
  gain = "; ".join(f"{v} {_ms(summary[v]['repeat_gain'])}"
                   for v in variants)
  if not any(formed.values()):
    out.append(
        "* Induction: no model grew an induction head. On held-out text "
        "given twice, the best head's weight on the byte after the earlier "
        f"copy is {ind} (threshold {thr.induction:g}; uniform attention "
        f"{first['uniform_repeat_induction']['mean']:.3f}"
        + (", so the heads look there LESS than uniform attention would"
           if all(summary[v]["best_repeat_induction"]["mean"]
                  < first["uniform_repeat_induction"]["mean"]
                  for v in variants) else "")
        + "), and the second "
        f"copy costs only {gain} bits per byte less than the first. "
        "(Olsson et al. report induction heads forming after billions of "
        f"tokens; each model here read {seen / 1e6:.2f} MB.)")
  else:
    out.append(
        f"* Induction: a head >= {thr.induction:g} on repeated text formed "
        "in " + "; ".join(f"{v} {len(formed[v])} of {len(e.seeds)} seeds"
                          for v in variants)
        + f" (best head {ind}); the second copy costs {gain} bits per "
        "byte less than the first.")
  out += _control_claims(config, summary, variants, results_control)
  icl = []
  for v in variants:
    x = summary[v]["icl_minus_bigram"]
    icl.append(f"{v} {_ci(x)}: " + _sign_words(
        x["ci95"], "later bytes predicted better than the text explains",
        "no difference resolved",
        "later bytes predicted WORSE than the text explains"))
  out.append(
      "* In-context learning: the ICL score minus the bigram model's on "
      "the same windows is " + "; ".join(icl) + "."
      + ("" if any(formed.values()) else
         " Without induction heads, this score cannot be tied to them "
         "here; the relation Olsson et al. describe is not testable at "
         "this amount of training."))
  return out


def _strict_fires(config, summary, variants) -> dict:
  """Per model, the seeds whose best strict span head clears the
  induction threshold and floor_ratio x uniform attention."""
  thr = config.experiment.thresholds
  return {v: int(np.sum(control_lib.fires(
      summary[v]["best_span_induction_strict"]["values"],
      summary[v]["uniform_span_induction_strict"]["mean"], thr)))
          for v in variants}


def _control_claims(config, summary, variants, ctl):
  """What the controls and the strict span score say about the claim."""
  thr = config.experiment.thresholds
  s = ctl["summary"]
  deep, shallow = (f"L{d}" for d in ctl["config"]["layers"])
  out = []
  for k in control_lib.DETECTORS:
    d, sh = s[deep][k], s[shallow][k]
    out.append(
        f"* Control, {_DETECTOR_NAMES[k]}: on experiment 1's trained {deep} "
        f"models the best head scores {_ms(d['trained'], 2)} and fires in "
        f"{d['seeds_firing']} of {d['seeds']} seeds; at initialisation "
        f"{_ms(d['init'], 2)} ({d['seeds_firing_init']} firing), trained "
        f"{shallow} {_ms(sh['trained'], 2)} ({sh['seeds_firing']} firing); "
        f"uniform attention {d['uniform']['mean']:.3f}, threshold "
        f"{thr.induction:g}: {_control_verdict((d, sh))}.")
  first = summary[variants[0]]
  fired = _strict_fires(config, summary, variants)
  cells = "; ".join(
      f"{v} {_ms(summary[v]['best_span_induction'], 2)} -> "
      f"{_ms(summary[v]['best_span_induction_strict'], 3)} (untrained "
      f"{summary[v]['best_span_induction_strict_init']['mean']:.3f}, trained "
      "minus untrained "
      f"{_paired(summary[v]['best_span_induction_strict_minus_init'])})"
      for v in variants)
  offsets = sorted({d for v in variants
                    for d in summary[v]["top_span_head_offset"]})
  weights = [w for v in variants
             for w in summary[v]["top_span_head_offset_weight"]]
  n_fire = sum(fired.values())
  passed = all(_control_verdict((s[deep][k], s[shallow][k])) == "passed"
               for k in ("repeat_induction", "span_induction_strict"))
  out.append(
      "* Strict span score: the best head's 3-byte span score, plain -> "
      f"strict, is {cells}; uniform attention "
      f"{first['uniform_span_induction']['mean']:.3f} -> "
      f"{first['uniform_span_induction_strict']['mean']:.3f}. The head the "
      "plain score ranks first has its best fixed offset at "
      + " or ".join(str(d) for d in offsets)
      + f" in every model and seed (weight there {min(weights):.2f} to "
      f"{max(weights):.2f}). "
      + (f"No model's best strict head clears the induction threshold "
         f"{thr.induction:g} (and {thr.floor_ratio:g} x uniform) in any "
         "seed"
         + (", and both detectors passed their controls, so the "
            "conclusion stands: no induction head, by the repeated-text "
            "score and by the strict span score."
            if passed else
            ", but a control FAILED (above), so the detectors' silence "
            "here says little.")
         if n_fire == 0 else
         f"The best strict head clears the induction threshold in "
         + ", ".join(f"{v} {n} of "
                     f"{summary[v]['best_span_induction_strict']['n']}"
                     for v, n in fired.items())
         + " seeds: the strict span score finds induction-like attention "
         "that the repeated-text score does not."))
  return out


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json in `workdir`; returns what
  results.json holds."""
  workdir = pathlib.Path(workdir)
  figures = text_figures.draw(workdir, results["runs"],
                             results["variants"], config)
  # results.json lists the figures after the runs, before the times.
  keys = list(results)
  at = keys.index("runs") + 1
  results = {k: results[k] for k in keys[:at]} | {"figures": figures} | {
      k: results[k] for k in keys[at:]}
  return report_lib.write_outputs(workdir, results, _report(config, results),
                                  drop=("weights_example",), config=config)
