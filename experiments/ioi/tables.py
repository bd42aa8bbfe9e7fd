"""The IOI report's values: tables and the wording that depends on the
numbers, each from results.json's contents (`saved`) alone."""

from __future__ import annotations

import pathlib

import numpy as np

from experiments.ioi import figures
from experiments.ioi_task import prompts
from mha_jax.measure import report as report_lib

TOP = 5  # heads listed per role and per path round
LABELS = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma 3 270M",
          "tiny_llama": "tiny random Llama", "tiny_gemma3":
          "tiny random Gemma 3"}


def _ci(mean, ci, digits=2) -> str:
  return f"{mean:+.{digits}f} {report_lib.interval(ci, spec=f'+.{digits}f')}"


def _summ(s, digits=2) -> str:
  return _ci(s["mean"], s["ci95"], digits)


def _share(s) -> str:
  return (f"{report_lib.percent(s['mean'])} "
          f"[{report_lib.percent(s['ci95'][0])}, "
          f"{report_lib.percent(s['ci95'][1])}]")


def _head(h) -> str:
  return report_lib.head_name(h[0], h[1])


def _heads(hs) -> str:
  return ", ".join(_head(h) for h in hs) if hs else "none"


def task_table(models: dict) -> str:
  rows = []
  for name, m in models.items():
    t = m["task"]
    rows.append([LABELS.get(name, name), m["num_prompts"], len(m["names"]),
                 _summ(t["clean"]), _share(t["clean"]["positive"]),
                 report_lib.percent(t["clean"]["top1"]), _summ(t["abc"]),
                 _summ(t["uniform"]), _summ(t["shuffled"]),
                 _summ(t["clean_minus_abc"])])
  return report_lib.md_table(
      ["model", "prompts", "names", "logit diff. (clean)", "IO > S",
       "IO top-1", "ABC", "uniform attention", "shuffled weights",
       "clean - ABC"], rows)


def order_table(models: dict) -> str:
  rows = [[LABELS.get(n, n)] + [f"{m['task']['by_order'][o]:+.2f}"
                                for o in prompts.ORDERS]
          + [f"{min(m['task']['by_template']):+.2f} to "
             f"{max(m['task']['by_template']):+.2f}"]
          for n, m in models.items()]
  return report_lib.md_table(["model", "ABBA", "BABA",
                              "template means (lowest to highest)"], rows)


def verdict(name: str, m: dict, min_positive: float) -> str:
  t = m["task"]
  label = LABELS.get(name, name)
  mean, (lo, hi) = t["clean"]["mean"], t["clean"]["ci95"]
  share = report_lib.percent(t["clean"]["positive"]["mean"])
  if m["does_task"]:
    return (f"{label} does the task: mean logit difference {mean:+.2f} "
            f"(interval {lo:+.2f} to {hi:+.2f}), IO above S in {share} of "
            f"prompts (threshold {report_lib.percent(min_positive, 0)}).")
  if lo > 0:
    return (f"{label} leans to IO but weakly: mean {mean:+.2f} (interval "
            f"{lo:+.2f} to {hi:+.2f}), IO above S in only {share} of "
            f"prompts, under the {report_lib.percent(min_positive, 0)} "
            "this report asks before analysing a circuit.")
  return (f"{label} does not do the task: mean {mean:+.2f} (interval "
          f"{lo:+.2f} to {hi:+.2f}), IO above S in {share} of prompts.")


def _top(frac, ci, k=TOP, labels=None):
  """The k entries of `frac` largest in absolute value, with intervals."""
  frac, ci = np.asarray(frac), np.asarray(ci)
  order = np.argsort(-np.abs(frac.reshape(-1)))[:k]
  flat_ci = ci.reshape(-1, 2)
  return [(labels[i] if labels else i, float(frac.reshape(-1)[i]),
           flat_ci[i]) for i in order]


def role_table(c: dict) -> str:
  act = c["activation"]
  frac, ci = np.asarray(act["fraction"]), np.asarray(act["ci95"])
  n_h = frac.shape[1]
  labels = [report_lib.head_name(i // n_h, i % n_h)
            for i in range(frac.shape[0] * n_h)]
  rows = []
  for r, role in enumerate(act["roles"]):
    tops = _top(frac[:, :, r], ci[:, :, r], labels=labels)
    rows.append([role] + [f"{h} {_ci(f, i)}" for h, f, i in tops])
  return report_lib.md_table(["patched at"] + [f"#{k + 1}"
                                               for k in range(TOP)], rows)


def mover_table(c: dict) -> str:
  nm = c["name_movers"]
  d = c["detectors"]
  direct = np.asarray(c["direct"]["fraction"])
  dci = np.asarray(c["direct"]["ci95"])
  rows = []
  for ch in nm["checks"]:
    l, h = ch["head"]
    rows.append([_head(ch["head"]), _ci(direct[l, h], dci[l, h]),
                 _ci(ch["io_minus_s"][0], ch["io_minus_s"][1:]),
                 _ci(ch["copy"][0], ch["copy"][1:]),
                 report_lib.percent(d["copy_top1"]["mean"][l][h]),
                 _ci(d["dla"]["mean"][l][h], d["dla"]["ci95"][l][h]),
                 ch["kind"]])
  if not rows:
    return "(no head's direct path is separated from the rest)"
  return report_lib.md_table(
      ["head", "direct path (share)", "attention END: IO - S",
       "copy score (IO - other names)", "IO top name", "direct logit diff.",
       "kind"], rows)


def path_table(p: dict) -> str:
  if "skipped" in p:
    return f"(not run: {p['skipped']})"
  labels = [report_lib.head_name(*s) for s in p["senders"]]
  tops = _top(p["fraction"], p["ci95"], labels=labels)
  return report_lib.md_table(["sender", "share removed [95% interval]"],
                             [[h, _ci(f, i)] for h, f, i in tops])


def _receivers(p: dict) -> str:
  if "receivers" not in p:
    return "none"
  return ", ".join(f"L{r[0]}{'H' if r[2] == 'q' else 'KV'}{r[1]}.{r[2]}"
                   for r in p["receivers"])


def _gap(cls) -> str:
  """The separation of a class: the paired interval of its weakest
  member's score minus the strongest other head's."""
  g = cls.get("gap_ci95")
  return ("no head is separated from the rest" if g is None else
          "weakest member minus strongest other head, 95% interval "
          + report_lib.interval(g, spec="+.2f"))


def _kinds(p: dict) -> str:
  if not p.get("kinds"):
    return "no head separated"
  return "; ".join(
      f"{_head(k['head'])}: attention S2 -> S1 minus S2 -> after S1 "
      f"{_ci(k['s2_s1_minus_after'][0], k['s2_s1_minus_after'][1:])}, "
      f"{k['kind']}" for k in p["kinds"])


def _attention_list(cls, d, key) -> str:
  if not cls["heads"]:
    return "none separated"
  return ", ".join(f"{_head(h)} {d[key]['mean'][h[0]][h[1]]:.2f}"
                   for h in cls["heads"])


def circuit_values(c: dict, through_mlps: bool) -> dict:
  """One circuit's template values (`c`: a model's entry of
  results.json's `circuits`)."""
  paths = c["paths"]
  si = paths.get("s_inhibition", {"skipped": paths.get(
      "skipped", "no name mover")})
  di = paths.get("duplicate_induction", {"skipped": (
      "no S-inhibition head separated" if "heads" in si and not si["heads"]
      else si.get("skipped", "the round was not run"))})
  pt = paths.get("previous_token", {"skipped": (
      "no head separated in the round before"
      if "heads" in di and not di["heads"]
      else di.get("skipped", "the round was not run"))})
  okv = paths.get("output_kv", {"skipped": paths.get(
      "skipped", "the round was not run")})
  denoise = c.get("denoise")
  if denoise:
    frac = np.asarray(denoise["fraction"])[:, :, 0]
    ci = np.asarray(denoise["ci95"])[:, :, 0]
    n_h = frac.shape[1]
    tops = _top(frac, ci, labels=[report_lib.head_name(i // n_h, i % n_h)
                                  for i in range(frac.size)])
    denoise_text = ", ".join(f"{h} {_ci(f, i)}" for h, f, i in tops)
  else:
    denoise_text = "not run"
  times = [c["activation"]["seconds"]] + [
      p["seconds"] for p in paths.values() if isinstance(p, dict)
      and "seconds" in p]
  d = c["detectors"]
  return {
      "circuit_model": LABELS.get(c["model"], c["model"]),
      "circuit_n": c["n"],
      "circuit_clean": _summ(c["clean"]),
      "circuit_abc": _summ(c["abc"]),
      "roles": ", ".join(c["activation"]["roles"]),
      "role_table": role_table(c),
      "figure": figures.patching_figure(c["model"]),
      "norm_note": NORM_NOTES[c["norm_placement"]],
      "denoise": denoise_text,
      "mover_table": mover_table(c),
      "movers_gap": _gap(c["name_movers"]),
      "movers": _heads(c["name_movers"]["confirmed"]),
      "output_heads": _heads(c["name_movers"]["heads"]),
      "negative_movers": _heads(c["negative_movers"]["heads"]),
      "negative_gap": _gap(c["negative_movers"]),
      "si_receivers": _receivers(si),
      "si_table": path_table(si),
      "si_heads": _heads(si.get("heads", [])),
      "si_gap": _gap(si) if "skipped" not in si else "not run",
      "okv_receivers": _receivers(okv),
      "okv_table": path_table(okv),
      "okv_heads": _heads(okv.get("heads", [])),
      "okv_gap": _gap(okv) if "skipped" not in okv else "not run",
      "di_receivers": _receivers(di),
      "di_table": path_table(di),
      "di_heads": _heads(di.get("heads", [])),
      "di_gap": _gap(di) if "skipped" not in di else "not run",
      "di_kinds": _kinds(di),
      "pt_receivers": _receivers(pt),
      "pt_table": path_table(pt),
      "pt_heads": _heads(pt.get("heads", [])),
      "pt_gap": _gap(pt) if "skipped" not in pt else "not run",
      "pt_previous": ("; ".join(
          f"{_head(x['head'])} {_ci(x['after_s1_s1'][0], x['after_s1_s1'][1:])}"
          for x in pt["previous"]) if pt.get("previous") else "none"),
      "floor_prev": f"{c['floors']['after_s1_s1']:.3f}",
      "path_form": (
          "as in Wang et al., the sender's `z` takes its ABC value in a run "
          "where every other head's `z` is frozen at its clean value and "
          "the MLPs recompute, so the change reaches the receivers directly "
          "and through the MLPs between, never through another head"
          if through_mlps else
          "the direct path only: each receiver layer's inputs recomputed "
          "from the clean stream plus the sender's output term"),
      "dup_attention": _attention_list(c["dup_attention"], d, "s2_s1"),
      "ind_attention": _attention_list(c["ind_attention"], d,
                                       "s2_after_s1"),
      "floor_s2": f"{c['floors']['s2_s1']:.3f}",
      "floor_end": f"{c['floors']['end_io']:.3f}",
      "patch_seconds": f"{sum(times) / 60:.1f}",
  }


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  e = saved["config"]["experiment"]
  models = saved["models"]
  out = {
      "command": report_lib.command("experiments.ioi", command),
      "wall": report_lib.wall_time(saved["wall_s"], False),
      # Older results saved no CPU time.
      "cpu": (f"; {saved['cpu_s'] / 60:.1f} CPU-minutes of the process"
              if "cpu_s" in saved else ""),
      "backend": saved["backend"],
      "num_templates": len(prompts.TEMPLATES),
      "templates": "\n".join(f"{i + 1}. \"{t.format(A='A', B='B', C='S')}\""
                             for i, t in enumerate(prompts.TEMPLATES)),
      "per_template_order": e["per_template_order"],
      "resamples": e["resamples"],
      "examples": "; ".join(f"{LABELS.get(n, n)}: \"{m['example'][0]}\""
                            for n, m in models.items()),
      "task_table": task_table(models),
      "order_table": order_table(models),
      "verdicts": " ".join(verdict(n, m, e["min_positive"])
                           for n, m in models.items()),
      "gqa": "; ".join(f"{LABELS.get(n, n)} {m['layers']} layers x "
                       f"{m['heads']} query heads on {m['kv_heads']} KV "
                       "heads" for n, m in models.items()),
  }
  out["claims"] = claims(saved)
  sections = [report_lib.fill(CIRCUIT_TEMPLATE, circuit_values(
      c, e["path_through_mlps"]) | {"k_max": e["k_max"]})
              for c in saved["circuits"].values()]
  if saved["circuit_skipped"]:
    skipped = ", ".join(LABELS.get(n, n) for n in saved["circuit_skipped"])
    sections.append(f"No circuit analysis of {skipped}: the task is not "
                    "done well enough (above).")
  out["circuit_section"] = "\n\n".join(sections)
  return out


# What a head's share means for each block wiring (`circuit.md.tmpl`).
NORM_NOTES = {
    "pre": "Its blocks add the attention's output to the stream as it is, "
           "so a head's term is its z W_O.",
    "sandwich": "Its blocks norm the attention's output before adding it "
                "(sandwich norms), so a head's change on a path is N'(o + "
                "d) - N'(o): the post-norm recomputed with the other heads "
                "at their clean outputs, which counts the rescaling of its "
                "layer's other heads as the head's own effect. The "
                "detectors (direct logit difference, copy score) freeze "
                "that norm at the clean run, as they freeze the final "
                "norm.",
}


# The circuit's section: a template of its own, since a run whose models
# all fail the task leaves it out.
CIRCUIT_TEMPLATE = pathlib.Path(__file__).with_name("circuit.md.tmpl")


def _share_of(p: dict, head) -> str:
  """A path round's share for one sender head, with its interval."""
  i = [list(x) for x in p["senders"]].index(list(head))
  return _ci(p["fraction"][i], p["ci95"][i])


def _act(c: dict, head, role: str) -> str:
  """A head's activation-patching share at one role, with its interval."""
  r = c["activation"]["roles"].index(role)
  l, h = head
  return _ci(c["activation"]["fraction"][l][h][r],
             c["activation"]["ci95"][l][h][r])


def claims(saved: dict) -> str:
  """The conclusions, worded no stronger than the numbers."""
  e = saved["config"]["experiment"]
  parts = [verdict(n, m, e["min_positive"])
           for n, m in saved["models"].items()]
  parts += [circuit_claims(c) for c in saved["circuits"].values()]
  return " ".join(parts)


def circuit_claims(c: dict) -> str:
  """One circuit's conclusions."""
  parts = []
  label = LABELS.get(c["model"], c["model"])
  checks = c["name_movers"]["checks"]
  paths = c["paths"]
  if not checks:
    return (f"In {label}, no head's direct path is separated from the "
            "rest: not resolved at this prompt count.")
  kinds = "; ".join(
      f"{_head(ch['head'])} ({ch['kind']}, share at END "
      f"{_act(c, ch['head'], 'END')})" for ch in checks)
  parts.append(f"In {label}, the output heads separated from every other "
               f"head on the direct path: {kinds}.")
  movers = c["name_movers"]["confirmed"]
  parts.append(f"Name movers in Wang et al.'s sense: {_heads(movers)}."
               if movers else "None of them is a name mover in Wang et "
               "al.'s sense (attending to IO and copying it).")
  chain = []
  for key, what, role in (
      ("s_inhibition", "steers their queries", "END"),
      ("duplicate_induction", "feeds that head's keys and values", "S2"),
      ("previous_token", "feeds those keys and values in turn", "rest")):
    p = paths.get(key, {})
    if not p.get("heads"):
      chain.append(f"the next step back ({what}) is not resolved")
      break
    where = ("positions other than S1, IO, S2 and END" if role == "rest"
             else role)
    chain.append(", ".join(
        f"{_head(h)} {what} (path share {_share_of(p, h)}; its whole "
        f"output at {where}: {_act(c, h, role)})" for h in p["heads"]))
  parts.append("Path patching, step by step back: " + "; ".join(chain)
               + ". Where a path's share is far below the head's whole "
               "output, most of that head's effect goes another way that "
               "these rounds do not trace.")
  okv = paths.get("output_kv")
  if okv and okv.get("heads"):
    parts.append("Into the output heads' own keys and values: " + ", ".join(
        f"{_head(h)} (path share {_share_of(okv, h)})"
        for h in okv["heads"]) + ".")
  elif okv and "fraction" in okv:
    top = _top(okv["fraction"], okv["ci95"], k=1,
               labels=[report_lib.head_name(*x) for x in okv["senders"]])[0]
    parts.append("Into the output heads' own keys and values no sender is "
                 f"separated (largest share {top[0]} {_ci(top[1], top[2])}).")
  return " ".join(parts)
