"""The float64 reference of the user rules: a rule applied to the whole
score matrix of one (batch, head) at a time in NumPy, differentiated by
hand. Independent of every path under test (no JAX in the arithmetic);
the kernels' tests (test_score_mod.py, test_span_walk.py,
test_pallas_gpu.py) compare against it. A helper, not a test module."""

import math

import jax.numpy as jnp
import numpy as np

from mha_jax.core import score_rules


def reference(q, k, v, w, rule):
  """float64 out and the gradients of sum(out * w) to q, k, v and to the
  score_mod output (`dmod [B, H, Tq, Tk]`, for a table's gradient), one
  (batch, head) at a time. `rule`: a `Rule` (NumPy side)."""
  q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
  b_n, tq, h_n, dh = q.shape
  tk, kh = k.shape[1], k.shape[2]
  scale = 1 / math.sqrt(dh)
  out, dq = np.zeros((b_n, tq, h_n, v.shape[-1])), np.zeros_like(q)
  dk, dv = np.zeros_like(k), np.zeros_like(v)
  dmod = np.zeros((b_n, h_n, tq, tk))
  qi = (tk - tq + np.arange(tq))[:, None]
  ki = np.arange(tk)[None, :]
  for b in range(b_n):
    for h in range(h_n):
      g = h // (h_n // kh)
      s0 = scale * q[b, :, h] @ k[b, :, g].T  # [Tq, Tk]
      s = rule.score_np(s0, b, h, qi, ki)
      ok = np.broadcast_to(rule.mask_np(b, h, qi, ki), s.shape)
      sink = -np.inf if rule.sinks is None else float(rule.sinks[h])
      top = np.maximum(np.max(np.where(ok, s, -np.inf), -1, keepdims=True),
                       sink)
      top = np.where(np.isfinite(top), top, 0.0)
      e = np.where(ok, np.exp(np.where(ok, s, 0.0) - top), 0.0)
      total = e.sum(-1, keepdims=True) + np.exp(sink - top)
      p = e / np.where(total > 0, total, 1.0)
      out[b, :, h] = p @ v[b, :, g]
      dp = w[b, :, h] @ v[b, :, g].T
      dv[b, :, g] += p.T @ w[b, :, h]
      ds = p * (dp - np.sum(p * dp, -1, keepdims=True))
      dmod[b, h] = ds
      ds0 = ds * rule.dscore_np(s0, b, h, qi, ki)
      dq[b, :, h] = scale * ds0 @ k[b, :, g]
      dk[b, :, g] += scale * ds0.T @ q[b, :, h]
  return out, dq, dk, dv, dmod


class Rule:
  """One rule twice: jnp for the library (`rules(table)`), NumPy for the
  reference (`score_np`, its derivative `dscore_np`, `mask_np`)."""

  def __init__(self, name, b, h, tk, rng):
    self.name, self.table, self.sinks = name, None, None
    self.score_np = lambda s, *_: s
    self.dscore_np = lambda s, *_: np.ones_like(s)
    self.mask_np = lambda b, h, qi, ki: np.ones(np.broadcast(qi, ki).shape,
                                                bool)
    self.score_mod = self.mask_mod = None
    if name == "relative_bias":  # a learned per-head table
      self.table = rng.normal(size=(h, 2 * tk - 1)).astype(np.float32)
      self.score_np = lambda s, b, h, qi, ki: s + self.table_np[
          h, qi - ki + tk - 1]
      self.score_mod = lambda table: (
          lambda s, b, h, qi, ki: s + table[h, qi - ki + tk - 1])
    elif name == "documents":  # packed documents, causal inside each
      docs = np.sort(rng.integers(0, 3, size=(b, tk)), axis=1)
      self.mask_np = lambda b, h, qi, ki: (docs[b][qi] == docs[b][ki]) & (
          ki <= qi)
      ids = jnp.asarray(docs)
      self.mask_mod = lambda b, h, qi, ki: (ids[b, qi] == ids[b, ki]) & (
          ki <= qi)
    elif name == "prefix_lm":  # the first n keys seen by all, causal after
      n = int(rng.integers(1, tk + 1))
      self.mask_np = lambda b, h, qi, ki: (ki <= qi) | (ki < n)
      self.mask_mod = lambda b, h, qi, ki: (ki <= qi) | (ki < n)
    elif name == "soft_cap":  # tanh soft-capping, c = 2
      self.score_np = lambda s, *_: 2.0 * np.tanh(s / 2.0)
      self.dscore_np = lambda s, *_: 1.0 - np.tanh(s / 2.0) ** 2
      self.score_mod = lambda table: (
          lambda s, b, h, qi, ki: 2.0 * jnp.tanh(s / 2.0))
    elif name == "window_sinks":  # causal window of 3, 1 sink token, and
      # the project's per-head sink logits (a built-in rule) beside it
      self.sinks = rng.normal(size=(h,)).astype(np.float32)
      self.mask_np = lambda b, h, qi, ki: ((ki <= qi) & (qi - ki < 3)) | (
          ki < 1)
      self.mask_mod = lambda b, h, qi, ki: ((ki <= qi) & (qi - ki < 3)) | (
          ki < 1)
    elif name == "empty_rows":  # odd query positions see nothing
      self.mask_np = lambda b, h, qi, ki: np.broadcast_to(
          qi % 2 == 0, np.broadcast(qi, ki).shape)
      self.mask_mod = lambda b, h, qi, ki: qi % 2 == 0

  @property
  def table_np(self):
    return self.table.astype(np.float64)

  def rules(self, table):
    return score_rules.ScoreRules(
        score_mod=None if self.score_mod is None else self.score_mod(table),
        mask_mod=self.mask_mod,
        sinks=None if self.sinks is None else jnp.asarray(self.sinks))
