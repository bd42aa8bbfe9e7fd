"""Induction on real text, reporting: tables, figures and claims.

`write` turns what `run.measure` returned into report.md, its PNG figures
and results.json; nothing here trains or runs a model. The prose is
report.md.tmpl beside this file; `render` fills it from results.json
alone, so a committed report regenerates from its results.json. Shape
letters: L layers, H heads.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from experiments.text_induction import figures
from experiments.text_induction import run as run_lib
from mha_jax.measure import report as report_lib

MODULE = "experiments.text_induction"
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
# The held-out batch each trajectory keeps for the ablations.
DROP = ("batch",)
HEAD_COLUMNS = ["head", "prefix matching (init)", "copying",
                "previous token", "duplicate token",
                "ICL change when ablated (nats)"]


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  e = config.experiment
  for kind in run_lib.KINDS:
    figures.bump(results["runs"], kind, list(e.seeds), e,
                 str(workdir / f"bump_{kind}.png"))
    figures.trajectories(results["runs"], kind, list(e.seeds), e,
                         str(workdir / f"trajectories_{kind}.png"))
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), DROP,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _s(x, digits=3) -> str:
  """A `stats.summary` cell, or "n/a" (None: no seed has the value)."""
  return "n/a" if x is None else report_lib.summary(x, digits)


def _steps(values) -> str:
  """Per-seed landmark steps, "never" where there is none."""
  return ", ".join("never" if v is None else str(v) for v in values)


def _command(reused: bool, command: str | None) -> str:
  """The command line. `--reuse_runs` is the flag that makes `reused`
  true, so it is shown from results.json where the given command line
  (that of a later process rendering the report again) lacks it."""
  text = report_lib.command(MODULE, command)
  if reused and f"-m {MODULE}" in text and "reuse_runs" not in text:
    return text[:-1] + " --reuse_runs`"
  return text


def _model_rows(saved) -> list[list]:
  """Held-out loss and ICL score of each kind, then the n-gram models."""
  rows = []
  for kind in run_lib.KINDS:
    s = saved["summary"][kind]
    rows.append([kind, _s(s["bits_per_byte"]),
                 _s(s["bits_per_token"]) if kind == "tokens" else "-",
                 _s(s["init_bits_per_byte"]), _s(s["icl_final"]),
                 _s(s["icl_init"])])
  for name in ("unigram", "bigram"):
    ng = saved["ngram"][name]
    rows.append([f"{name} (tokens)", f"{ng['bits_per_byte']:.3f}",
                 f"{ng['bits_per_token']:.3f}", "-", f"{ng['icl']:.3f}",
                 "-"])
  return rows


def _landmark_rows(saved) -> list[list]:
  """Prefix matching, formation and ICL steps of each kind."""
  rows = []
  for kind in run_lib.KINDS:
    s = saved["summary"][kind]
    rows.append([kind, _s(s["best_prefix_matching"]),
                 _s(s["best_prefix_matching_init"]),
                 _s(s["uniform_prefix_matching"]),
                 f"{s['seeds_formed']} of {len(s['formation_step'])}",
                 _steps(s["formation_step"]), _steps(s["icl_step"]),
                 _s(s["icl_minus_formation"], 0)])
  return rows


def _head_table(r) -> str:
  """One row per head of run `r` at the end of training."""
  tr = r["traj"]
  pm, pm0 = np.asarray(tr["prefix_matching"])[[-1, 0]]
  last = {k: np.asarray(tr[k])[-1]
          for k in ("copying", "previous_token", "duplicate_token")}
  rows = [[report_lib.head_name(l, h), f"{pm[l, h]:.3f} ({pm0[l, h]:.3f})",
           f"{last['copying'][l, h]:+.2f}",
           f"{last['previous_token'][l, h]:.3f}",
           f"{last['duplicate_token'][l, h]:.3f}",
           f"{np.asarray(r['head_icl'])[l, h]:+.3f}"]
          for l in range(pm.shape[0]) for h in range(pm.shape[1])]
  return report_lib.md_table(HEAD_COLUMNS, rows)


def _ablation(a) -> str:
  """The token models' ablation table, or why there is none."""
  if a is None:
    return ("No token model has a head at or above the threshold at the "
            "end of training, so there is no induction head to ablate.")
  rows = [["ICL gain intact (nats, early - late)", _s(a["gain_intact"])],
          ["with the induction heads ablated", _s(a["gain_induction_ablated"])],
          ["with as many other heads ablated", _s(a["gain_others_ablated"])],
          ["share of the gain kept, induction heads ablated",
           _s(a["share_kept_induction"])],
          ["share of the gain kept, other heads ablated",
           _s(a["share_kept_others"])]]
  return (f"Over the {a['seeds']} token seeds with induction heads "
          "(zero ablation through `head_mask`, on the held-out windows):\n\n"
          + report_lib.md_table(["", "mean ± std [95% interval]"], rows))


def _formation(s, num_steps, threshold, positions) -> str:
  """The first conclusions: whether induction heads formed on tokens,
  within the budget of `positions` training tokens per model."""
  n = len(s["formation_step"])
  if s["seeds_formed"]:
    return (f"- Induction heads (prefix matching >= {threshold}) formed on "
            f"tokens in {s['seeds_formed']} of {n} seeds, at steps "
            f"{_steps(s['formation_step'])}; the ICL score covered half its "
            f"change at steps {_steps(s['icl_step'])}; ICL step minus "
            f"formation step {_s(s['icl_minus_formation'], 0)}.")
  below = sum(a < b for a, b in zip(s["best_prefix_matching"]["values"],
                                    s["best_prefix_matching_init"]["values"]))
  return (f"- **No induction head formed on tokens** in any of {n} seeds "
          f"within {num_steps} steps ({positions / 1e6:.1f}M training tokens "
          "per model, orders of magnitude fewer than the billions after "
          "which Olsson et al. report the phase change: the absence holds "
          "for this budget only): the best prefix-matching score ends "
          f"at {_s(s['best_prefix_matching'])}, against {threshold} for the "
          f"threshold, {_s(s['best_prefix_matching_init'])} at "
          f"initialisation and {_s(s['uniform_prefix_matching'])} for "
          "uniform attention. The co-occurrence of Olsson et al. could "
          "therefore not be measured; this is not a reproduction of it.\n"
          f"- In {below} of {n} seeds the best head's prefix-matching score "
          "ends below the best head's at initialisation: training moved the "
          "heads away from the token after an earlier copy, not towards it.")


def _icl_sign(ci) -> tuple[str, str]:
  """Where the final ICL score's interval lies, and what that means."""
  if ci and ci[0] > 0:
    return ("above zero", " Later tokens are predicted worse than tokens "
            "near 50, the opposite of in-context learning.")
  if ci and ci[1] < 0:
    return ("below zero",
            " Later tokens are predicted better than tokens near 50.")
  return "not resolved from zero", ""


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, c = saved["config"], saved["corpus"]
  model, task, e = config["model"], config["task"], config["experiment"]
  s, b = saved["summary"]["tokens"], saved["summary"]["bytes"]
  positions = (config["train"]["num_steps"] * task["batch_size"]
               * task["seq_len"])
  r0 = {k: saved["runs"][f"{k}_seed{e['seeds'][0]}"] for k in run_lib.KINDS}
  sign, reading = _icl_sign(s["icl_final"]["ci95"])
  return {
      "command": _command(saved["reused"], command),
      "wall_time": report_lib.wall_time(saved["wall_time_s"],
                                        saved["reused"]),
      "cpu_minutes": f"{saved['cpu_time_s'] / 60:.1f}",
      "corpus": c["corpus"],
      "train_files": c["train"]["files"],
      "train_bytes": f"{c['train']['bytes']:,}",
      "train_tokens": f"{c['train']['tokens']:,}",
      "train_bytes_per_token": f"{c['train']['bytes_per_token']:.2f}",
      "held_out_files": c["held_out"]["files"],
      "held_out_bytes_per_token": f"{c['held_out']['bytes_per_token']:.2f}",
      "vocab_size": c["vocab_size"],
      "num_layers": model["num_layers"],
      "num_heads": model["num_heads"],
      "d_model": model["d_model"],
      "seq_len": task["seq_len"],
      "batch_size": task["batch_size"],
      "num_steps": config["train"]["num_steps"],
      "positions": f"{positions:,}",
      "token_megabytes":
          f"{positions * c['train']['bytes_per_token'] / 1e6:.1f}",
      "byte_megabytes": f"{positions / 1e6:.1f}",
      "seeds": list(e["seeds"]),
      "analysis_examples": e["analysis_examples"],
      "repeat_examples": e["repeat_examples"],
      "repeat_length": e["repeat_length"],
      "late_positions": list(e["late_positions"]),
      "early_positions": list(e["early_positions"]),
      "loss_table": report_lib.md_table(
          ["model", "bits per byte", "bits per token",
           "at init (bits per byte)", "ICL score (nats)", "ICL at init"],
          _model_rows(saved)),
      "landmark_table": report_lib.md_table(
          ["model", "best prefix matching, end", "at init",
           "uniform attention", "seeds with a head >= threshold",
           "formation step", "ICL half-way step",
           "ICL step - formation step"], _landmark_rows(saved)),
      "first_seed": e["seeds"][0],
      **{f"{k}_uniform":
         f"{r0[k]['traj']['uniform_prefix_matching']:.3f}"
         for k in run_lib.KINDS},
      **{f"{k}_heads": _head_table(r0[k]) for k in run_lib.KINDS},
      "ablation": _ablation(s.get("ablation")),
      "formation": _formation(s, config["train"]["num_steps"],
                              e["threshold"], positions),
      "icl_final": _s(s["icl_final"]),
      "icl_sign": sign,
      "bigram_icl": f"{saved['ngram']['bigram']['icl']:+.3f}",
      "icl_reading": reading,
      "best_previous_token": _s(s["best_previous_token"]),
      "best_duplicate_token": _s(s["best_duplicate_token"]),
      "best_copying": _s(s["best_copying"]),
      "bytes_best_prefix_matching": _s(b["best_prefix_matching"]),
      "bytes_formed": b["seeds_formed"],
      "bytes_seeds": len(b["formation_step"]),
      "bytes_icl_final": _s(b["icl_final"]),
  }
