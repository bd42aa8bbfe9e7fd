"""Finding induction features: on random tokens repeated, a feature that
fires on the second copy, reads the induction heads, and reads them at
the token after the earlier copy.

Shape letters: N inputs, T tokens, H heads, Dv per-head width, D = H *
Dv, F features.

On `[BOS?, x_1..x_n, x_1..x_n]` the query at second-copy position q finds
its token's earlier copy n positions back and an induction head attends
to the token after it, source q - n + 1. For each feature, over the
second-copy positions where it fires, the DFA (attribution.py) sums the
pre-activation's token-dependent part by head and at that one source:

  second/first: mean activation on the second copy over the first;
  rate:         share of second-copy tokens it fires on;
  head share:   the induction heads' part of its DFA there;
  source share: the part coming from source q - n + 1.

A feature is an induction feature when all four pass the config's
thresholds; a "copying" feature passes all but the first (it reads the
induction heads at the induction source on the second copy, but fires as
much on the first copy, where the same heads read something else).
`reconstruction` then asks how much of the induction heads'
output (their block of z, second-copy positions) the induction features
alone reconstruct, beside the whole SAE and random feature sets of the
same size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.sae import attribution
from mha_jax.sae import buffer
from mha_jax.sae import sae as sae_lib


def layout(tokens_len: int, n: int) -> tuple[np.ndarray, np.ndarray,
                                              np.ndarray]:
  """`(first [T], second [T] bool, source [T] int)` of a repeated input of
  `tokens_len` = 2n (+1 with BOS) tokens: the copies' positions and each
  second-copy query's induction source (-1 elsewhere)."""
  off = tokens_len - 2 * n
  t = np.arange(tokens_len)
  first = (t >= off) & (t < off + n)
  second = t >= off + n
  return first, second, np.where(second, t - n + 1, -1)


def _sums(params, z, pattern, v, source, second, ind_mask, *, kind, k,
          scale):
  """Per feature, summed over this chunk: activation on each copy,
  firing count on the second, and the DFA parts over firing second-copy
  positions (all heads, induction heads, the induction source)."""
  f = sae_lib.encode(params, buffer.flatten_site(z) * scale, kind=kind, k=k)
  f = f.reshape(z.shape[0], z.shape[1], -1)  # [N, T, F]
  by_head = attribution.dfa_by_head(params, z, scale=scale)  # [N, T, H, F]
  at_src = attribution.dfa_at_source(params, pattern, v, source,
                                     scale=scale).sum(2)  # [N, T, F]
  fires = (f > 0) & second[None, :, None]
  w = fires.astype(jnp.float32)
  return {"act_second": jnp.sum(f * second[None, :, None], (0, 1)),
          "fires_second": jnp.sum(w, (0, 1)),
          "dfa_all": jnp.sum(by_head.sum(2) * w, (0, 1)),
          "dfa_ind": jnp.sum(jnp.einsum("nthf,h->ntf", by_head, ind_mask)
                             * w, (0, 1)),
          "dfa_src": jnp.sum(at_src * w, (0, 1))}


def detect(params, captured, layer: int, n: int, ind_heads, e, *, kind, k,
           scale, chunk: int = 4) -> dict:
  """The induction features of an SAE on the repeated inputs whose
  captured `z`, `pattern`, `v` of `layer` are in `captured` ([N, ...])."""
  z, pattern, v = (captured[f"blocks.{layer}.attn.{s}"]
                   for s in ("z", "pattern", "v"))
  num_heads = z.shape[2]
  first, second, source = layout(z.shape[1], n)
  ind_mask = jnp.zeros(num_heads).at[jnp.asarray(ind_heads, int)].set(1.0)
  fn = jax.jit(lambda p, z, pa, v: _sums(
      p, z, pa, v, jnp.asarray(source), jnp.asarray(second), ind_mask,
      kind=kind, k=k, scale=scale))
  total = None
  for a in range(0, z.shape[0], chunk):
    part = fn(params, z[a:a + chunk], pattern[a:a + chunk], v[a:a + chunk])
    total = part if total is None else jax.tree.map(jnp.add, total, part)
  s = jax.tree.map(np.asarray, total)
  f_first = np.asarray(sae_lib.encode(params, buffer.flatten_site(
      z[:, first]) * scale, kind=kind, k=k)).reshape(-1, s["act_second"].size)
  positions = z.shape[0] * second.sum()
  mean_second = s["act_second"] / positions
  safe = np.where(s["dfa_all"] > 0, s["dfa_all"], np.inf)
  stats = {"second_rate": s["fires_second"] / positions,
           "mean_second": mean_second, "mean_first": f_first.mean(0),
           "head_share": s["dfa_ind"] / safe,
           "source_share": s["dfa_src"] / safe}
  found, reads = classify(stats, **thresholds(e))
  return {"features": [int(i) for i in np.flatnonzero(found)],
          "copying": [int(i) for i in np.flatnonzero(reads)], **stats}


THRESHOLDS = ("second_rate", "second_ratio", "head_share", "source_share")


def thresholds(e) -> dict:
  """The criterion's four thresholds from the experiment config."""
  return {name: float(getattr(e, name)) for name in THRESHOLDS}


def classify(stats, *, second_rate: float, second_ratio: float,
             head_share: float, source_share: float):
  """`(induction [F] bool, copying [F] bool)` from `detect`'s per-feature
  statistics: copying passes the rate, head and source thresholds,
  induction passes those and the second/first ratio too."""
  reads = ((stats["mean_second"] > 0)
           & (stats["second_rate"] >= second_rate)
           & (stats["head_share"] >= head_share)
           & (stats["source_share"] >= source_share))
  found = reads & (stats["mean_second"]
                   >= second_ratio * stats["mean_first"])
  return found, reads


def sweep(stats, base: dict, grid: dict) -> list:
  """The counts of induction and copying features with one threshold
  varied at a time, the others at `base` (`thresholds`). `grid` maps
  "second_rate", "second_ratio" or "dfa_share" (head and source share
  together, the two DFA thresholds) to the values tried. One row per
  value: {"threshold", "value", "induction", "copying"}."""
  rows = []
  for name, values in grid.items():
    names = ("head_share", "source_share") if name == "dfa_share" else (name,)
    if not set(names) <= set(THRESHOLDS):
      raise ValueError(f"sweep: `grid` key {name!r}: expected one of "
                       f"{THRESHOLDS[:2] + ('dfa_share',)}")
    for v in values:
      found, reads = classify(stats, **{**base, **{n: float(v)
                                                  for n in names}})
      rows.append({"threshold": name, "value": float(v),
                   "induction": int(found.sum()), "copying": int(reads.sum())})
  return rows


def reconstruction(params, z, n: int, ind_heads, features, *, kind, k,
                   scale, draws: int, seed: int) -> dict:
  """Explained variance of the induction heads' block of z (second-copy
  positions) by: the induction features alone, the whole SAE, and
  `draws` random sets of as many features among those firing there
  (each draw's, and their mean)."""
  if not ind_heads:  # no induction head: nothing to reconstruct
    return {"induction_features": None, "all_features": None, "random": [],
            "random_mean": None, "none": None, "count": len(features)}
  _, second, _ = layout(z.shape[1], n)
  dv = z.shape[3]
  x = buffer.flatten_site(z[:, second]) * scale  # [M, D]
  f = np.asarray(sae_lib.encode(params, x, kind=kind, k=k))
  cols = np.concatenate([np.arange(h * dv, (h + 1) * dv) for h in ind_heads])
  x_i = np.asarray(x)[:, cols]
  denom = np.sum((x_i - x_i.mean(0)) ** 2)

  w_dec = np.asarray(params["w_dec"])[:, cols]  # [F, D_i]
  b_dec = np.asarray(params["b_dec"])[cols]

  def ev(keep):
    # The decoder restricted to the kept features and the heads' columns:
    # the other features' zeros and columns add nothing to x_hat there.
    keep = np.asarray(sorted(keep), int)
    x_hat = f[:, keep] @ w_dec[keep] + b_dec
    return float(1 - np.sum((x_i - x_hat) ** 2) / denom)

  live = np.flatnonzero((f > 0).any(0))
  rng = np.random.default_rng(seed)
  m = len(features)
  random = ([ev(rng.choice(live, m, replace=False)) for _ in range(draws)]
            if 0 < m <= len(live) else [])
  return {"induction_features": ev(features) if m else 0.0,
          "all_features": ev(range(f.shape[1])), "random": random,
          "random_mean": float(np.mean(random)) if random else None,
          "none": ev([]), "count": m}


def matched_directions(w_enc, features, num_heads: int, draws: int,
                       seed: int) -> np.ndarray:
  """`[M, draws, D]`: for each of the M `features`, `draws` random
  encoder columns with the same norm on every head's block of
  `w_enc [D, F]` as the feature's own (uniform directions within each
  block). They read the same heads as much as the feature does; what
  they read there is chance."""
  w = np.asarray(w_enc, np.float64)[:, np.asarray(features, int)]  # [D, M]
  d, m = w.shape
  norms = np.linalg.norm(w.T.reshape(m, num_heads, d // num_heads), axis=-1)
  g = np.random.default_rng(seed).normal(
      size=(m, draws, num_heads, d // num_heads))
  g /= np.linalg.norm(g, axis=-1, keepdims=True)
  return (g * norms[:, None, :, None]).reshape(m, draws, d)


def second_copy_excess(params, x, first, second, columns, bias):
  """`[K]`: mean ReLU(pre-activation) on the second copy minus that on
  the first, of encoder `columns [D, K]` with `bias [K]` on the SAE's
  inputs `x [N, T, D]` (b_dec removed first, as the encoder does)."""
  pre = (jnp.einsum("ntd,dk->ntk", x - params["b_dec"][None, None],
                    columns) + bias[None, None])
  act = jax.nn.relu(pre)
  return (jnp.mean(act[:, second], (0, 1)) - jnp.mean(act[:, first], (0, 1)))


def matched_null(params, z, n: int, features, *, draws: int, seed: int,
                 scale: float, alpha: float, chunk: int = 8192) -> dict:
  """Whether each of `features` reads what the layer writes on the second
  copy more than directions reading the same heads by chance: its
  second-copy excess (`second_copy_excess`, from the ReLU of its
  pre-activation, TopK's competition left out on both sides) against
  `draws` `matched_directions` with its bias; `p = (1 + #draws at or
  above) / (1 + draws)`. A random dictionary's features are such
  directions, so about `alpha` of all of them get p <= alpha (not of a
  subset chosen by what they read, as the criterion's copying features
  are); "selective" counts the features that do. `z [N, T, H, Dv]`:
  repeated inputs (`layout`)."""
  m = len(features)
  if not m:
    return {"draws": draws, "alpha": alpha, "p": [], "excess": [],
            "null_mean": [], "selective": 0}
  first, second, _ = layout(z.shape[1], n)
  x = buffer.flatten_site(z).reshape(*z.shape[:2], -1) * scale  # [N, T, D]
  feats = np.asarray(features, int)
  dirs = matched_directions(params["w_enc"], feats, z.shape[2], draws, seed)
  cols = np.concatenate([np.asarray(params["w_enc"])[:, feats].T[:, None],
                         dirs], 1).reshape(m * (draws + 1), -1).T
  bias = np.repeat(np.asarray(params["b_enc"])[feats], draws + 1)
  # The masks are static (numpy); params and x are arguments, not
  # constants XLA would fold into the program.
  fn = jax.jit(lambda p, x, c, b: second_copy_excess(p, x, first, second,
                                                     c, b))
  excess = np.concatenate([
      np.asarray(fn(params, x, jnp.asarray(cols[:, a:a + chunk],
                                           jnp.float32),
                    jnp.asarray(bias[a:a + chunk], jnp.float32)))
      for a in range(0, cols.shape[1], chunk)]).reshape(m, draws + 1)
  own, null = excess[:, 0], excess[:, 1:]
  p = (1 + np.sum(null >= own[:, None], 1)) / (1 + draws)
  return {"draws": draws, "alpha": alpha, "p": [float(v) for v in p],
          "excess": [float(v) for v in own],
          "null_mean": [float(v) for v in null.mean(1)],
          "selective": int(np.sum(p <= alpha))}
