"""The SAE experiment, reporting: report.md and figures from results.json.

`write` saves results.json first (so a failing figure or template never
loses a long run's numbers), draws the figures and renders the template;
`render` reads results.json alone, so a committed report regenerates.
"""

from __future__ import annotations

import json
import functools
import pathlib

from experiments.sae import figures
from experiments.sae import report_controls
from mha_jax.measure import report as report_lib
from mha_jax.sae import sae as sae_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
KIND_NAMES = report_controls.KIND_NAMES


def write(config, results, workdir, command: str | None = None) -> dict:
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  saved = report_lib.saved_results(results, config=config)
  (workdir / "results.json").write_text(json.dumps(saved, indent=1) + "\n")
  figures.write(saved, workdir)
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command),
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  return report_lib.fill(TEMPLATE, values(saved, command))


def _heads(layer, top_heads) -> str:
  """`L1H2 x3, L1H3 x1`: how many features have each head as the largest
  block of their decoder."""
  counts = {}
  for h in top_heads:
    counts[h] = counts.get(h, 0) + 1
  return ", ".join(f"{report_lib.head_name(layer, h)} x{n}"
                   for h, n in sorted(counts.items())) or "-"


def _random(rec) -> str:
  """The random sets' mean [lowest, highest draw], "-" without draws."""
  draws = rec["random"]
  if not draws:
    return "-"
  return f"{rec['random_mean']:.3f} [{min(draws):.3f}, {max(draws):.3f}]"


def _ev(rec) -> str:
  """The EV of a feature set, "-" for an empty set."""
  return _num(rec["induction_features"] if rec["count"] else None)


def _num(x) -> str:
  return "-" if x is None else f"{x:.3f}"


def _s(summ, digits=3):
  return report_lib.summary(summ, digits)


def values(saved: dict, command: str | None = None) -> dict:
  """The template's cells from results.json's contents."""
  m, d, c = saved["model"], saved["data"], saved["config"]
  s = c["sae"]
  ind_rows = []
  for r in saved["runs"]:
    ind = r["induction"]
    rec, cop = ind["reconstruction"], ind["copying_reconstruction"]
    ind_rows.append([
        KIND_NAMES[r["kind"]], str(r["seed"]), str(ind["count"]),
        _heads(m["layer"], ind["top_head"]), _ev(rec),
        _random(rec), str(ind["copying_count"]),
        _ev(cop), _random(cop),
        _num(cop["all_features"])])
  ind_heads = ", ".join(report_lib.head_name(m["layer"], h)
                        for h in saved["induction_heads"]) or "none"
  scores = ", ".join(f"{report_lib.head_name(m['layer'], h)} {v:.2f}"
                     for h, v in enumerate(saved["induction_scores"]))
  return {
      "command": report_lib.command("experiments.sae", command),
      "model": m["label"], "layer": str(m["layer"]),
      "width": str(m["width"]), "heads": str(m["heads"]),
      "d_sae": str(s["d_sae"]), "expansion": f"{s['d_sae'] / m['width']:g}",
      "l1": f"{s['l1']:g}", "k": str(s["k"]),
      "batchtopk_note": _batchtopk_note(c), "steps": str(s["num_steps"]),
      "batch": str(s["batch_size"]),
      "seeds": str(len(c["experiment"]["seeds"])),
      "train_tokens": f"{d['train_tokens']:,}",
      "eval_tokens": f"{d['eval_tokens']:,}",
      "collect": f"{d['collect_s']:.0f} s ({d['collect_tokens_per_s']:,.0f} "
                 "tokens/s)",
      "wall": f"{saved['wall_s'] / 60:.1f} min",
      "summary_table": _summary_table(saved["summary"]),
      "loss_table": _loss_table(saved["runs"], "loss"),
      "repeat_table": _loss_table(saved["runs"], "loss_repeated"),
      "resid_pre": _resid_pre(saved),
      "induction_heads": ind_heads, "induction_scores": scores,
      "repeat_len": str(c["experiment"]["repeat_len"]),
      "repeat_inputs": str(c["experiment"]["repeat_inputs"]),
      "loss_repeats": str(c["experiment"].get("loss_repeats")
                          or c["experiment"]["repeat_inputs"]),
      "induction_table": report_lib.md_table(
          ["SAE", "seed", "induction features", "their top decoder head",
           "their EV", "random sets of as many: EV (mean [min, max])",
           "copying features", "their EV", "random sets of as many: EV",
           "whole SAE: EV"],
          ind_rows),
      "criteria": _criteria(c["experiment"]),
      "sweep_tables": report_controls.sweep_tables(saved),
      "null": report_controls.null_section(saved),
      "controls": report_controls.controls_section(saved),
      "findings": _findings(saved),
      "steps_note": _steps_note(c),
      "dead_note": _dead_note(saved),
  }


def _dead_note(saved) -> str:
  """How many held-out tokens a feature at the average firing rate fires
  on: where that is small, "dead" on held-out tokens includes features
  that are only rare (16x on 4,064 tokens: about 14)."""
  s, d = saved["config"]["sae"], saved["data"]
  l0 = [r["l0"] for r in saved["runs"]]
  per = [d["eval_tokens"] * x / s["d_sae"] for x in (min(l0), max(l0))]
  return (f"At this run's L0 ({min(l0):.0f}-{max(l0):.0f} of {s['d_sae']:,} "
          f"features) a feature at the average firing rate fires on about "
          f"{per[0]:.0f}-{per[1]:.0f} of the {d['eval_tokens']:,} held-out "
          "tokens, so a rare feature can count as dead here; training "
          f"resamples only features silent for {s['dead_steps']} steps of "
          f"{s['batch_size']} tokens.")


def _summary_table(summary) -> str:
  rows = [[KIND_NAMES[kind], _s(x["l0"], 1), _s(x["dead"]), _s(x["dense"]),
           _s(x["explained_variance"]), _s(x["recovered_zero"]),
           _s(x["recovered_mean"]), _s(x["repeated_recovered_zero"]),
           _s(x["repeated_recovered_mean"]), _s(x["steps_per_s"], 2)]
          for kind, x in summary.items()]
  return report_lib.md_table(
      ["SAE", "L0", "dead", "dense", "explained var.", "loss rec. (zero)",
       "loss rec. (mean)", "on repeats (zero)", "on repeats (mean)",
       "steps/s"], rows)


def _loss_table(runs, which: str) -> str:
  """Per run, the CE of each mode and loss recovered, from `run[which]`."""
  rows = []
  for r in runs:
    lo = r[which]
    rows.append([KIND_NAMES[r["kind"]], str(r["seed"]),
                 f"{lo['clean']:.3f}", f"{lo['splice']:.3f}",
                 f"{_rise(lo):+.1f}%",
                 f"{lo['zero']:.3f}", f"{lo['mean']:.3f}",
                 _num(lo.get("kl_splice")), _num(lo.get("kl_zero")),
                 f"{lo['recovered_zero']:.3f}",
                 f"{lo['recovered_mean']:.3f}", f"{r['l0']:.1f}",
                 f"{r['explained_variance']:.3f}"])
  return report_lib.md_table(
      ["SAE", "seed", "CE clean", "CE splice", "splice vs clean",
       "CE zero", "CE mean", "KL splice", "KL zero", "rec. (zero)",
       "rec. (mean)", "L0", "expl. var."], rows)


def _resid_pre(saved) -> str:
  """The resid_pre section's body: what ran, the summary and per-run
  tables, or why there is none."""
  r = saved.get("resid_pre")
  m = saved["model"]
  if not r:
    return ("None trained in this run (`experiment.resid_pre_kinds` is "
            "empty); the induction model's run has them.")
  d = r["data"]
  seeds = sorted({x["seed"] for x in r["runs"]})
  which = ("" if seeds == sorted({x["seed"] for x in saved["runs"]}) else
           f" (seed {', '.join(map(str, seeds))} only)")
  return (f"The same SAE settings{which} on `blocks.{m['layer']}.resid_pre`, the "
          f"residual stream entering layer {m['layer']} "
          f"({d['train_tokens']:,} training tokens, collected in "
          f"{d['collect_s']:.0f} s), each with its own scale; the splice "
          "and ablations replace the stream at that site, so they reach "
          "the layer's attention and everything after it. Head "
          "attribution and induction features are z's alone and are not "
          "measured here.\n\n" + _summary_table(r["summary"]) +
          "\n\nPer run, on held-out inputs:\n\n" +
          _loss_table(r["runs"], "loss") +
          "\n\nPer run, on repeats:\n\n" +
          _loss_table(r["runs"], "loss_repeated"))


def _steps_note(c) -> str:
  s, kinds = c["sae"], c["experiment"]["kinds"]
  topks = [KIND_NAMES[k] for k in sae_lib.TOPK_KINDS if k in kinds]
  if topks and s.get("topk_steps"):
    whose = "its" if topks == ["TopK"] else "TopK's"
    return (f" ({' and '.join(topks)}: {s['topk_steps']} steps; {whose} "
            "training loss was flat by then)")
  return ""


def _batchtopk_note(c) -> str:
  """The BatchTopK sentence of "What was measured", where it ran."""
  if "batchtopk" not in c["experiment"]["kinds"]:
    return ""
  s = c["sae"]
  return (f"; BatchTopK keeps the {s['k']} x {s['batch_size']} largest "
          "activations of each training batch, so a token's count varies "
          "while the batch averages k, and encodes one token at a time by "
          "its threshold, the moving average (weight "
          f"{s['threshold_lr']:g}) of the smallest activation each batch "
          "kept: the L0 below is that encoder's")


def _per_run(saved, kind, fn):
  return [fn(r) for r in saved["runs"] if r["kind"] == kind]


def _findings(saved) -> str:
  """The conclusions, worded from the numbers (no stronger than they)."""
  summ, m = saved["summary"], saved["model"]
  out = []
  for kind, x in summ.items():
    gap = [r["loss"]["zero"] - r["loss"]["clean"] for r in saved["runs"]
           if r["kind"] == kind]
    rgap = [r["loss_repeated"]["zero"] - r["loss_repeated"]["clean"]
            for r in saved["runs"] if r["kind"] == kind]
    out.append(
        f"- {KIND_NAMES[kind]}: L0 {_s(x['l0'], 1)} active features per "
        f"token explain {_s(x['explained_variance'])} of the variance of "
        f"held-out z; spliced into the model they recover "
        f"{_s(x['recovered_zero'])} of the loss that zeroing layer "
        f"{m['layer']}'s z costs ({_s(x['recovered_mean'])} against mean "
        f"ablation). Zeroing costs {_list(gap, 3)} nats per seed, the "
        "denominator of that ratio" + (
            ": too small a cost for the ratio to say much (a value above 1 "
            "means the splice cost less than nothing, within noise)."
            if min(gap) < 0.1 else ".") +
        f" In raw terms the splice takes the loss from "
        f"{_list(_per_run(saved, kind, lambda r: r['loss']['clean']), 3)} "
        f"to {_list(_per_run(saved, kind, lambda r: r['loss']['splice']), 3)}"
        f" nats ({_list(_per_run(saved, kind, lambda r: _rise(r['loss'])), 1)}% per seed)"
        + _kl(saved, kind, "loss") + "."
        f" On the repeats' second copy zeroing costs {_list(rgap, 3)} nats "
        f"and the splice recovers {_s(x['repeated_recovered_zero'])} of it "
        f"({_s(x['repeated_recovered_mean'])} against mean ablation); the "
        f"splice's loss there is "
        f"{_list(_per_run(saved, kind, lambda r: r['loss_repeated']['splice']), 3)}"
        f" against {saved['runs'][0]['loss_repeated']['clean']:.3f} clean"
        + _kl(saved, kind, "loss_repeated") + ".")
  if saved["topk_minus_relu"]:
    d = saved["topk_minus_relu"]["explained_variance"]
    dr = saved["topk_minus_relu"]["repeated_recovered_zero"]
    out.append(f"- TopK minus ReLU, explained variance: "
               f"{report_lib.difference(d)}; loss recovered on the repeats "
               f"(zero ablation): {report_lib.difference(dr)} (Welch "
               "intervals over seeds; the two differ in L0 too, so this "
               "compares two points of the sparsity-fidelity trade-off, not "
               "two methods at one sparsity).")
  for kind in summ:
    counts = _per_run(saved, kind, lambda r: r["induction"]["count"])
    cop = _per_run(saved, kind, lambda r: r["induction"]["copying_count"])
    recs = _per_run(saved, kind, lambda r: r["induction"][
        "copying_reconstruction"])
    line = (f"- {KIND_NAMES[kind]}: {_list(counts)} induction feature(s) "
            f"per seed by all four criteria, {_list(cop)} copying "
            "feature(s) (all but the second-copy criterion).")
    strict = _per_run(saved, kind, lambda r: r["induction"][
        "reconstruction"])
    for name, rs in (("induction", strict), ("copying", recs)):
      evs = [r["induction_features"] for r in rs
             if r["induction_features"] is not None and r["count"]]
      rnd = [r["random_mean"] for r in rs if r["random"]]
      whole = [r["all_features"] for r in rs if r["all_features"] is not None
               and r["count"]]
      if evs and rnd:
        worse = max(rnd) < 0
        line += (f" The {name} features alone explain {_list(evs, 3)} of "
                 "the variance of the induction heads' z on the second "
                 f"copy (the whole SAE {_list(whole, 3)}; random sets of as "
                 f"many live features {_list(rnd, 3)}, mean over draws"
                 + (": a random set's directions alone are worse than the "
                    "mean" if worse else "") + ").")
    out.append(line)
  out += report_controls.controls_findings(saved)
  out += report_controls.null_findings(saved)
  return "\n".join(out)


def _rise(lo) -> float:
  """The splice's loss over the clean loss, minus 1, in percent (`lo`: a
  run's "loss" or "loss_repeated")."""
  return 100 * (lo["splice"] / lo["clean"] - 1)


def _kl(saved, kind, which) -> str:
  """`, KL(clean || splice) ... nats per token (zero ablation ...)`, or
  nothing for a run written before the KL was measured."""
  runs = [r[which] for r in saved["runs"] if r["kind"] == kind]
  if "kl_splice" not in runs[0]:
    return ""
  return (f", KL(clean || splice) {_list([r['kl_splice'] for r in runs], 3)}"
          f" nats per token (zero ablation {runs[0]['kl_zero']:.3f})")


def _list(values, digits=0) -> str:
  return ", ".join(f"{v:.{digits}f}" for v in values)



def _criteria(e) -> str:
  return (f"fires on at least {e['second_rate']:.0%} of second-copy tokens "
          f"with a mean activation there at least {e['second_ratio']:g}x "
          f"its mean on the first copy; over the second-copy tokens where "
          f"it fires, at least {e['head_share']:.0%} of its DFA comes from "
          f"the induction heads and at least {e['source_share']:.0%} from "
          "the token after the earlier copy")
