"""The induction detectors' controls: models whose answer is known.

The text models grow no head that the induction detectors call one. That
says something only if the same detectors, with the same thresholds,
call a real induction head one and stay silent where there is none. The
models of experiment 1 (`configs/induction.py`: 2-layer attention-only
decoders on random tokens with a repeated segment) are that known
answer: their layer-1 heads attend to the token after the earlier copy
(experiment 1's own induction score 0.78 ± 0.07 in its committed run).
So `measure` trains them, with experiment 1's config and seeds, and runs
the text experiment's own scoring code on them:

  * positive control: the trained 2-layer models, where the detectors
    must fire;
  * negative controls: the same models at initialisation (no head has
    learnt anything), and trained 1-layer models (no earlier head can
    tell a key what came before it, so no induction head can form),
    where they must not.

"Fires" is the text experiment's own criterion: a head's score is at
least `thresholds.induction` and at least `floor_ratio` times uniform
attention's on the same sequences. Shape letters: L layers, H heads.

Why these models rather than repeated random bytes fed to the text
models: a positive control needs a model known to HAVE the heads; what
the text models do on random bytes is a second measurement of the text
models, not a control of the detector.
"""

from __future__ import annotations

import numpy as np

from configs import induction as induction_config
from experiments.text_heads import heads
from experiments.text_heads import survey
from mha_jax.interp import head_metrics
from mha_jax.measure import runs as runs_lib
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import train_state

# The detectors controlled: the taxonomy's (repeated text) and both
# span scores, old and strict.
DETECTORS = ("repeat_induction", "span_induction", "span_induction_strict")


def fires(score, floor, thresholds) -> np.ndarray:
  """`[...]` bool: `score` >= thresholds.induction and >= floor_ratio x
  `floor` (a float: uniform attention's score), the taxonomy's rule."""
  return heads.clears_threshold(score, float(floor), thresholds["induction"],
                               thresholds["floor_ratio"])


def detector_scores(model, batch, rep_batch, *, max_offset: int,
                    span: int = 3) -> dict:
  """name -> `[L, H]`: every detector of `DETECTORS` (the text
  experiment's `survey.head_scores`, so the very code that scored the
  text models) and experiment 1's own induction score on `batch`."""
  # Byte counts only feed the rare-byte score, which is not read here.
  s = survey.head_scores(model, batch, rep_batch,
                         counts=np.ones(256), max_offset=max_offset,
                         span=span)
  out = {k: np.asarray(s[k]) for k in DETECTORS}
  w = held_out.weights_of(model, {"inputs": batch["inputs"]})["self"]
  tokens = np.asarray(batch["inputs"])
  out["experiment1_induction"] = np.stack(
      [np.asarray(head_metrics.induction_score(wl, tokens)) for wl in w])
  return out


def detector_floors(batch, rep_batch, *, max_offset: int,
                    span: int = 3) -> dict:
  """name -> uniform causal attention's score on the same sequences."""
  f = survey.floors(batch, rep_batch, counts=np.ones(256),
                    max_offset=max_offset, span=span)
  return {k: f[k] for k in DETECTORS}


def _one(model, batch, rep, e, thresholds, uniform) -> dict:
  """Scores `[L, H]`, the best head, and which heads fire, of one model."""
  s = detector_scores(model, batch, rep, max_offset=e.max_offset)
  return {"scores": s,
          "best": {k: float(np.max(s[k])) for k in DETECTORS},
          "best_layer": {k: int(np.unravel_index(np.argmax(s[k]),
                                                 s[k].shape)[0])
                         for k in DETECTORS},
          "firing": {k: int(np.sum(fires(s[k], uniform[k], thresholds)))
                     for k in DETECTORS}}


def control_config(config):
  """Experiment 1's config (its smoke sizes in a smoke run), with the
  seeds and steps of `config.experiment.control`."""
  c = induction_config.get_config("smoke" if config.smoke else None)
  ctl = config.experiment.control
  return runs_lib.variant(c, **{"train.num_steps": int(ctl.num_steps)})


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train and score the control models; returns the results dict.

  "runs" (`L<depth>_seed<seed>` -> {"trained", "init": `_one`'s record,
  "uniform": `detector_floors`}) and "summary" (per depth and detector:
  `stats.summary` of the best head trained and at init, the uniform
  floor, and the number of seeds with a firing head, trained and init).
  """
  e, ctl = config.experiment, config.experiment.control
  c = control_config(config)
  runs = {}
  for depth in (c.model.num_layers, int(ctl.negative_layers)):
    for r in runs_lib.seed_runs(c, workdir, tuple(ctl.seeds),
                                f"L{depth}_seed{{seed}}", reuse=reuse,
                                **{"model.num_layers": depth}):
      batch = held_out.analysis_batch(
          r.config, int(ctl.analysis_examples),
          seed=held_out.ANALYSIS_SEED + r.seed)
      batch = {k: np.asarray(v) for k, v in batch.items()}
      # The text experiment's repeated text: the first half of each
      # window, given twice.
      rep = survey.repeated_batch(batch, r.config.task.seq_len // 2)
      uniform = detector_floors(batch, rep, max_offset=e.max_offset)
      init = train_state.create_train_state(r.config).model()
      runs[r.run_dir.name] = {
          "trained": _one(r.state.model(), batch, rep, e, e.thresholds,
                          uniform),
          "init": _one(init, batch, rep, e, e.thresholds, uniform),
          "uniform": uniform}
  return {"config": {"steps": int(c.train.num_steps),
                     "seq_len": int(c.task.seq_len),
                     "layers": [int(c.model.num_layers),
                                int(ctl.negative_layers)],
                     "seeds": list(ctl.seeds),
                     "examples": int(ctl.analysis_examples)},
          "runs": runs, "summary": _summary(runs)}


def _summary(runs) -> dict:
  """Per depth ("L2", "L1") and detector: best head (trained, init),
  uniform floor, seeds with a firing head; experiment 1's score too."""
  out = {}
  for depth in sorted({name.split("_")[0] for name in runs}):
    rs = [runs[n] for n in sorted(runs) if n.split("_")[0] == depth]
    d = {}
    for k in DETECTORS:
      d[k] = {"trained": stats.summary([r["trained"]["best"][k] for r in rs]),
              "init": stats.summary([r["init"]["best"][k] for r in rs]),
              "uniform": stats.summary([r["uniform"][k] for r in rs]),
              "seeds_firing": sum(r["trained"]["firing"][k] > 0 for r in rs),
              "seeds_firing_init": sum(r["init"]["firing"][k] > 0
                                       for r in rs),
              "best_layer": [r["trained"]["best_layer"][k] for r in rs],
              "seeds": len(rs)}
    d["experiment1_induction"] = stats.summary(
        [float(np.max(r["trained"]["scores"]["experiment1_induction"]))
         for r in rs])
    out[depth] = d
  return out
