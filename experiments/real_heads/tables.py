"""The report's tables and the wording that depends on the numbers.

Every function formats what results.json holds (means, intervals,
floors, verdict inputs were computed in run.py); the only choices here are
words: "raises", "lowers" or "not resolved" where an interval covers 0.
"""

from __future__ import annotations

from mha_jax.measure import report as report_lib

NAMES = {"previous": "previous token", "induction": "induction",
         "duplicate": "duplicate token", "first": "first-token (sink) mass",
         "local": "local mass", "long": "long-range mass",
         "entropy": "entropy (nats)"}
ON = {"repeated": "random tokens repeated", "prose": "prose"}


def head(lh) -> str:
  return report_lib.head_name(*lh)


def ci(x, digits: int = 3) -> str:
  return report_lib.interval(x, digits)


def verdict(interval) -> str:
  """What an interval of a change allows one to say."""
  lo, hi = interval
  if lo > 0:
    return "raises"
  if hi < 0:
    return "lowers"
  return "not resolved"


def change(mean: float, interval, digits: int = 2) -> str:
  """`+1.23 [0.50, 2.00]`, with "(not resolved)" where it covers 0."""
  text = f"{report_lib.signed(mean, digits)} {ci(interval, digits)}"
  return text + (" (not resolved)" if verdict(interval) == "not resolved"
                 else "")


def windows(ws) -> str:
  """How the layers' windows read: all global, or which are sliding."""
  if all(w is None for w in ws):
    return "every layer global (no window)"
  glob = [str(l) for l, w in enumerate(ws) if w is None]
  size = next(w for w in ws if w is not None)
  return (f"sliding window of {size} tokens on {sum(w is not None for w in ws)}"
          f" layers, global layers {', '.join(glob)}")


def survey_table(s: dict, k: int) -> str:
  rows = []
  for name, x in s["scores"].items():
    best = max if x["direction"] == "high" else min
    top = "; ".join(f"{head(lh)} {x['mean'][lh[0]][lh[1]]:.3f} "
                    f"{ci((x['lo'][lh[0]][lh[1]], x['hi'][lh[0]][lh[1]]))}"
                    for lh in x["top"])
    rows.append([
        NAMES[name], ON[x["on"]], f"{x['uniform']:.3f}",
        f"{best(max(r) if best is max else min(r) for r in x['reinit']):.3f}",
        f"{best(max(r) if best is max else min(r) for r in x['shuffled']):.3f}",
        x["above_floor"], top, "yes" if x["separated"] else "no"])
  return report_lib.md_table(
      ["score", "read on", "uniform", "re-initialised: most marked head",
       "shuffled: most marked head", "heads past every floor",
       f"top {k}: mean [95% interval]", f"top {k} apart from the rest"],
      rows)


def sink(x: dict, eps: float) -> str:
  t = x["trained"]
  return (f"Sink_0^{eps} (the share of heads whose mean weight on the first "
          f"token exceeds {eps}): {report_lib.percent(t['share'])} "
          f"[{report_lib.percent(t['lo'])}, {report_lib.percent(t['hi'])}]; "
          f"re-initialised {report_lib.percent(x['reinit'])}, shuffled "
          f"{report_lib.percent(x['shuffled'])}, uniform "
          f"{report_lib.percent(x['uniform'])}.")


def clean(x: dict) -> str:
  m = x["mean"]
  return (f"second copy {m['repeated']:.2f} nats, first copy "
          f"{m['first_copy']:.2f}, prose {m['prose']:.2f}")


def causal_table(c: dict, kind: str) -> str:
  rows = []
  for k, by_metric in c[kind]["effect"].items():
    row = [k, ", ".join(head(lh) for lh in c["sets"][k])]
    for m in ("repeated", "prose"):
      x = by_metric[m]
      row += [change(x["change"], x["ci"]),
              change(x["random"]["mean"], x["random"]["ci95"]),
              change(x["minus_random"], x["minus_random_ci"]),
              report_lib.percent(x["random_at_least"], 0)]
    rows.append(row)
  cols = ["change [95%]", "k random: change [t 95%]",
          "minus random [95%]", "random draws at least as large"]
  return report_lib.md_table(
      ["heads", "which"] + [f"copy: {x}" for x in cols]
      + [f"prose: {x}" for x in cols], rows)


def single_table(c: dict, s: dict) -> str:
  x = c["single"]
  group = c["zero"]["effect"]["induction"]["repeated"]["change"]
  rows = []
  for i, lh in enumerate(x["heads"]):
    sec, fir, pro = x["second"][i], x["first"][i], x["prose"][i]
    bigger = (verdict(sec["ci"]) != "not resolved"
              and abs(sec["mean"]) > abs(group))
    mea = x["second_mean_ablation"][i]
    rows.append([head(lh), f"{x['attribution'][lh[0]][lh[1]]:+.4f}",
                 change(sec["mean"], sec["ci"]),
                 change(mea["mean"], mea["ci"]),
                 change(fir["mean"], fir["ci"]),
                 "-" if pro is None else change(pro["mean"], pro["ci"]),
                 "yes" if bigger else "no"])
  return report_lib.md_table(
      ["head", "attribution estimate (copy)", "copy loss change [95%]",
       "copy, mean ablation", "first-copy loss change", "prose loss change",
       "larger than the top-k induction group"], rows)


def _scores_of(s: dict, lh) -> str:
  """A head's survey scores, with its rank among all heads."""
  parts = []
  for name in ("previous", "duplicate", "first", "entropy"):
    x = s["scores"][name]
    parts.append(f"{NAMES[name]} {x['mean'][lh[0]][lh[1]]:.3f} (rank "
                 f"{x['rank'][lh[0]][lh[1]]})")
  return ", ".join(parts)


def layer0(c: dict, s: dict) -> str:
  """Which layer-0 heads lower the copy loss alone, and what else they do."""
  x = c["single"]
  lowers = [i for i, lh in enumerate(x["heads"])
            if lh[0] == 0 and verdict(x["second"][i]["ci"]) == "lowers"]
  if not lowers:
    return ("No layer-0 head's ablation alone lowers the second-copy loss "
            "beyond its interval.")
  out = []
  for i in lowers:
    lh, sec, fir, pro, mea = (x["heads"][i], x["second"][i], x["first"][i],
                              x["prose"][i], x["second_mean_ablation"][i])
    out.append(
        f"Zeroing {head(lh)} alone {verdict(sec['ci'])} the second-copy loss "
        f"({change(sec['mean'], sec['ci'])} nats; under mean ablation "
        f"{change(mea['mean'], mea['ci'])}), "
        f"the first copy's changes by {change(fir['mean'], fir['ci'])} "
        f"and the prose loss by {change(pro['mean'], pro['ci'])}. Its "
        f"survey scores: "
        f"{_scores_of(s, lh)}.")
  return " ".join(out)


def kv(x: dict, e: dict) -> str:
  g, m = x["gqa"], x["mha"]
  d = x["speed_ratio"]
  return (
      f"Greedy decoding of {e['kv_new']} tokens after a {e['kv_prompt']}-"
      f"token prompt, batch 1, a cache of {e['kv_max_len']} slots (every "
      f"step reads all of them), {e['kv_repeats']} timed repeats. "
      f"KV cache per token (float32, keys and values of every layer, read "
      f"off `init_cache`): GQA {g['bytes_per_token']:,} bytes, MHA twin "
      f"{m['bytes_per_token']:,} "
      f"({m['bytes_per_token'] / g['bytes_per_token']:.1f}x). "
      f"Decode, seconds per token after the first: GQA "
      f"{report_lib.summary(g['summary'], 4)}, MHA "
      f"{report_lib.summary(m['summary'], 4)}; MHA minus GQA "
      f"{report_lib.difference(d, 4)}. The twin's logits differ from the "
      f"model's by at most {x['logit_max_abs_diff']:.2g}; greedy tokens "
      f"{'identical' if x['same_tokens'] else 'DIFFER'}.")


def _heads(hs) -> str:
  return ", ".join(head(lh) for lh in hs)


def distance_values(r: dict, e: dict) -> dict:
  d = r["distance"]
  cell = lambda x: f"{x['mean']:.2f} {ci(x['ci'], 2)}"
  rows, paired = [], []
  for g, dist in enumerate(d["distances"]):
    b = d["summary"][g]
    loss = b["loss"]
    rows.append([dist,
                 f"{head(b['best_sliding'])} {b['best_sliding_score']:.3f}",
                 f"{head(b['best_global'])} {b['best_global_score']:.3f}",
                 cell(loss["none"]), cell(loss["no_copy"]),
                 *(cell(loss[a][k]) for a in ("zero", "mean")
                   for k in ("global_induction", "local_induction",
                             "random")),
                 cell(loss["mean"]["global_layers"])])
    mr = b["minus_random"]
    paired.append([dist,
                   *(change(mr[a][k]["mean"], mr[a][k]["ci"])
                     for a in ("zero", "mean")
                     for k in ("global_induction", "local_induction")),
                   *(change(b["global_layers_minus"][k]["mean"],
                            b["global_layers_minus"][k]["ci"])
                     for k in ("none", "no_copy"))])
  sets = d["sets"]
  return {
      "segment": e["segment"], "distance_inputs": e["distance_inputs"],
      "draws": e["distance_draws"],
      "window": next(w for w in r["info"]["windows"] if w is not None),
      "global_heads": _heads(sets["global_induction"]),
      "local_heads": _heads(sets["local_induction"]),
      "random_heads": "; ".join(_heads(v) for k, v in sets.items()
                                if k.startswith("random_")),
      "global_layers": ", ".join(str(l) for l in sorted(
          {lh[0] for lh in sets["global_layers"]})),
      "table": report_lib.md_table(
          ["distance", "best sliding-layer head", "best global-layer head",
           "copy loss", "no copy", "zero: global induction",
           "zero: sliding induction", "zero: random", "mean: global "
           "induction", "mean: sliding induction", "mean: random",
           "mean: global layers"], rows),
      "paired": report_lib.md_table(
          ["distance", "zero: global induction - random",
           "zero: sliding induction - random",
           "mean: global induction - random",
           "mean: sliding induction - random",
           "mean: global layers - copy loss",
           "mean: global layers - no copy"], paired),
      "name": r["info"]["name"]}


def findings(saved: dict) -> str:
  """The conclusions, one paragraph per model, in words no stronger than
  the intervals."""
  out = []
  eps = saved["config"]["experiment"]["sink_eps"]
  for r in saved["models"].values():
    s, c = r["survey"]["scores"], r["causal"]
    ind, prev = s["induction"], s["previous"]
    top_i, top_p = ind["top"][0], prev["top"][0]
    li, hi = top_i
    z = c["zero"]["effect"]
    zi, zp, zs = (z["induction"]["repeated"], z["previous"]["prose"],
                  z["sink"]["prose"])
    out.append(
        f"- **{r['info']['label']}.** Strongest induction head {head(top_i)} "
        f"({ind['mean'][li][hi]:.2f} "
        f"{ci((ind['lo'][li][hi], ind['hi'][li][hi]), 2)}"
        f" against a highest floor of {ind['floor']:.3f}); {ind['above_floor']}"
        f" heads past every floor. Zeroing the top induction heads "
        f"{verdict(zi['ci'])} the second-copy loss by "
        f"{change(zi['change'], zi['ci'])} nats, against "
        f"{change(zi['random']['mean'], zi['random']['ci95'])} for random "
        f"sets (minus random "
        f"{change(zi['minus_random'], zi['minus_random_ci'])}). "
        f"Strongest previous-token head {head(top_p)} "
        f"({prev['mean'][top_p[0]][top_p[1]]:.2f}); zeroing the top ones "
        f"{verdict(zp['ci'])} the prose loss "
        f"({change(zp['change'], zp['ci'])}; minus random "
        f"{change(zp['minus_random'], zp['minus_random_ci'])}). Zeroing the "
        f"top sink heads {verdict(zs['ci'])} the prose loss "
        f"({change(zs['change'], zs['ci'])}; minus random "
        f"{change(zs['minus_random'], zs['minus_random_ci'])}); "
        f"{sink(r['survey']['sink'], eps)}"
        + (" " + _distance_finding(r) if "distance" in r else ""))
  return "\n".join(out)


def _distance_finding(r: dict) -> str:
  d = r["distance"]
  near, far = d["summary"][0], d["summary"][-1]
  window = next(w for w in r["info"]["windows"] if w is not None)
  cell = lambda x: f"{x['mean']:.2f} {ci(x['ci'], 2)}"
  g = lambda b, k: change(b["global_layers_minus"][k]["mean"],
                          b["global_layers_minus"][k]["ci"])
  mr = far["minus_random"]["mean"]["global_induction"]
  return (
      f"At a repeat distance of {d['distances'][-1]} tokens (the sliding "
      f"window is {window}) the best sliding-layer head scores "
      f"{far['best_sliding_score']:.3f} and the best global-layer head "
      f"({head(far['best_global'])}) {far['best_global_score']:.3f}; the "
      f"copy loss is {cell(far['loss']['none'])} against "
      f"{cell(far['loss']['no_copy'])} with nothing to copy. Mean-ablating "
      f"the global induction heads there changes it by "
      f"{change(mr['mean'], mr['ci'])} more than random heads do. "
      f"Mean-ablating every head of the global layers leaves the loss "
      f"{g(far, 'no_copy')} from the no-copy loss at {d['distances'][-1]}"
      f" and {g(near, 'none')} from the copy loss at {d['distances'][0]}"
      f" (where the sliding layers can see the copy).")
