"""Induction on real text, reporting: tables, figures and claims from results.

`write` turns the results dict of `run.measure` into report.md, its PNG
figures and results.json. Shape letters: S checkpoints, L layers, H heads.
"""

from __future__ import annotations

import pathlib

import matplotlib
import numpy as np

from experiments.text_induction import run as run_lib
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

MODULE = "experiments.text_induction"


def _s(x, digits=3):
  """A `stats.summary` cell, or "n/a" (None: no seed has the value)."""
  return "n/a" if x is None else report_lib.summary(x, digits)


def _steps(values):
  return ", ".join("never" if v is None else str(v) for v in values)


def _log_bins(length: int, bins: int = 24):
  """`[(start, end), ...]` positions 0..length-1 in about `bins` groups of
  equal width on a log axis (the first ones a single position each)."""
  edges = np.unique(np.round(np.logspace(0, np.log10(length + 1), bins + 1))
                    .astype(int) - 1)
  return list(zip(edges[:-1], edges[1:]))


def bump_figure(runs, kind, seeds, e, path):
  """Loss against position (log x) at `e.bump_steps` checkpoints, one
  panel per seed: Olsson et al.'s "bump" plot. Each point is the mean
  over a group of positions of equal width on the log axis, drawn at the
  group's centre: one position is too noisy on these windows."""
  fig, axes = plots.subplots(1, len(seeds), figsize=(4.6 * len(seeds), 3.4),
                             squeeze=False)
  for ax, seed in zip(axes[0], seeds):
    tr = runs[f"{kind}_seed{seed}"]["traj"]
    steps = tr["steps"]
    bins = _log_bins(len(tr["loss_by_position"][0]))
    centre = [np.sqrt((a + 1) * b) for a, b in bins]  # 1-based positions
    pick = sorted(set(np.linspace(0, len(steps) - 1, e.bump_steps)
                      .round().astype(int).tolist()))
    for i in pick:
      loss = np.asarray(tr["loss_by_position"][i])
      ax.plot(centre, [loss[a:b].mean() for a, b in bins], marker=".",
              label=f"step {steps[i]}", color=_shade(i, len(steps)))
    for lo, hi in (e.early_positions, e.late_positions):
      ax.axvspan(lo + 1, hi, color="grey", alpha=0.15)
    ax.set_xscale("log")
    ax.set_title(f"{kind}, seed {seed}", fontsize=9)
    ax.set_xlabel("position in the window (token)")
    ax.set_ylabel("held-out loss (nats per token)")
    ax.legend(fontsize=6)
  plots.save(fig, path)


def _shade(i, n):
  """A colour from light to dark along the checkpoints."""
  return matplotlib.colormaps["viridis"](0.9 * (1 - i / max(n - 1, 1)))


def trajectory_figure(runs, kind, seeds, e, path):
  """Per seed, on one time axis: the best prefix-matching score of each
  layer, the copying score of the head that matches best at the end, and
  the ICL score (right axis), with the two landmarks marked."""
  fig, axes = plots.subplots(1, len(seeds), figsize=(5.2 * len(seeds), 3.4),
                             squeeze=False)
  fig.subplots_adjust(wspace=0.6)
  for ax, seed in zip(axes[0], seeds):
    r = runs[f"{kind}_seed{seed}"]
    tr, marks = r["traj"], r["landmarks"]
    steps = tr["steps"]
    pm = np.asarray(tr["prefix_matching"])  # [S, L, H]
    for l in range(pm.shape[1]):
      ax.plot(steps, pm[:, l].max(-1), label=f"prefix matching, layer {l}")
    l, h = np.unravel_index(np.argmax(pm[-1]), pm[-1].shape)
    ax.plot(steps, np.asarray(tr["copying"])[:, l, h], ":",
            label=f"copying, {report_lib.head_name(l, h)}")
    ax.axhline(e.threshold, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    right = ax.twinx()
    right.plot(steps, tr["icl"], color="black", label="ICL score")
    right.set_ylabel("ICL score (nats, late - early)")
    for step, style in ((marks["formation_step"], "-"),
                        (marks["icl_step"], "-.")):
      if step is not None:
        ax.axvline(step, color="tab:red", linewidth=0.8, linestyle=style)
    ax.set_title(f"{kind}, seed {seed}", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    right.legend(fontsize=6, loc="lower left")
  plots.save(fig, path)


def _model_rows(results):
  rows = []
  ng = results["ngram"]
  for kind in run_lib.KINDS:
    s = results["summary"][kind]
    rows.append([kind, _s(s["bits_per_byte"]),
                 _s(s["bits_per_token"]) if kind == "tokens" else "-",
                 _s(s["init_bits_per_byte"]), _s(s["icl_final"]),
                 _s(s["icl_init"])])
  for name in ("unigram", "bigram"):
    rows.append([f"{name} (tokens)", f"{ng[name]['bits_per_byte']:.3f}",
                 f"{ng[name]['bits_per_token']:.3f}", "-",
                 f"{ng[name]['icl']:.3f}", "-"])
  return rows


def _head_rows(results):
  rows = []
  for kind in run_lib.KINDS:
    s = results["summary"][kind]
    rows.append([kind, _s(s["best_prefix_matching"]),
                 _s(s["best_prefix_matching_init"]),
                 _s(s["uniform_prefix_matching"]),
                 f"{s['seeds_formed']} of {len(s['formation_step'])}",
                 _steps(s["formation_step"]), _steps(s["icl_step"]),
                 _s(s["icl_minus_formation"], 0)])
  return rows


HEAD_COLUMNS = ["head", "prefix matching (init)", "copying",
                "previous token", "duplicate token",
                "ICL change when ablated (nats)"]


def _per_head_rows(r):
  """One row per head of run `r` at the end of training."""
  tr = r["traj"]
  pm, pm0 = np.asarray(tr["prefix_matching"])[[-1, 0]]
  rows = []
  for l in range(pm.shape[0]):
    for h in range(pm.shape[1]):
      rows.append([report_lib.head_name(l, h), f"{pm[l, h]:.3f} "
                   f"({pm0[l, h]:.3f})",
                   f"{np.asarray(tr['copying'])[-1, l, h]:+.2f}",
                   f"{np.asarray(tr['previous_token'])[-1, l, h]:.3f}",
                   f"{np.asarray(tr['duplicate_token'])[-1, l, h]:.3f}",
                   f"{np.asarray(r['head_icl'])[l, h]:+.3f}"])
  return rows


def _heads_text(results, seed):
  parts = []
  for kind in run_lib.KINDS:
    r = results["runs"][f"{kind}_seed{seed}"]
    parts.append(f"**{kind}, seed {seed}** (uniform attention's prefix "
                 f"matching: {r['traj']['uniform_prefix_matching']:.3f}):\n\n"
                 + report_lib.md_table(HEAD_COLUMNS, _per_head_rows(r)))
  return "\n\n".join(parts)


def _ablation_text(results):
  a = results["summary"]["tokens"].get("ablation")
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


def _conclusions(results, e):
  s = results["summary"]["tokens"]
  b = results["summary"]["bytes"]
  n = len(s["formation_step"])
  lines = []
  if s["seeds_formed"] == 0:
    lines.append(
        f"- **No induction head formed on tokens** in any of {n} seeds "
        f"within {results['config']['train']['num_steps']} steps: the best "
        f"prefix-matching score ends at {_s(s['best_prefix_matching'])}, "
        f"against {e.threshold} for the threshold, "
        f"{_s(s['best_prefix_matching_init'])} at initialisation and "
        f"{_s(s['uniform_prefix_matching'])} for uniform attention. The "
        "co-occurrence of Olsson et al. could therefore not be measured; "
        "this is not a reproduction of it.")
    end = s["best_prefix_matching"]["values"]
    init = s["best_prefix_matching_init"]["values"]
    below = sum(a < b for a, b in zip(end, init))
    lines.append(
        f"- In {below} of {n} seeds the best head's prefix-matching score "
        "ends below the best head's at initialisation: training moved the "
        "heads away from the token after an earlier copy, not towards it.")
  else:
    lines.append(
        f"- Induction heads (prefix matching >= {e.threshold}) formed on "
        f"tokens in {s['seeds_formed']} of {n} seeds, at steps "
        f"{_steps(s['formation_step'])}; the ICL score covered half its "
        f"change at steps {_steps(s['icl_step'])}; ICL step minus "
        f"formation step {_s(s['icl_minus_formation'], 0)}.")
  ci = s["icl_final"]["ci95"]
  sign = ("above zero" if ci and ci[0] > 0 else
          "below zero" if ci and ci[1] < 0 else "not resolved from zero")
  reading = ("Later tokens are predicted worse than tokens near 50, the "
             "opposite of in-context learning." if ci and ci[0] > 0 else
             "Later tokens are predicted better than tokens near 50."
             if ci and ci[1] < 0 else "")
  lines.append(
      f"- The token models' ICL score ends at {_s(s['icl_final'])} nats, "
      f"{sign} over seeds (the bigram model on the same windows: "
      f"{results['ngram']['bigram']['icl']:+.3f}, what the text itself "
      f"differs by). {reading}".rstrip())
  lines.append(
      f"- What formed instead, tokens: the best previous-token head scores "
      f"{_s(s['best_previous_token'])}, the best duplicate-token head "
      f"{_s(s['best_duplicate_token'])}, the best copying score "
      f"{_s(s['best_copying'])}.")
  lines.append(
      f"- The byte-level control with the same budget: best prefix "
      f"matching {_s(b['best_prefix_matching'])}, induction heads in "
      f"{b['seeds_formed']} of {len(b['formation_step'])} seeds, final ICL "
      f"score {_s(b['icl_final'])} nats per byte-token against "
      f"{_s(s['icl_final'])} per BPE token.")
  return "\n".join(lines)


def write(config, results, workdir) -> dict:
  """report.md, figures and results.json into `workdir`."""
  workdir = pathlib.Path(workdir)
  e = config.experiment
  results = {**results, "config": config.to_dict()}
  seeds = list(e.seeds)
  figs = []
  for kind in run_lib.KINDS:
    for name, draw in (("bump", bump_figure),
                       ("trajectories", trajectory_figure)):
      f = f"{name}_{kind}.png"
      draw(results["runs"], kind, seeds, e, str(workdir / f))
      figs.append(f)
  c = results["corpus"]
  positions = (config.train.num_steps * config.task.batch_size
               * config.task.seq_len)
  report = "\n\n".join([
      "# Induction heads on real text: BPE tokens against bytes",
      f"Command: {report_lib.command(MODULE)}. "
      f"{report_lib.wall_time(results['wall_time_s'], results['reused'])} "
      f"({results['cpu_time_s'] / 60:.1f} CPU-minutes).",
      "## Setup",
      f"Corpus: {c['corpus']}, {c['train']['files']} training files "
      f"({c['train']['bytes']:,} bytes, {c['train']['tokens']:,} tokens, "
      f"{c['train']['bytes_per_token']:.2f} bytes per token) and "
      f"{c['held_out']['files']} held-out files "
      f"({c['held_out']['bytes_per_token']:.2f} bytes per token). "
      f"Byte-level BPE of {c['vocab_size']} ids trained on the training "
      f"files only. Model: {config.model.num_layers} layers, "
      f"{config.model.num_heads} heads, d_model {config.model.d_model}, "
      f"attention only, rotary; T = {config.task.seq_len}, batch "
      f"{config.task.batch_size}, {config.train.num_steps} steps "
      f"({positions:,} positions per model: about "
      f"{positions * c['train']['bytes_per_token'] / 1e6:.1f} MB of text "
      f"for the token model, {positions / 1e6:.1f} MB for the byte "
      "model). The byte control is the same model, budget "
      f"and T on bytes. Seeds {seeds}. Every score is on "
      f"{e.analysis_examples} held-out windows per seed; prefix matching "
      f"on {e.repeat_examples} sequences of {e.repeat_length} random ids "
      "given twice. ICL score: mean loss at positions "
      f"{list(e.late_positions)} minus {list(e.early_positions)} (Olsson "
      "et al.: token 500 minus token 50).",
      "## Held-out loss",
      report_lib.md_table(["model", "bits per byte", "bits per token",
                           "at init (bits per byte)", "ICL score (nats)",
                           "ICL at init"], _model_rows(results)),
      "## Induction heads and the ICL score",
      report_lib.md_table(
          ["model", "best prefix matching, end", "at init",
           "uniform attention", "seeds with a head >= threshold",
           "formation step", "ICL half-way step",
           "ICL step - formation step"], _head_rows(results)),
      "## What each head does at the end",
      "Scores at the last checkpoint (prefix matching at initialisation "
      "in brackets); copying in [-1, 1]; the last column is the ICL score "
      "with the head zero-ablated minus the intact model's.",
      _heads_text(results, seeds[0]),
      "## Ablation",
      _ablation_text(results),
      "## Figures",
      "\n".join(f"![{f}]({f})" for f in figs),
      "## What the numbers show",
      _conclusions(results, e),
  ])
  return report_lib.write_outputs(workdir, results, report,
                                  drop=("batch",), config=config)
