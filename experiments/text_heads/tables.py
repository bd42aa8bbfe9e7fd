"""Heads on real text, the tables: every Markdown table of the report.

Each function reads results.json's contents (a variant's summary, a run,
the controls) and returns one table, or the cells they share: a summary
as `mean ± std`, with its interval, or as a paired difference. Shape
letters: L layers, H heads.
"""

from __future__ import annotations

import numpy as np

from experiments.text_heads import control as control_lib
from experiments.text_heads import heads
from experiments.text_heads import run as run_lib
from mha_jax.measure import report as report_lib

HEAD_COLUMNS = ["head", "class", "first byte", "repeat induction",
                "best offset: weight", "line start", "indentation",
                "open bracket", "word start", "3-byte induction",
                "strict 3-byte induction", "rare byte",
                "entropy (nats)", "ablation Δbpb", "ablation Δrepeat bits"]
# Per-head scores of the every-head tables, after the offset column.
HEAD_SCORES = ("line_start", "indentation", "open_bracket", "word_start",
               "span_induction", "span_induction_strict", "rare_byte",
               "entropy")
DETECTOR_NAMES = {
    "repeat_induction": "repeated text (the taxonomy's)",
    "span_induction": "3-byte span, plain",
    "span_induction_strict": "3-byte span, strict",
}


def ms(x, digits=3) -> str:
  """A summary's `mean ± std`."""
  return report_lib.fmt(x["mean"], x["std"], digits)


def ci(x, digits=3) -> str:
  """A summary's `mean ± std [95% interval]`."""
  return f"{ms(x, digits)} {report_lib.interval(x['ci95'], digits)}"


def paired(x, digits=3) -> str:
  """A summary of per-seed differences as `+mean [lo, hi]`."""
  return report_lib.difference({"diff": x["mean"], "ci95": x["ci95"]},
                               digits, interval_spec=f".{digits}f",
                               missing="n/a")


def steps(values) -> str:
  """Per-seed landmark steps, "never" where there is none."""
  return ", ".join("never" if v is None else str(v) for v in values)


def bpb_table(summary) -> str:
  """Held-out bits per byte of every model beside the n-gram models."""
  return report_lib.md_table(
      ["model", "bits per byte", "unigram", "bigram",
       "model - bigram [95%]", "untrained model", "per seed"],
      [[v, ci(x["bpb"]), f"{x['unigram']['mean']:.3f}",
        f"{x['bigram']['mean']:.3f}", paired(x["bpb_minus_bigram"]),
        f"{x['init_bpb']['mean']:.3f}",
        ", ".join(f"{b:.3f}" for b in x["bpb"]["values"])]
       for v, x in summary.items()])


def best_table(summary) -> str:
  """The best head of each score and model, beside its floors."""
  first = summary[next(iter(summary))]
  rows = [[f"{key} ({what})"]
          + [f"{ms(x[f'best_{key}'], 2)} (init "
             f"{x[f'best_{key}_init']['mean']:.2f})"
             for x in summary.values()]
          + [f"{first[f'uniform_{key}']['mean']:.3f}"]
          for key, what in run_lib.BEST]
  return report_lib.md_table(
      ["score (best head)"] + list(summary) + ["uniform causal"], rows)


def taxonomy_table(summary) -> str:
  """Heads per class and model, over seeds and per seed."""
  rows = [[v] + [f"{ms(x[f'count_{c}'], 1)} ("
                 + ", ".join(f"{int(n)}" for n in x[f"count_{c}"]["values"])
                 + ")" for c in heads.CLASSES]
          + [str(int(sum(x[f"count_{c}"]["mean"] for c in heads.CLASSES)))]
          for v, x in summary.items()]
  return report_lib.md_table(["model"] + list(heads.CLASSES) + ["heads"],
                             rows)


def _head_rows(r) -> list[list]:
  """Every head of one run, then uniform causal attention."""
  s, abl, lab = r["scores"], r["ablation"], np.asarray(r["taxonomy"]["label"])
  s = {k: np.asarray(v) for k, v in s.items()}
  rows = [[report_lib.head_name(l, h), lab[l, h],
           f"{s['first_token'][l, h]:.2f}",
           f"{s['repeat_induction'][l, h]:.2f}",
           f"{int(s['fixed_offset'][l, h])}: "
           f"{s['fixed_offset_weight'][l, h]:.2f}"]
          + [f"{s[k][l, h]:.2f}" for k in HEAD_SCORES]
          + [f"{abl['bpb'][l][h]:+.3f}", f"{abl['repeat'][l][h]:+.3f}"]
          for l in range(lab.shape[0]) for h in range(lab.shape[1])]
  u = r["floors"]["uniform"]
  rows.append(["uniform causal", "-", f"{u['first_token']:.2f}",
               f"{u['repeat_induction']:.2f}",
               f"{np.max(u['offset_profile']):.2f}"]
              + [f"{u[k]:.2f}" for k in HEAD_SCORES] + ["-", "-"])
  return rows


def every_head(saved, seed) -> str:
  """For each model, every head of its first seed's run."""
  blocks = []
  for v in saved["variants"]:
    r = saved["runs"][f"{v}_seed{seed}"]
    blocks.append(
        f"### {v}, seed {seed}: every head\n\nAblation: the head's output "
        "set to zero; Δbpb on the held-out windows (clean "
        f"{r['ablation']['clean_bpb']:.3f}), Δrepeat bits on the second "
        "copy of the repeated text (clean "
        f"{r['ablation']['clean_repeat']:.3f}).\n\n"
        + report_lib.md_table(HEAD_COLUMNS, _head_rows(r)))
  return "\n\n".join(blocks)


def control_table(s, deep, shallow) -> str:
  """Each detector's best head on the control models, and where it fired."""
  rows = []
  for k in control_lib.DETECTORS:
    for label, depth, which, must in (
        (f"{deep} trained", deep, "trained", "fire"),
        (f"{deep} at init", deep, "init", "stay silent"),
        (f"{shallow} trained", shallow, "trained", "stay silent")):
      x = s[depth][k]
      fired = x["seeds_firing" if which == "trained" else "seeds_firing_init"]
      rows.append([DETECTOR_NAMES[k], label, must,
                   f"{ms(x[which], 2)} ("
                   + ", ".join(f"{v:.2f}" for v in x[which]["values"]) + ")",
                   f"{x['uniform']['mean']:.3f}", f"{fired} of {x['seeds']}"])
  return report_lib.md_table(["detector", "model", "must", "best head",
                              "uniform", "seeds with a head firing"], rows)


def strict_table(summary) -> str:
  """The plain and the strict span score of the text models."""
  rows = [[v,
           f"{ms(x['best_span_induction'], 2)} "
           f"({x['best_span_induction_init']['mean']:.2f})",
           paired(x["best_span_induction_minus_init"], 2),
           f"{ms(x['best_span_induction_strict'], 3)} "
           f"({x['best_span_induction_strict_init']['mean']:.3f})",
           paired(x["best_span_induction_strict_minus_init"], 3),
           ", ".join(f"{d}: {w:.2f}" for d, w in zip(
               x["top_span_head_offset"], x["top_span_head_offset_weight"])),
           ", ".join(f"{a:.2f} -> {b:.3f}" for a, b in zip(
               x["top_span_head_plain"]["values"],
               x["top_span_head_strict"]["values"]))]
          for v, x in summary.items()]
  return report_lib.md_table(
      ["model", "plain: best head (init)", "trained - init [95%]",
       "strict: best head (init)", "trained - init [95%]",
       "plain's top head per seed, offset: weight", "its plain -> strict"],
      rows)


def class_ablation_table(summary) -> str:
  """Each class ablated beside as many random heads, per model."""
  rows = [[v, cls, f"{a['heads']['mean']:.1f} in {a['heads']['n']} seeds",
           ms(a["bpb"]), ms(a["random_bpb"]), ms(a["repeat"]),
           ms(a["random_repeat"])]
          for v, x in summary.items()
          for cls, a in x["class_ablation"].items()]
  return report_lib.md_table(
      ["model", "class", "heads", "Δ held-out bpb", "Δ bpb, random heads",
       "Δ repeat bits", "Δ repeat bits, random heads"], rows)


def icl_table(summary) -> str:
  """The ICL score and the repeat gain, and when they moved."""
  return report_lib.md_table(
      ["model", "ICL score [95%]", "at init", "bigram model",
       "ICL minus bigram [95%]", "repeat gain (bits)", "at init",
       "ICL half-way step", "induction formed at",
       "corr(ICL, best induction) over checkpoints"],
      [[v, ci(x["icl"]), ms(x["icl_init"]), ms(x["icl_bigram"]),
        ci(x["icl_minus_bigram"]), ms(x["repeat_gain"]),
        ms(x["repeat_gain_init"]), ms(x["icl_half_step"], 0),
        steps(x["induction_first_step"]),
        "-" if x["corr_icl_induction"] is None
        else ms(x["corr_icl_induction"], 2)]
       for v, x in summary.items()])
