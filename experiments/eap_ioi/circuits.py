"""The pieces of the EAP experiment that are not model runs: the seeded
split of the prompts, the hand-built circuit as an edge mask, random
circuits, the heads ranked by their edges' scores, and the faithfulness
curve with bootstrap intervals from per-prompt metrics.

Shape letters: S senders, R receivers, N prompts, K circuit sizes, M
circuits, B bootstrap resamples.
"""

from __future__ import annotations

import numpy as np

from experiments.ioi_task import circuit as circuit_lib
from mha_jax import hooks as hooks_lib
from mha_jax.interp import eap_graph
from mha_jax.measure import bootstrap


def split(n: int, score: int, held_out: int, seed: int):
  """`(score_idx, held_out_idx)`: disjoint prompt indices, the first
  `score` and the next `held_out` of `np.random.default_rng(seed)`'s
  permutation of `range(n)`."""
  if score < 2 or held_out < 2 or score + held_out > n:
    raise ValueError(f"split: `score` and `held_out` must each be >= 2 and "
                     f"together at most the {n} prompts, got {score} and "
                     f"{held_out}")
  order = np.random.default_rng(seed).permutation(n)
  return np.sort(order[:score]), np.sort(order[score:score + held_out])


def hand_built_heads(circuit: dict) -> list[list[int]]:
  """`[[layer, head], ...]` sorted: every head the IOI experiment's
  circuit (one model's entry of its results.json "circuits") names: its
  output heads, the heads whose direct path lowers the difference, and
  the senders each path-patching round separated."""
  return [list(h) for h in circuit_lib.union(circuit_lib.classes(circuit))]


def _receiver_nodes(graph: eap_graph.Graph, num_heads: int):
  """Per receiver column, the query heads it serves as `(layer, head)`
  pairs (a k/v receiver serves its group), or its name for an MLP or the
  logits."""
  nodes = [None] * len(graph.receivers)
  for g in graph.groups:
    for i in range(g.size):
      col = g.start + i
      if g.kind == "q":
        nodes[col] = {(g.layer, i)}
      elif g.kind in ("k", "v"):
        per = num_heads // g.size  # query heads per kv head
        nodes[col] = {(g.layer, h) for h in range(i * per, (i + 1) * per)}
      else:
        nodes[col] = graph.receivers[col]
  return nodes


def head_mask(graph: eap_graph.Graph, heads, num_heads: int) -> np.ndarray:
  """`[S, R]` bool: the circuit of `heads` (`[[layer, head], ...]`) with
  the embedding, every MLP and the logits: every edge whose sender is the
  embedding, an MLP or one of `heads`, into an MLP, the logits, or the
  q of one of `heads` or the k/v of a kv head serving one of them."""
  wanted = {tuple(h) for h in heads}
  names = {hooks_lib.head_name(l, h) for l, h in wanted}
  send = np.array([s == eap_graph.EMBED or s.startswith("MLP") or s in names
                   for s in graph.senders])
  recv = np.array([isinstance(n, str) or bool(n & wanted)
                   for n in _receiver_nodes(graph, num_heads)])
  return send[:, None] & recv[None, :] & graph.exists


def random_masks(graph: eap_graph.Graph, counts, draws: int, seed: int
                 ) -> np.ndarray:
  """`[len(counts), draws, S, R]` bool: for each size k, `draws` circuits
  of k edges drawn uniformly without replacement from the graph's edges
  (`np.random.default_rng(seed)`)."""
  s, r = np.nonzero(graph.exists)
  rng = np.random.default_rng(seed)
  out = np.zeros((len(counts), draws) + graph.shape, bool)
  for i, k in enumerate(counts):
    for d in range(draws):
      pick = rng.choice(len(s), size=int(k), replace=False)
      out[i, d, s[pick], r[pick]] = True
  return out


def ranked_heads(scores: eap_graph.EdgeScores) -> list[tuple[str, float]]:
  """`(head name, sum of |score| over the edges it sends)`, largest
  first: how much of the metric's estimated change runs out of each
  head (ties in the graph's order)."""
  values = np.abs(np.asarray(scores.scores)) * scores.exists
  totals = [(name, float(values[i].sum()))
            for i, name in enumerate(scores.senders)
            if name != eap_graph.EMBED and not name.startswith("MLP")]
  order = np.argsort([-t for _, t in totals], kind="stable")
  return [totals[i] for i in order]


def overlap(ranked: list, hand: list, k: int) -> dict:
  """Which of the hand-built `hand` heads (`[[l, h], ...]`) are among the
  first `k` of `ranked` (`ranked_heads`), with every hand-built head's
  rank (1 = first)."""
  names = [hooks_lib.head_name(l, h) for l, h in hand]
  rank = {n: i + 1 for i, (n, _) in enumerate(ranked)}
  top = {n for n, _ in ranked[:k]}
  return {"k": int(k), "found": [n for n in names if n in top],
          "missing": [n for n in names if n not in top],
          "ranks": {n: rank[n] for n in names}}


def faithfulness(m, m_empty, m_clean, idx) -> dict:
  """`{"value" [M], "ci95" [M, 2], "samples" [B, M]}`: the faithfulness
  (M_c - M_0) / (M_clean - M_0) of each circuit's per-prompt metric `m
  [M, N]`, on means over prompts (a per-prompt ratio would divide by
  small differences), with the ablated run's `m_empty` and the clean
  run's `m_clean [N]`; every resample (`idx [B, N]`) draws the same
  prompts for all circuits, so differences between them are paired."""
  m = np.asarray(m, np.float64)
  ratio = lambda mk, m0, mc: (mk - m0[..., None]) / (mc - m0)[..., None]
  samples = ratio(bootstrap.resampled_means(m.T, idx),
                  bootstrap.resampled_means(m_empty, idx),
                  bootstrap.resampled_means(m_clean, idx))
  value = ratio(m.mean(1), np.mean(m_empty), np.mean(m_clean))
  return {"value": value, "ci95": bootstrap.interval(samples),
          "samples": samples}


def curve(m_k, m_empty, m_clean, fractions, idx) -> dict:
  """The faithfulness curve of circuits of increasing size, with
  bootstrap intervals over prompts.

  `m_k [K, N]`: each circuit's per-prompt metric at `fractions [K]` of
  the edges (strictly inside (0, 1), increasing); `m_empty`, `m_clean
  [N]` and `idx [B, N]` as `faithfulness`. Faithfulness is 0 at fraction
  0 and 1 at 1 by definition; CPR is the area under it over [0, 1], CMD
  the area under |1 - faithfulness| (trapezoids), as
  `eap.faithfulness_curve` computes them. Returns `x` (the fractions
  with 0 and 1), `faithfulness [K]`, `cpr`, `cmd`, each with `_ci95`,
  and the per-prompt metrics `per_prompt [K, N]`."""
  fr = np.asarray(fractions, np.float64)
  if np.any(fr <= 0) or np.any(fr >= 1) or np.any(np.diff(fr) <= 0):
    raise ValueError(f"curve: `fractions` must increase strictly inside "
                     f"(0, 1), got {fr.tolist()}")
  x = np.concatenate([[0.0], fr, [1.0]])
  f = faithfulness(m_k, m_empty, m_clean, idx)

  def areas(faith):  # [..., K] -> CPR [...], CMD [...]
    ones = np.ones(faith.shape[:-1] + (1,))
    full = np.concatenate([0 * ones, faith, ones], -1)
    return np.trapezoid(full, x), np.trapezoid(np.abs(1 - full), x)

  cpr, cmd = areas(f["value"])
  cpr_s, cmd_s = areas(f["samples"])
  return {"x": x, "faithfulness": f["value"], "faithfulness_ci95": f["ci95"],
          "cpr": float(cpr), "cpr_ci95": bootstrap.interval(cpr_s),
          "cmd": float(cmd), "cmd_ci95": bootstrap.interval(cmd_s),
          "per_prompt": np.asarray(m_k)}
