"""The SAE runs' statistics over seeds, written into results.json by the
run (`run.measure`): each kind's headline numbers summarised, and TopK
against ReLU-L1. The report only formats them.
"""

from __future__ import annotations

from mha_jax.measure import stats


def per_kind(runs: list) -> dict:
  """Per kind, `stats.summary` over seeds of the headline numbers."""
  out = {}
  for kind in sorted({r["kind"] for r in runs}):
    rs = [r for r in runs if r["kind"] == kind]
    pick = {"l0": lambda r: r["l0"], "dead": lambda r: r["dead"],
            "dense": lambda r: r["dense"],
            "explained_variance": lambda r: r["explained_variance"],
            "recovered_zero": lambda r: r["loss"]["recovered_zero"],
            "recovered_mean": lambda r: r["loss"]["recovered_mean"],
            "ce_splice": lambda r: r["loss"]["splice"],
            "repeated_recovered_zero":
                lambda r: r["loss_repeated"]["recovered_zero"],
            "repeated_recovered_mean":
                lambda r: r["loss_repeated"]["recovered_mean"],
            "ce_splice_repeated": lambda r: r["loss_repeated"]["splice"],
            "steps_per_s": lambda r: r["steps_per_s"]}
    if any(r["steps_per_s"] is None for r in rs):  # untrained SAEs
      del pick["steps_per_s"]
    if "kl_splice" in rs[0]["loss"]:
      pick["kl_splice"] = lambda r: r["loss"]["kl_splice"]
      pick["kl_splice_repeated"] = lambda r: r["loss_repeated"]["kl_splice"]
    if "induction" in rs[0]:
      pick["induction_count"] = lambda r: r["induction"]["count"]
      pick["copying_count"] = lambda r: r["induction"]["copying_count"]
    out[kind] = {n: stats.summary([float(f(r)) for r in rs])
                 for n, f in pick.items()}
  return out


def sweep_per_kind(runs: list) -> dict:
  """Per kind, the threshold sweep's counts summarised over seeds: a
  list, in the runs' sweep order, of {"threshold", "value", "induction",
  "copying"} with `stats.summary` of each count."""
  out = {}
  for kind in sorted({r["kind"] for r in runs}):
    sweeps = [r["induction"]["sweep"] for r in runs if r["kind"] == kind]
    out[kind] = [{"threshold": row["threshold"], "value": row["value"],
                  **{n: stats.summary([float(s[i][n]) for s in sweeps])
                     for n in ("induction", "copying")}}
                 for i, row in enumerate(sweeps[0])]
  return out


def topk_minus_relu(runs: list) -> dict:
  """TopK minus ReLU over seeds (`stats.difference`, Welch) of the
  explained variance and of the loss recovered on the repeats (zero
  ablation); empty unless both kinds ran."""
  if not {"relu", "topk"} <= {r["kind"] for r in runs}:
    return {}
  per = lambda kind, f: [f(r) for r in runs if r["kind"] == kind]
  pick = {"explained_variance": lambda r: r["explained_variance"],
          "repeated_recovered_zero":
              lambda r: r["loss_repeated"]["recovered_zero"]}
  return {n: stats.difference(per("topk", f), per("relu", f))
          for n, f in pick.items()}
