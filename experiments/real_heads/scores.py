"""Every head's scores and the next-token loss, from one forward pass.

Shape letters: N inputs, B inputs of one chunk, L layers, H query heads,
T tokens, Dv head width, M measures, P scored positions.

`measure(model, ids, rows)` runs the model over `ids [N, T]` in chunks,
captures each layer's pattern and reduces it at once (a long input's
patterns are never all held), and returns every measure of `MEASURES`
per input and head, `[N, L, H]`, the loss of each next token `[N, T-1]`,
and each head's output `z` averaged over the inputs `[L, T, H, Dv]` (what
mean ablation puts in its place). Only query rows marked in `rows [T]`
count (a query at position 0 sees nothing but itself). A head's patch
(`select [L, H]` with `replacement [L, T, H, Dv]`) replaces the selected
heads' `z` with the replacement: zeros for zero ablation, the mean for
mean ablation.

The measures (each input's mean over its counted rows):

  previous   weight on the key one back
  induction  weight on the key after an earlier copy of the query's token
  duplicate  weight on earlier copies of the query's own token
  first      weight on key 0 (the sink of Gu et al. 2025)
  local      weight on keys 0..`local` back, key 0 left out
  long       weight on keys further back than `local`, key 0 left out
             (these three count only rows past position `local` + 1, that
             can reach a key past `local` other than key 0, so they
             add up to 1 on each input)
  entropy    the row's entropy in nats

Induction and duplicate count only rows that have a target.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.interp import head_metrics

MEASURES = ("previous", "induction", "duplicate", "first", "local", "long",
            "entropy")


def earlier_same(tokens):
  """`[B, T, T]` bool: key j < query i holds query i's token."""
  t = tokens.shape[-1]
  same = tokens[:, :, None] == tokens[:, None, :]
  return same & (jnp.arange(t)[None, :] < jnp.arange(t)[:, None])[None]


def layer_measures(w, tokens, rows, local: int):
  """`[M, B, H]` for one layer's weights `w [B, H, T, T]`, `tokens [B,
  T]` and the counted query rows `rows [T]`."""
  b, _, t, _ = w.shape
  rows = jnp.broadcast_to(jnp.asarray(rows, bool)[None], (b, t))
  off = head_metrics.offsets(t, t)  # [T, T] query - key
  key0 = (jnp.arange(t) == 0)[None, :]  # [1, T]
  near = (off >= 0) & (off <= local) & ~key0
  far = (off > local) & ~key0
  share = lambda target: head_metrics.target_share(w, target, rows)
  # first, local and long over the same rows, those that can reach past
  # `local`, so that the three add up to 1 on each.
  far_rows = rows & (jnp.arange(t) > local + 1)[None]
  part = lambda target: head_metrics.target_share(w, target, far_rows)
  return jnp.stack([
      share((off == 1)[None]),
      share(head_metrics.induction_targets(tokens)),
      share(earlier_same(tokens)),
      part(jnp.broadcast_to(key0, (t, t))[None]),
      part(near[None]), part(far[None]),
      head_metrics.entropy_per_example(w, rows)])


layer_measures_jit = jax.jit(layer_measures, static_argnames=("local",))


def loss_at(model, resid, targets, positions):
  """`[B, P]` loss of `targets [B, T]` at `positions [P]` from the last
  block's stream `resid [B, T, D]` (the readout is applied at those
  positions only: Gemma's 262,144-token readout over every position of a
  long input would not fit)."""
  x = resid[:, positions]
  if model.final_ln is not None:
    x = model.final_ln(x)
  logits = model.logits(x).astype(jnp.float32)  # [B, P, V]
  tgt = targets[:, positions]
  return (jax.nn.logsumexp(logits, -1)
          - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0])


def patch_heads(select, replacement, num_layers):
  """{z site: patch} replacing the heads of `select [L, H]` by
  `replacement [L, T, H, Dv]` (zeros: zero ablation)."""
  def one(l):
    def fn(z):  # [B, T, H, Dv]
      s = select[l].astype(z.dtype)[None, None, :, None]
      return z * (1 - s) + replacement[l][None].astype(z.dtype) * s
    return fn
  return {f"blocks.{l}.attn.z": one(l) for l in range(num_layers)}


@functools.partial(jax.jit, static_argnames=("graphdef", "local",
                                             "with_scores"))
def _chunk(graphdef, state, ids, rows, positions, select, replacement, *,
           local, with_scores):
  """One chunk: (`[M, B, L, H]` or None, `[B, P]` loss, `[L, T, H, Dv]`
  sum of z over the chunk)."""
  model = nnx.merge(graphdef, state)
  n = model.config.num_layers
  sites = [f"blocks.{n - 1}.resid_post"] + [f"blocks.{l}.attn.z"
                                            for l in range(n)]
  if with_scores:
    sites += [f"blocks.{l}.attn.pattern" for l in range(n)]
  _, acts = model(ids, capture=tuple(sites),
                  patch=patch_heads(select, replacement, n))
  targets = jnp.pad(ids[:, 1:], ((0, 0), (0, 1)))
  nll = loss_at(model, acts[sites[0]], targets, positions)
  z = jnp.stack([acts[f"blocks.{l}.attn.z"].sum(0) for l in range(n)])
  m = None
  if with_scores:
    m = jnp.stack([layer_measures(acts[f"blocks.{l}.attn.pattern"], ids, rows,
                                  local) for l in range(n)], 2)
  return m, nll, z


def no_patch(model, length: int):
  """`(select, replacement)` that change nothing: `[L, H]` zeros and
  `[L, T, H, Dv]` zeros."""
  c = model.config
  dv = c.head_dim or c.d_model // c.num_heads
  return (np.zeros((c.num_layers, c.num_heads), np.float32),
          np.zeros((c.num_layers, length, c.num_heads, dv), np.float32))


def measure(model, ids, rows, *, chunk: int, local: int, positions=None,
            select=None, replacement=None, with_scores: bool = True) -> dict:
  """{"scores": name -> `[N, L, H]` (with `with_scores`), "nll": `[N, P]`,
  "mean_z": `[L, T, H, Dv]`} of `model` on `ids [N, T]`, counting query
  `rows [T]` and the loss at `positions` (default: every target, T - 1),
  with the heads of `select` replaced by `replacement` (default: none)."""
  ids = np.asarray(ids, np.int32)
  n, t = ids.shape
  if n % chunk:
    raise ValueError(f"measure: the {n} inputs must split into chunks of "
                     f"`chunk`={chunk}")
  positions = np.arange(t - 1) if positions is None else np.asarray(
      positions)
  base = no_patch(model, t)
  select = base[0] if select is None else np.asarray(select, np.float32)
  replacement = base[1] if replacement is None else replacement
  graphdef, state = nnx.split(model)
  ms, nlls, z = [], [], 0.0
  for i in range(0, n, chunk):
    m, nll, zs = _chunk(graphdef, state, jnp.asarray(ids[i:i + chunk]),
                        jnp.asarray(rows), jnp.asarray(positions),
                        jnp.asarray(select), jnp.asarray(replacement),
                        local=local, with_scores=with_scores)
    if with_scores:
      ms.append(np.asarray(m))
    nlls.append(np.asarray(nll))
    z = z + np.asarray(zs)
  out = {"nll": np.concatenate(nlls), "mean_z": z / n}
  if with_scores:
    out["scores"] = dict(zip(MEASURES, np.concatenate(ms, 1)))
  return out


def uniform(ids, rows, *, local: int) -> dict:
  """The measures of uniform causal attention on `ids [N, T]`, name ->
  `[N]` (every head alike)."""
  ids = jnp.asarray(ids)
  n, t = ids.shape
  w = head_metrics.uniform_causal_weights(n, t)  # [N, 1, T, T]
  m = layer_measures_jit(w, ids, jnp.asarray(rows), local=local)  # [M,N,1]
  return dict(zip(MEASURES, np.asarray(m)[:, :, 0]))
