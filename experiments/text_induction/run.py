"""Induction on real text, running: train the token and byte models, measure.

`measure` trains, per seed, the config's model on BPE tokens and the same
model on bytes (the control: same depth, width, heads, T, batch and steps,
so the same number of positions and nearly the same compute; it reads
about 2.6 times fewer bytes of text at V = 1024), then measures every checkpoint of
both on held-out files (`scores.measure`), finds when each seed's
induction heads formed and when its in-context-learning score moved, and
ablates the formed heads. Returns the results dict.

Landmarks (per run, from the checkpoint trajectories):
  * formation step: the first checkpoint at which some head's
    prefix-matching score reaches `experiment.threshold`;
  * ICL step: the first checkpoint at which the ICL score has covered half
    of its way from initialisation to its final value
    (`curves.half_way_step`);
  * their difference, per seed, and its t interval over seeds.
"""

from __future__ import annotations

import os
import pathlib
import platform
import time

import numpy as np

from experiments.text_induction import scores
from mha_jax.measure import curves
from mha_jax.measure import runs as runs_lib
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import text_corpus
from mha_jax.training import text_tokens
from mha_jax.training import saved_run

KINDS = ("tokens", "bytes")


def kind_overrides(config, kind: str) -> dict:
  """The overrides of the token model (none) or of the byte control."""
  if kind == "tokens":
    return {}
  return {"task.name": config.experiment.control_task,
          "task.vocab_size": tasks.TEXT_VOCAB}


def _token_bytes(config, kind):
  """`[V]` bytes of text per id of the model's vocabulary."""
  if kind == "tokens":
    tb = tasks.text_tokens_of(config.task).token_bytes
    return np.pad(tb, (0, config.task.vocab_size - len(tb)))
  return np.asarray([0] * tasks.NUM_SPECIAL + [1] * text_corpus.NUM_BYTES)


def trajectory(r, kind, e) -> dict:
  """`scores.measure` at step 0 and every checkpoint of run `r`, as
  lists over steps, plus the uniform floor of the prefix-matching score."""
  hc = held_out.text_config(r.config)
  batch = {k: np.asarray(v) for k, v in held_out.analysis_batch(
      hc, e.analysis_examples, seed=held_out.ANALYSIS_SEED + r.seed).items()}
  ids = np.arange(tasks.NUM_SPECIAL, r.config.task.vocab_size)
  if kind == "tokens":  # ids the BPE has (it may stop below vocab_size)
    ids = ids[ids < tasks.text_tokens_of(r.config.task).vocab_size]
  rep = scores.repeated_random(ids, e.repeat_length, e.repeat_examples,
                               seed=held_out.ANALYSIS_SEED + r.seed)
  token_bytes = _token_bytes(r.config, kind)
  out = {"steps": []}
  for step in [0] + saved_run.checkpoint_steps(r.run_dir):
    model = saved_run.load_state(r.run_dir, step)[0].model()
    m = scores.measure(model, batch, rep, token_bytes,
                       early=tuple(e.early_positions),
                       late=tuple(e.late_positions))
    out["steps"].append(step)
    for k, v in m.items():
      out.setdefault(k, []).append(v)
  out["prefix_matching"] = np.stack(out["prefix_matching"])  # [S, L, H]
  for k in ("copying", "previous_token", "duplicate_token"):
    out[k] = np.stack(out[k])
  out["uniform_prefix_matching"] = scores.prefix_matching_floor(rep)
  out["batch"] = batch  # for the ablation; kept out of results.json
  return out


def landmarks(traj, threshold) -> dict:
  """Formation step, ICL step and what formed (see the module doc)."""
  steps = traj["steps"]
  best = traj["prefix_matching"].max(axis=(1, 2))  # [S]
  icl = np.asarray(traj["icl"])
  formed = curves.first_step(steps, best >= threshold)  # as `heads`
  icl_step = curves.half_way_step(steps, icl)
  final = traj["prefix_matching"][-1]
  heads = [(int(l), int(h)) for l, h in zip(*np.nonzero(final >= threshold))]
  return {"formation_step": formed, "icl_step": icl_step,
          "icl_minus_formation": (None if formed is None
                                  else icl_step - formed),
          "induction_heads": heads,
          "best_prefix_matching": best.tolist(),
          "icl_min": float(icl.min()),
          "icl_min_step": int(steps[int(np.argmin(icl))])}


def ablation(model, batch, heads, e, seed) -> dict:
  """The ICL score intact, with `heads` zero-ablated, and with as many
  other heads ablated (`e.random_draws` independent random draws; none
  when fewer other heads than `heads` exist). None when no head formed."""
  if not heads:
    return None
  kw = dict(early=tuple(e.early_positions), late=tuple(e.late_positions))
  cfg = model.config
  others = [(l, h) for l in range(cfg.num_layers) for h in range(
      cfg.num_heads) if (l, h) not in heads]
  rng = np.random.default_rng(seed)
  draws = [sorted(map(tuple, np.asarray(others)[rng.choice(
      len(others), len(heads), replace=False)].tolist()))
           for _ in range(e.random_draws)] if len(others) >= len(heads) else []
  intact = scores.ablated_icl(model, batch, [], **kw)
  return {"intact": intact,
          "induction": scores.ablated_icl(model, batch, heads, **kw),
          "others": [scores.ablated_icl(model, batch, d, **kw)
                     for d in draws],
          "other_heads": draws}


def head_icl(model, batch, e) -> np.ndarray:
  """`[L, H]`: the ICL score with each head alone zero-ablated, minus the
  intact model's (positive: the head made later tokens cheaper)."""
  kw = dict(early=tuple(e.early_positions), late=tuple(e.late_positions))
  cfg = model.config
  intact = scores.ablated_icl(model, batch, [], **kw)
  return np.asarray([[scores.ablated_icl(model, batch, [(l, h)], **kw)
                      - intact for h in range(cfg.num_heads)]
                     for l in range(cfg.num_layers)])


def _summary(rs, kind) -> dict:
  """Per-seed values and `stats.summary` of the headline numbers."""
  def s(values):
    values = [v for v in values if v is not None]
    return stats.summary(values) if values else None

  out = {
      "bits_per_byte": s([r["traj"]["bits_per_byte"][-1] for r in rs]),
      "bits_per_token": s([r["traj"]["bits_per_token"][-1] for r in rs]),
      "init_bits_per_byte": s([r["traj"]["bits_per_byte"][0] for r in rs]),
      "icl_final": s([r["traj"]["icl"][-1] for r in rs]),
      "icl_init": s([r["traj"]["icl"][0] for r in rs]),
      "best_prefix_matching": s([r["landmarks"]["best_prefix_matching"][-1]
                                 for r in rs]),
      "best_prefix_matching_init": s([
          r["landmarks"]["best_prefix_matching"][0] for r in rs]),
      "uniform_prefix_matching": s([r["traj"]["uniform_prefix_matching"]
                                    for r in rs]),
      # What formed instead: the best head of each other score, at the end.
      "best_previous_token": s([float(r["traj"]["previous_token"][-1].max())
                                for r in rs]),
      "best_duplicate_token": s([float(r["traj"]["duplicate_token"][-1]
                                       .max()) for r in rs]),
      "best_copying": s([float(r["traj"]["copying"][-1].max()) for r in rs]),
      "seeds_formed": sum(r["landmarks"]["formation_step"] is not None
                          for r in rs),
      "formation_step": [r["landmarks"]["formation_step"] for r in rs],
      "icl_step": [r["landmarks"]["icl_step"] for r in rs],
      "icl_minus_formation": s([r["landmarks"]["icl_minus_formation"]
                                for r in rs]),
  }
  abl = [r["ablation"] for r in rs if r["ablation"]]
  if abl:
    gain = lambda v: -v  # the ICL gain: early loss minus late loss
    kept = lambda a, v: gain(v) / gain(a["intact"])
    out["ablation"] = {
        "gain_intact": s([gain(a["intact"]) for a in abl]),
        "gain_induction_ablated": s([gain(a["induction"]) for a in abl]),
        "gain_others_ablated": s([np.mean([gain(v) for v in a["others"]])
                                  for a in abl if a["others"]]),
        "share_kept_induction": s([kept(a, a["induction"]) for a in abl]),
        "share_kept_others": s([np.mean([kept(a, v) for v in a["others"]])
                                for a in abl if a["others"]]),
        "seeds": len(abl)}
  return {kind: out}


def corpus_info(config) -> dict:
  tc = tasks.text_tokens_of(config.task)
  # Named, not located: a report says which text, not where a machine
  # keeps it.
  info = {"corpus": (f"the standard library of Python "
                     f"{platform.python_version()}"
                     if tc.bytes.name == text_corpus.STDLIB
                     else "a corpus given by path"),
          "vocab_size": tc.vocab_size}
  for split in (tc.train, tc.held_out):
    info[split.name] = {"files": len(split.documents),
                        "bytes": split.num_bytes,
                        "tokens": split.num_tokens,
                        "bytes_per_token": split.num_bytes / split.num_tokens}
  return info


def ngram_baselines(config, batch) -> dict:
  """Unigram and bigram bits per token and per byte of the training
  tokens, on the held-out windows of `batch` (seed 0's): add-one unigram;
  bigram with the unigram as a Dirichlet prior of weight one token. Each
  also has its ICL score (nats, as the models'): an n-gram model reads
  the same context at every position, so its late-minus-early difference
  is what the text itself differs by there."""
  tc = tasks.text_tokens_of(config.task)
  v = config.task.vocab_size
  uni, keys, n, prev = text_tokens.counts(tc.train, v)
  p_uni = (uni + 1.0) / (uni.sum() + v)
  x, y = (np.asarray(batch[k], np.int64) for k in ("inputs", "targets"))
  code = x * v + y
  at = np.clip(np.searchsorted(keys, code), 0, len(keys) - 1)
  pair = np.where(keys[at] == code, n[at], 0)
  p_bi = (pair + p_uni[y]) / (prev[x] + 1.0)
  tb = _token_bytes(config, "tokens")
  nbytes = float(tb[y].sum())
  out = {}
  for name, p in (("unigram", p_uni[y]), ("bigram", p_bi)):
    b = -np.log2(p)
    out[name] = {"bits_per_token": float(b.mean()),
                 "bits_per_byte": float(b.sum() / nbytes),
                 "icl": float(scores.icl_score(
                     b * scores.LN2, tuple(config.experiment.early_positions),
                     tuple(config.experiment.late_positions)).mean())}
  return out


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train (or reuse) and measure both kinds for every seed."""
  start, cpu0 = time.time(), _cpu_seconds()
  e = config.experiment
  workdir = pathlib.Path(workdir)
  info = corpus_info(config)  # trains the tokenizer first (cached)
  runs, by_kind, examples = {}, {k: [] for k in KINDS}, {}
  for seed in e.seeds:
    for kind in KINDS:
      t0 = time.time()
      r = next(runs_lib.seed_runs(config, workdir, (seed,),
                                  f"{kind}_seed{{seed}}", reuse=reuse,
                                  **kind_overrides(config, kind)))
      t1 = time.time()
      traj = trajectory(r, kind, e)
      marks = landmarks(traj, e.threshold)
      model = r.state.model()
      res = {"traj": traj, "landmarks": marks,
             "head_icl": head_icl(model, traj["batch"], e),
             "ablation": ablation(model, traj["batch"],
                                  marks["induction_heads"], e, r.seed),
             "train_s": round(t1 - t0, 1),
             "measure_s": round(time.time() - t1, 1)}
      if kind == "tokens" and seed == e.seeds[0]:
        examples["ngram"] = ngram_baselines(r.config, traj["batch"])
        examples["text"] = tasks.text_tokens_of(r.config.task).decode(
            traj["batch"]["inputs"][0][:48])
      runs[r.run_dir.name] = res
      by_kind[kind].append(res)
  summary = {}
  for kind in KINDS:
    summary.update(_summary(by_kind[kind], kind))
  return {"corpus": info, "summary": summary, "runs": runs, **examples,
          "reused": reuse, "wall_time_s": round(time.time() - start, 1),
          "cpu_time_s": round(_cpu_seconds() - cpu0, 1)}


def _cpu_seconds() -> float:
  t = os.times()
  return t.user + t.system
