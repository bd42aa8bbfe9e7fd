"""Activation, path and attribution patching over the hook sites.

Shape letters: B batch, T length, L layers, H heads (K key/value heads),
D d_model, V vocabulary.

Each function runs a model on two inputs of the same shape, `clean` and
`corrupted`, and scores a patch by a `metric`: a function `logits [B, T,
V] -> scalar` (see `logprob_metric`). With m_c and m_x the metric of the
clean and the corrupted run, a patch's score is normalised so that 1 is
the whole clean-minus-corrupted difference:

  denoising (default): clean activations are patched into the corrupted
    run; score = (m - m_x) / (m_c - m_x): the share of the clean
    behaviour the patched activations restore on their own (sufficiency).
  noising (`noising=True`): corrupted activations are patched into the
    clean run; score = (m_c - m) / (m_c - m_x): the share of the clean
    behaviour lost without them (necessity).

The two differ where a behaviour needs several inputs at once (an AND):
an induction head needs both the key that says "the token before me was
X" and the value of the token after it, so restoring one alone can
restore nothing while removing it removes much (Heimersheim and Nanda
2024, "How to use and interpret activation patching").

Path patching moves one sender's change (a head's output, or the
embedding's: `EMBED`) into one input of a later layer; `joint_path_patching`
moves SETS of them in one run (keys and values together, every sender at
once, a head's paths through later heads against its direct path), so an
AND is measured rather than inferred from single paths.

`reference=(m_c, m_x)` replaces the two normalising runs (to score runs
against another pair's difference). `normalise=False` returns the raw
metric of each patched run instead, skipping them; with a metric that
returns one value per example (`per_example_logprob`), that is `[...,
B]`, for a bootstrap over examples.

Where a task's roles sit at different positions in each example,
`positions [R, B, T]` (bool, `patch_positions.at_positions`,
`patch_positions.role_masks`) patches each example at its own positions
of role r: a patch is (site, head, role). `sender_positions [B, T]`
restricts a path's sender change the same way.

Nothing here is jitted: callers jit at the outside, with the metric's
arrays as arguments. The many patches of a call run as one `jax.lax.map`
over traced selectors (which site, head, position), so a program holds
one patched forward pass, however many patches it scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import precision
from mha_jax import hooks as hooks_lib
from mha_jax.interp import patch_positions

Metric = Callable[[jax.Array], jax.Array]

def per_example_logprob(targets: jax.Array, mask: jax.Array) -> Metric:
  """`[B]`: each example's summed log-probability of `targets [B, T]`
  where `mask [B, T]` is 1 (for intervals over examples: the pooled
  `logprob_metric` is their sum over the mask's total)."""
  def metric(logits):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    hit = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(hit * mask, axis=-1)
  return metric


def logprob_metric(targets: jax.Array, mask: jax.Array) -> Metric:
  """Mean log-probability of `targets [B, T]` where `mask [B, T]` is 1:
  minus the task's loss (higher is better)."""
  per_example = per_example_logprob(targets, mask)
  return lambda logits: (jnp.sum(per_example(logits))
                         / jnp.maximum(jnp.sum(mask), 1.0))


def logit_metric(targets: jax.Array, mask: jax.Array) -> Metric:
  """Mean logit of `targets` where `mask` is 1 (linear in the logits)."""
  def metric(logits):
    hit = jnp.take_along_axis(logits.astype(jnp.float32), targets[..., None],
                              axis=-1)[..., 0]
    return jnp.sum(hit * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  return metric


def reference_metrics(model, clean, corrupted, metric):
  """`(m_c, m_x)`: the metric of the clean and of the corrupted run."""
  return metric(model(clean)), metric(model(corrupted))


def _lead(x, like):
  """`x` with leading axes to the rank of `like` (a reference `[B]`
  against scores `[..., B]`: the rank promotion, made explicit)."""
  return jnp.reshape(x, (1,) * (jnp.ndim(like) - jnp.ndim(x)) + jnp.shape(x))


def _score(m, reference, noising):
  m_clean, m_corrupt = (_lead(x, m) for x in reference)
  diff = m_clean - m_corrupt
  return jnp.where(noising, m_clean - m, m - m_corrupt) / diff


def _swap(clean, corrupted, noising):
  """`(source, target)` inputs: noising patches corrupted into clean.
  `noising` may be traced, so one compiled program serves both ways."""
  return (jnp.where(noising, corrupted, clean),
          jnp.where(noising, clean, corrupted))


def _one_hot(index, axis, shape):
  """Bool, True at `index` (traced) along `axis`, broadcastable to shape."""
  hot = jnp.arange(shape[axis]) == index
  return hot.reshape([shape[axis] if a == axis else 1
                      for a in range(len(shape))])


def _replace_at(value, sel):
  return lambda x: jnp.where(sel, value, x)


def _patch_grid(values, sites, per_position, sets):
  """Every patch of `activation_patching` as flat index arrays.

  Returns `(site, head, pos)` int arrays (one entry per patch; -1 where a
  site has no head axis or positions are not split; pos is the position
  set with `sets`, their number, not None) and, per site, its slice of
  them and the shape of its scores.
  """
  rows, layout = [], {}
  split = per_position or sets is not None
  for i, site in enumerate(sites):
    head_axis, pos_axis = hooks_lib.site_axes(site)
    heads = [-1] if head_axis is None else range(values[site].shape[head_axis])
    poss = (range(values[site].shape[pos_axis]) if per_position
            else range(sets) if sets is not None else [-1])
    start = len(rows)
    rows += [(i, h, t) for h in heads for t in poss]
    layout[site] = (slice(start, len(rows)),
                    ((len(heads),) if head_axis is not None else ())
                    + ((len(poss),) if split else ()))
  return tuple(jnp.asarray(c, jnp.int32) for c in zip(*rows)), layout


def activation_patching(model, clean, corrupted, metric: Metric,
                        sites: Sequence[str], *, per_position: bool = False,
                        positions=None, noising: bool = False,
                        reference=None, normalise: bool = True,
                        batch_size: int | None = None) -> dict:
  """Patch every head (and position) of every site in turn.

  Args:
    model: a `DecoderLM` (anything called as `model(inputs, capture=,
      patch=)` returning logits first).
    clean, corrupted: inputs of the same shape (`[B, T]` tokens).
    metric: logits -> scalar (or `[B]`, one value per example).
    sites: hook site names, e.g. `"blocks.1.attn.z"`, `"blocks.0.resid_pre"`.
    per_position: patch one query position at a time as well.
    positions: `[R, B, T]` bool, or None: patch each example at its own
      positions of set r (a role), one set at a time; not with
      `per_position`.
    noising: patch corrupted into clean (see the module docstring); a
      bool, or a traced one (both ways then share one compiled program).
    reference: `(m_c, m_x)`, or None to run both.
    normalise: False returns the raw metric of each patched run.
    batch_size: patched runs evaluated together (`jax.lax.map`); None
      runs them one after another.

  Returns:
    `{site: score}`: `[H]` for a site with heads (`[K]` for k, v with
    fewer kv heads: entry j patches kv head j, so every query head of its
    group, `hooks.query_heads(j, H, K)`), a scalar for a block site; with
    `per_position`, `[H, T]` and `[T]`; with `positions`, `[H, R]` and
    `[R]`. Score 1 = the whole clean-minus-corrupted metric. A metric
    returning an array (`[B]`) adds its axes last.

  All the patches run as ONE `jax.lax.map` over (site, head, position)
  indices: every site is patched in every run, with a selector that is
  False except at the one place patched, so the program holds a single
  patched forward pass however many sites there are.
  """
  positions = patch_positions.checked(positions, per_position, clean,
                                      "activation_patching")
  source, target = _swap(clean, corrupted, noising)
  if normalise and reference is None:
    reference = reference_metrics(model, clean, corrupted, metric)
  sites = tuple(sites)
  _, src = model(source, capture=sites)
  index, layout = _patch_grid(src, sites, per_position,
                              None if positions is None else len(positions))

  def one(idx):
    i, h, t = idx
    patch = {}
    for j, site in enumerate(sites):
      value = src[site]
      head_axis, pos_axis = hooks_lib.site_axes(site)
      sel = jnp.asarray(i == j).reshape((1,) * value.ndim)
      if head_axis is not None:
        sel = sel & _one_hot(h, head_axis, value.shape)
      if per_position:
        sel = sel & _one_hot(t, pos_axis, value.shape)
      elif positions is not None:
        sel = sel & patch_positions.on_site(positions[t], value.ndim,
                                            pos_axis)
      patch[site] = _replace_at(value, sel)
    return metric(model(target, patch=patch))

  m = jax.lax.map(one, index, batch_size=batch_size)
  if normalise:
    m = _score(m, reference, noising)
  return {site: m[part].reshape(shape + m.shape[1:]) for site, (part, shape)
          in layout.items()}


def attribution_patching(model, clean, corrupted, metric: Metric,
                         sites: Sequence[str], *, per_position: bool = False,
                         positions=None, noising: bool = False,
                         reference=None, normalise: bool = True) -> dict:
  """The first-order estimate of `activation_patching`, every patch at once.

  The metric's change when `site`'s value a_t in the target run becomes
  the source's a_s, to first order: `dm/da (at the target run) . (a_s -
  a_t)`, restricted to one head (and position) by summing the product
  over the other axes (Nanda 2023, "Attribution patching"). One forward
  and one backward pass for every site together; each site's gradient is
  the total derivative through everything after it. Exact where the
  metric is linear in the site (for example the logits in the last
  layer's `z` without a final LayerNorm). Non-finite differences (the -inf
  of masked `scores`) count as 0.

  Returns `{site: score}` with the shapes, `positions` and normalisation
  of `activation_patching`. A metric returning `[B]` gets each example's
  own estimate (`[..., B]`), from the gradient of the metrics' sum: each
  example's own gradient where examples do not interact in the model.
  """
  positions = patch_positions.checked(positions, per_position, clean,
                                      "attribution_patching")
  source, target = _swap(clean, corrupted, noising)
  if normalise and reference is None:
    reference = reference_metrics(model, clean, corrupted, metric)
  sites = tuple(sites)
  _, src = model(source, capture=sites)
  _, tgt = model(target, capture=sites)

  def m_of(eps):
    # Adding eps = 0 changes nothing; its gradient is dm/d(activation).
    patch = {s: (lambda e: lambda x: x + e)(eps[s]) for s in sites}
    m = metric(model(target, patch=patch))
    return jnp.sum(m), m

  grads, m_target = jax.grad(m_of, has_aux=True)(
      {s: jnp.zeros_like(tgt[s]) for s in sites})
  batch = jnp.shape(clean)[0]
  if jnp.shape(m_target) not in ((), (batch,)):
    raise ValueError(f"attribution_patching: `metric` must return a scalar "
                     f"or one value per example [{batch}], got shape "
                     f"{jnp.shape(m_target)}")
  per_example = jnp.ndim(m_target) == 1
  if normalise:
    m_target = jnp.where(noising, reference[0], reference[1])
  out = {}
  for site in sites:
    diff = src[site] - tgt[site]
    prod = jnp.where(jnp.isfinite(diff), grads[site] * diff, 0.0)
    head_axis, pos_axis = hooks_lib.site_axes(site)
    # The axes kept, named: heads, positions, and examples (batch first).
    keep = {} if head_axis is None else {head_axis: "h"}
    if per_position or positions is not None:
      keep[pos_axis] = "t"
    if per_example or positions is not None:
      keep[0] = "b"
    est = jnp.sum(prod, axis=tuple(a for a in range(prod.ndim)
                                   if a not in keep))
    letters = "".join(keep[a] for a in sorted(keep))
    if positions is not None:
      est = patch_positions.contract(est, letters, positions, per_example)
    else:  # in [H, T, B] order, whatever the site's ([T, H] for z)
      order = "".join(sorted(letters, key="htb".index))
      est = jnp.einsum(f"{letters}->{order}", est)
    m = _lead(m_target, est) + est
    out[site] = _score(m, reference, noising) if normalise else m
  return out


_INPUTS = ("q", "k", "v")
# Where a sender's change can go: an input of the receiver layer's heads,
# or the readout (the sender's direct path to the logits).
ROUTES = _INPUTS + ("logits",)
EMBED = "embed"  # the sender that is the token (and position) embedding


def _path_runs(model, clean, corrupted, sender_layer, receiver_layer,
               noising, at=None, fn="path_patching"):
  """What every sender -> receiver patch needs, from two captured runs.

  Returns `(target inputs, delta [B, T, H + 1, D], bases)`: delta is each
  sender head's source-minus-target output (its `result`), and last (H)
  the embedding's (`blocks.0.resid_pre`); `bases` maps the last block's
  `resid_post` (the direct path to the logits) and, when `receiver_layer`
  is not None, that layer's `resid_pre` (`[B, T, D]`) and its q, k, v to
  the target run's values. `at [B, T]` (bool, `sender_positions`):
  every sender's change at those positions of each example only.
  """
  if receiver_layer is not None and receiver_layer <= sender_layer:
    raise ValueError(f"path patching: the receiver layer ({receiver_layer})"
                     f" must come after the sender layer ({sender_layer})")
  if at is not None:
    at = patch_positions.check(at, *jnp.shape(clean)[:2], fn,
                               arg="sender_positions", sets=False)
  source, target = _swap(clean, corrupted, noising)
  result, embed = f"blocks.{sender_layer}.attn.result", "blocks.0.resid_pre"
  bases = (f"blocks.{model.config.num_layers - 1}.resid_post",)
  if receiver_layer is not None:
    bases += (f"blocks.{receiver_layer}.resid_pre",) + tuple(
        f"blocks.{receiver_layer}.attn.{x}" for x in _INPUTS)
  _, src = model(source, capture=(result, embed))
  _, tgt = model(target, capture=(result, embed) + bases)
  delta = jnp.concatenate([src[result] - tgt[result],
                           (src[embed] - tgt[embed])[:, :, None]], axis=2)
  if at is not None:
    delta = jnp.where(at[:, :, None, None], delta, 0.0)
  return target, delta, {b: tgt[b] for b in bases}


def _routed_metric(model, target, metric, delta, bases, receiver_layer,
                   routes, r):
  """Metric of the target run where sender s's change reaches route i
  (q, k, v of receiver head `r`, -1: every head of the layer; 3: the
  readout) with weight `routes[i, s]` (`routes [4, H + 1]`, 0 or 1;
  traced, like `r`). Each input is recomputed from the target run's
  residual stream plus the changes routed to it; everything else stays at
  the target run's values, and what follows the receiver runs normally."""
  patch = {}
  if receiver_layer is not None:
    base_site = f"blocks.{receiver_layer}.resid_pre"
    for i, name in enumerate(_INPUTS):
      site = f"blocks.{receiver_layer}.attn.{name}"
      moved = bases[base_site] + precision.einsum("btsd,s->btd", delta,
                                                  routes[i])

      def recomputed(moved=moved, site=site):
        # The input as it would be from the moved residual stream (its
        # LayerNorm, projection and rotary rerun by the model itself); the
        # rest of this run is thrown away.
        return model(target, patch={base_site: moved}, capture=(site,))[1][
            site]

      # Where nothing is routed to this input (one path at a time: two of
      # the three), it keeps the target run's value and that model run is
      # skipped (under `lax.map` without a batch size, only the branch
      # taken runs).
      routed = jnp.any(routes[i] != 0)
      new = jax.lax.cond(routed, recomputed, lambda site=site: bases[site])
      head_axis = hooks_lib.site_axes(site)[0]
      sel = (_one_hot(r, head_axis, new.shape) | (r < 0)) & routed
      patch[site] = _replace_at(new, sel)
  direct = precision.einsum("btsd,s->btd", delta, routes[3])
  last = f"blocks.{model.config.num_layers - 1}.resid_post"
  patch[last] = lambda x: x + direct
  return metric(model(target, patch=patch))


def route(num_heads: int, paths) -> np.ndarray:
  """The `[4, H + 1]` route matrix of `joint_path_patching` for `paths`,
  pairs `(sender, to)`: sender a head of the sender layer (0..H-1) or
  `EMBED`, `to` one of `ROUTES` ("q", "k", "v", "logits")."""
  out = np.zeros((len(ROUTES), num_heads + 1), np.float32)
  for sender, to in paths:
    if to not in ROUTES:
      raise ValueError(f"route: a path's receiver must be one of {ROUTES}, "
                       f"got {to!r}")
    if sender == EMBED:
      s = num_heads
    elif isinstance(sender, (int, np.integer)) and 0 <= sender < num_heads:
      s = int(sender)
    else:
      raise ValueError(f"route: a path's sender must be a head in [0, "
                       f"{num_heads}) or {EMBED!r}, got {sender!r}")
    out[ROUTES.index(to), s] = 1.0
  return out


def joint_path_patching(model, clean, corrupted, metric: Metric, routes, *,
                        sender_layer: int, receiver_layer: int,
                        noising: bool = False, reference=None,
                        normalise: bool = True, sender_positions=None,
                        batch_size: int | None = None) -> jax.Array:
  """Sets of paths patched together, one set per row of `routes`.

  `routes [N, 4, H + 1]` (`route` builds one row): row n sends the change
  of every sender s (the heads of `sender_layer`, then the embedding) to
  every route i (q, k, v of all heads of `receiver_layer`, then the
  readout) where `routes[n, i, s]` is 1, all in one patched run. So keys
  and values restored together test an AND that one path at a time
  cannot, and a head's paths through the receivers (q, k, v) can be set
  beside its direct path (the readout). Routing one head to all four is
  patching that head's whole output when the receiver is the last layer;
  routing every sender to all four is patching the receiver layer's
  `resid_pre`.

  `sender_positions [B, T]` (bool): the senders' changes at those
  positions of each example only (elsewhere their target-run values).

  Returns `[N]` scores (module docstring), or with `normalise=False` the
  raw metric of each patched run (`[N, ...]`: the metric may return an
  array, per example say).
  """
  if reference is None and normalise:
    reference = reference_metrics(model, clean, corrupted, metric)
  routes = jnp.asarray(routes, jnp.float32)
  n_s = model.config.num_heads + 1
  if routes.ndim != 3 or routes.shape[1:] != (len(ROUTES), n_s):
    raise ValueError(f"joint_path_patching: `routes` must be [N, "
                     f"{len(ROUTES)}, {n_s}] (routes, heads + embedding), "
                     f"got shape {routes.shape}")
  target, delta, bases = _path_runs(model, clean, corrupted, sender_layer,
                                    receiver_layer, noising, sender_positions,
                                    "joint_path_patching")
  m = jax.lax.map(lambda w: _routed_metric(model, target, metric, delta,
                                           bases, receiver_layer, w, -1),
                  routes, batch_size=batch_size)
  return _score(m, reference, noising) if normalise else m


def _sender_index(sender, num_heads):
  """A sender `(layer, head)` or `(EMBED,)` as (sender layer, index).

  The index selects a column of `delta [B, T, H + 1, D]` by a scatter,
  which would drop one past the end (patching nothing) and read head H
  as the embedding: so it is checked here."""
  if sender[0] == EMBED:
    return 0, num_heads
  if (len(sender) != 2 or not isinstance(sender[1], (int, np.integer))
      or not 0 <= sender[1] < num_heads):
    raise ValueError(f"path_patching: `sender` must be (layer, head) with a "
                     f"query head in [0, {num_heads}), or ({EMBED!r},); got "
                     f"{sender!r}")
  return sender[0], int(sender[1])


def _check_receiver_head(receiver, num_heads, num_kv_heads):
  """A receiver head in range for its input: a query head for q, a kv
  head for k and v (they have K), or -1 for all. Out of range, the
  one-hot selector would be all False and patch nothing, silently."""
  _, head, name = receiver
  n = num_heads if name == "q" else num_kv_heads
  if isinstance(head, (int, np.integer)) and -1 <= head < n:
    return
  what = "query head" if name == "q" else "kv head"
  note = ""
  if name != "q" and num_kv_heads != num_heads:
    note = (f" ({name} has K={num_kv_heads} kv heads for H={num_heads} "
            f"query heads: query head h reads kv head h // "
            f"{num_heads // num_kv_heads}, `hooks.kv_head(h, {num_heads}, "
            f"{num_kv_heads})`, and the path then reaches its whole group)")
  raise ValueError(f"path_patching: the head of `receiver`={receiver!r} must "
                   f"be a {what} in [0, {n}) or -1 (every head), got "
                   f"{head!r}{note}")


def path_patching(model, clean, corrupted, metric: Metric, *,
                  sender: tuple, receiver: tuple, noising: bool = False,
                  reference=None, sender_positions=None) -> jax.Array:
  """One path: sender head -> one input of one receiver head.

  `sender = (layer, head)`, or `("embed",)` for the embedding's direct
  path; `receiver = (layer, head, input)` with input "q", "k" or "v" (for
  k and v, `head` is the kv head, as on the `k`/`v` sites: under GQA the
  path then reaches every query head of its group, `hooks.query_heads`;
  one out of range fails saying so; -1: every head of the layer at once),
  or `("logits",)` for the sender's direct path to the readout. The
  sender's source output reaches only that input: the receiver's input is
  recomputed from the target run's residual stream plus the sender's
  change, while every other head, and the sender's effect on any layer in
  between, stay at the target run's values; everything downstream of the
  receiver then runs normally; `sender_positions [B, T]` (bool) keeps
  the sender's change at those positions of each example only. Returns
  the scalar score (denoising or noising, as in the module docstring).
  """
  direct = receiver[0] == "logits"
  if not direct and (len(receiver) != 3 or receiver[2] not in _INPUTS):
    raise ValueError(f"path_patching: `receiver` must be (layer, head, 'q' "
                     f"| 'k' | 'v') or ('logits',), got {receiver!r}")
  c = model.config
  layer, s = _sender_index(sender, c.num_heads)
  if not direct:
    _check_receiver_head(receiver, c.num_heads, c.num_kv_heads or c.num_heads)
    if receiver[0] <= layer:
      raise ValueError(f"path patching: the receiver layer ({receiver[0]})"
                       f" must come after the sender layer ({layer})")
  if reference is None:
    reference = reference_metrics(model, clean, corrupted, metric)
  target, delta, bases = _path_runs(model, clean, corrupted, layer,
                                    None if direct else receiver[0], noising,
                                    sender_positions)
  w = jnp.zeros((len(ROUTES), delta.shape[2])).at[
      ROUTES.index("logits" if direct else receiver[2]), s].set(1.0)
  m = _routed_metric(model, target, metric, delta, bases,
                     None if direct else receiver[0], w,
                     -1 if direct else receiver[1])
  return _score(m, reference, noising)


def path_patching_grid(model, clean, corrupted, metric: Metric, *,
                       sender_layer: int, receiver_layer: int,
                       noising: bool = False, reference=None,
                       sender_positions=None,
                       batch_size: int | None = None) -> dict:
  """`path_patching` from every head of one layer, and from the
  embedding, into every head and input of a later layer, plus each
  sender's direct path to the logits.

  Returns `{"q": [Hs, Hr], "k": [Hs, K], "v": [Hs, K], "logits": [Hs]}`
  (rows: sender heads; columns: receiver heads, kv heads for k and v) and
  `{"q_all", "k_all", "v_all"}`, each `[Hs]`: the sender's change reaching
  that input of EVERY receiver head at once (where receivers back each
  other up, one at a time understates the path); the same for the
  embedding as a sender under `embed_<key>` (`[Hr]`, `[K]` or scalars).
  One `jax.lax.map` runs every path; `sender_positions` as in
  `path_patching`.
  """
  if reference is None:
    reference = reference_metrics(model, clean, corrupted, metric)
  target, delta, bases = _path_runs(model, clean, corrupted, sender_layer,
                                    receiver_layer, noising, sender_positions,
                                    "path_patching_grid")
  n_s = delta.shape[2]  # the heads, then the embedding
  n_q = model.config.num_heads
  n_kv = model.config.num_kv_heads or n_q
  # Every (route, sender, receiver or -1 for all) triple, as flat indices;
  # the readout (route 3) has no receiver head.
  triples = [(i, s, r) for i, n in enumerate((n_q, n_kv, n_kv, 0))
             for s in range(n_s) for r in list(range(n)) + [-1]]
  which, s, r = (jnp.asarray(x) for x in zip(*triples))

  def one(a):
    w = jnp.zeros((len(ROUTES), n_s)).at[a[0], a[1]].set(1.0)
    return _routed_metric(model, target, metric, delta, bases,
                          receiver_layer, w, a[2])

  score = _score(jax.lax.map(one, (which, s, r), batch_size=batch_size),
                 reference, noising)
  out, start = {}, 0
  for name, n in zip(ROUTES, (n_q, n_kv, n_kv, 0)):
    block = score[start:start + n_s * (n + 1)].reshape(n_s, n + 1)
    if name == "logits":
      out[name], out["embed_logits"] = block[:-1, 0], block[-1, 0]
    else:
      out[name], out[f"{name}_all"] = block[:-1, :n], block[:-1, n]
      out[f"embed_{name}"], out[f"embed_{name}_all"] = (block[-1, :n],
                                                        block[-1, n])
    start += n_s * (n + 1)
  return out
