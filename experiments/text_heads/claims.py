"""Heads on real text, the findings: the values of "What this shows".

`values` gives the template's values for the claims, from results.json
alone (their prose is in report.md.tmpl); a wording that depends on a
number (resolved or not, passed or FAILED) is chosen here.
"""

from __future__ import annotations

import numpy as np

from experiments.text_heads import control as control_lib
from experiments.text_heads import heads
from experiments.text_heads import tables
from mha_jax.measure import report as report_lib

# The best heads the claims name: (score, the claims' name for it).
CLAIMED = (("previous_token", "previous-byte"), ("line_start", "line-start"),
           ("indentation", "indentation"), ("open_bracket", "open-bracket"),
           ("word_start", "word-start"), ("first_token", "first-byte (sink)"))


def _sign_words(ci, below, within, above) -> str:
  """One of three phrases by where a 95% interval lies against zero."""
  if ci is None:
    return within
  return below if ci[1] < 0 else above if ci[0] > 0 else within


def control_verdict(deep, shallow) -> str:
  """'passed' when a detector fires in every seed of the trained deep
  model and in no seed at init or of the shallow model, else why not."""
  ok_pos = deep["seeds_firing"] == deep["seeds"]
  ok_neg = deep["seeds_firing_init"] == 0 and shallow["seeds_firing"] == 0
  if ok_pos and ok_neg:
    return "passed"
  return "FAILED (" + ", ".join(
      w for w, bad in (("did not fire in every trained seed", not ok_pos),
                       ("fired where no induction head exists", not ok_neg))
      if bad) + ")"


def size(d, names, num_seeds) -> tuple[str, str]:
  """The last model minus the first: the setup's sentence and the
  claim."""
  if d is None:
    return ("One model: no comparison between sizes.",
            "one model, so no comparison between sizes.")
  a, b = names[0], names[-1]
  diff, ci = f"{d['diff']:+.3f}", report_lib.interval(d["ci95"])
  return (f"{b} minus {a}: {diff} bits per byte, Welch 95% interval {ci}.",
          f"{b} minus {a} is {diff} bits per byte (Welch 95% interval "
          f"{ci}): "
          + _sign_words(d["ci95"], f"{b} is better.",
                        f"no difference resolved at {num_seeds} seeds.",
                        f"{b} is WORSE."))


def _positional_offsets(summary) -> str:
  """How many positional heads sit at each offset, over every run."""
  offsets = {}
  for x in summary.values():
    for d in x["positional_offsets"]:
      offsets[d] = offsets.get(d, 0) + 1
  if not offsets:
    return "No head is positional in any model or seed."
  return ("The positional heads, all models and seeds, by offset: "
          + ", ".join(f"{n} at offset {d}"
                      for d, n in sorted(offsets.items())) + ".")


def _class_ablation_claims(summary, welch, num_seeds) -> str:
  """Each class but 'other' that every seed of a model has, ablated
  against as many random heads."""
  claims = [
      f"* Removing the {cls} heads of {v} ({a['heads']['mean']:.1f} per "
      f"model) costs {tables.ms(a['bpb'])} bits per byte, as many random heads "
      f"{tables.ms(a['random_bpb'])} (difference {d['diff']:+.3f}, Welch 95% "
      f"interval {report_lib.interval(d['ci95'])})."
      for v, x in summary.items()
      for cls, a in x["class_ablation"].items()
      if cls != "other" and a["bpb"]["n"] >= num_seeds
      for d in [welch[v][cls]]]
  return "\n".join(claims) or (
      "* No class but 'other' is present in every seed of a model: no "
      "class ablation is set against random heads.")


def _induction(summary, thr, num_seeds, seen) -> str:
  """Whether an induction head formed, and the repeat gain."""
  first = summary[next(iter(summary))]
  formed = [step for x in summary.values()
            for step in x["induction_first_step"] if step is not None]
  ind = "; ".join(f"{v} {tables.ms(x['best_repeat_induction'], 2)}"
                  for v, x in summary.items())
  gain = "; ".join(f"{v} {tables.ms(x['repeat_gain'])}"
                   for v, x in summary.items())
  if formed:
    return (f"a head >= {thr['induction']:g} on repeated text formed in "
            + "; ".join(
                f"{v} {sum(s is not None for s in x['induction_first_step'])}"
                f" of {num_seeds} seeds" for v, x in summary.items())
            + f" (best head {ind}); the second copy costs {gain} bits per "
            "byte less than the first.")
  uniform = first["uniform_repeat_induction"]["mean"]
  below = all(x["best_repeat_induction"]["mean"] < uniform
              for x in summary.values())
  return ("no model grew an induction head. On held-out text given twice, "
          "the best head's weight on the byte after the earlier copy is "
          f"{ind} (threshold {thr['induction']:g}; uniform attention "
          f"{uniform:.3f}"
          + (", so the heads look there LESS than uniform attention would"
             if below else "")
          + f"), and the second copy costs only {gain} bits per byte less "
          "than the first. (Olsson et al. report induction heads forming "
          f"after billions of tokens; each model here read {seen / 1e6:.2f} "
          "MB.)")


def _icl_cells(summary) -> str:
  """The ICL score minus the bigram model's, per model, in words."""
  return "; ".join(
      f"{v} {tables.ci(x['icl_minus_bigram'])}: " + _sign_words(
          x["icl_minus_bigram"]["ci95"],
          "later bytes predicted better than the text explains",
          "no difference resolved",
          "later bytes predicted WORSE than the text explains")
      for v, x in summary.items())


def _control_claims(s, deep, shallow, thr) -> str:
  """One claim per detector: how it did on the control models."""
  ms = tables.ms
  return "\n".join(
      f"* Control, {tables.DETECTOR_NAMES[k]}: on experiment 1's trained "
      f"{deep} models the best head scores {ms(d['trained'], 2)} and fires "
      f"in {d['seeds_firing']} of {d['seeds']} seeds; at initialisation "
      f"{ms(d['init'], 2)} ({d['seeds_firing_init']} firing), trained "
      f"{shallow} {ms(sh['trained'], 2)} ({sh['seeds_firing']} firing); "
      f"uniform attention {d['uniform']['mean']:.3f}, threshold "
      f"{thr['induction']:g}: {control_verdict(d, sh)}."
      for k in control_lib.DETECTORS
      for d, sh in [(s[deep][k], s[shallow][k])])


def _strict_verdict(summary, thr, passed) -> str:
  """Whether any best strict head clears the induction threshold, and
  what that says with the controls' verdicts."""
  fired = {v: int(np.sum(control_lib.fires(
      x["best_span_induction_strict"]["values"],
      x["uniform_span_induction_strict"]["mean"], thr)))
           for v, x in summary.items()}
  if any(fired.values()):
    return ("The best strict head clears the induction threshold in "
            + ", ".join(f"{v} {n} of "
                        f"{summary[v]['best_span_induction_strict']['n']}"
                        for v, n in fired.items())
            + " seeds: the strict span score finds induction-like attention "
            "that the repeated-text score does not.")
  return (f"No model's best strict head clears the induction threshold "
          f"{thr['induction']:g} (and {thr['floor_ratio']:g} x uniform) in "
          "any seed"
          + (", and both detectors passed their controls, so the "
             "conclusion stands: no induction head, by the repeated-text "
             "score and by the strict span score." if passed else
             ", but a control FAILED (above), so the detectors' silence "
             "here says little."))


def values(saved) -> dict:
  """The values of "What this shows" that the other sections lack, and
  the size comparison that also closes the bits-per-byte section."""
  summary, config = saved["variants"], saved["config"]
  e, t = config["experiment"], config["task"]
  first = summary[next(iter(summary))]
  seen = config["train"]["num_steps"] * t["batch_size"] * t["seq_len"]
  weights = [w for x in summary.values()
             for w in x["top_span_head_offset_weight"]]
  s, layers = saved["control"]["summary"], saved["control"]["config"]["layers"]
  deep, shallow = (f"L{d}" for d in layers)
  passed = all(control_verdict(s[deep][k], s[shallow][k]) == "passed"
               for k in ("repeat_induction", "span_induction_strict"))
  setup_size, size_claim = size(saved["welch"]["bpb_last_minus_first"],
                                list(summary), len(e["seeds"]))
  return {
      "size": setup_size,
      "size_claim": size_claim,
      "beats_bigram": sum((x["bpb_minus_bigram"]["ci95"] or [1, 1])[1] < 0
                          for x in summary.values()),
      "num_models": len(summary),
      "bpb_against_bigram": "; ".join(
          f"{v} {tables.ms(x['bpb'])} against {x['bigram']['mean']:.3f}"
          for v, x in summary.items()),
      "unigram": f"{first['unigram']['mean']:.3f}",
      **{f"best_{key}": "; ".join(
          f"{v} {tables.ms(x[f'best_{key}'], 2)} (untrained "
          f"{x[f'best_{key}_init']['mean']:.2f})"
          for v, x in summary.items()) for key, _ in CLAIMED},
      **{f"uniform_{key}": f"{first[f'uniform_{key}']['mean']:.3f}"
         for key, _ in CLAIMED},
      "class_counts": "; ".join(
          f"{v}: " + ", ".join(f"{c} {x[f'count_{c}']['mean']:.1f}"
                               for c in heads.CLASSES)
          for v, x in summary.items()),
      "positional_offsets": _positional_offsets(summary),
      "class_ablation_claims": _class_ablation_claims(
          summary, saved["welch"]["class_ablation_minus_random"],
          len(e["seeds"])),
      "induction_claim": _induction(summary, e["thresholds"],
                                    len(e["seeds"]), seen),
      "control_claims": _control_claims(s, deep, shallow, e["thresholds"]),
      "strict_cells": "; ".join(
          f"{v} {tables.ms(x['best_span_induction'], 2)} -> "
          f"{tables.ms(x['best_span_induction_strict'], 3)} (untrained "
          f"{x['best_span_induction_strict_init']['mean']:.3f}, trained "
          "minus untrained "
          f"{tables.paired(x['best_span_induction_strict_minus_init'])})"
          for v, x in summary.items()),
      "top_offsets": " or ".join(str(d) for d in sorted(
          {d for x in summary.values() for d in x["top_span_head_offset"]})),
      "top_weight_min": f"{min(weights):.2f}",
      "top_weight_max": f"{max(weights):.2f}",
      "strict_verdict": _strict_verdict(summary, e["thresholds"], passed),
      "icl_cells": _icl_cells(summary),
      "icl_untested": (
          "" if any(step is not None for x in summary.values()
                    for step in x["induction_first_step"]) else
          " Without induction heads, this score cannot be tied to them "
          "here; the relation Olsson et al. describe is not testable at "
          "this amount of training."),
  }
