"""A user's own attention rule, FlexAttention's two functions, on a grid.

Shape letters: B batch, H query heads, Tq query length, Tk key length.

    score_mod(score, b, h, q_idx, kv_idx) -> score     changes one score
    mask_mod(b, h, q_idx, kv_idx) -> bool               True = may attend

A rule is written for one score and traced on scalars; `elementwise`
maps it over every element of the score grid. `score_rules.scores` and
`score_rules.allowed` call `user_scores` and the mask rule here on every
path (docs/score_rules.md); `score_rules.check` calls `check_user`.
The names here are importable from `score_rules` too, where callers
find them.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from mha_jax.core import masks


def fail(fn, exc, message):
  """Raise `exc` as `"fn: message"`, the form of every rule error."""
  raise exc(f"{fn}: {message}")


_SIGNATURES = {"score_mod": "score_mod(score, b, h, q_idx, kv_idx) -> score",
               "mask_mod": "mask_mod(b, h, q_idx, kv_idx) -> bool"}


def check_user(rules, fn: str = "attend") -> None:
  """Trace each user rule of `rules` (a `score_rules.ScoreRules`) once on
  scalars (float32 score, int32 indices, nothing computed) and check that
  it gives one float score / one bool: a wrong signature or output fails
  here, naming the rule, not deep in a kernel."""
  scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)
  for name, signature in _SIGNATURES.items():
    rule = getattr(rules, name)
    if rule is None:
      continue
    if not callable(rule):
      fail(fn, TypeError, f"`{name}` must be a function {signature}, got "
           f"{type(rule).__name__}")
    args = [scalar(jnp.int32)] * 4
    if name == "score_mod":
      args = [scalar(jnp.float32)] + args
    try:
      out = jax.eval_shape(rule, *args)
    except Exception as e:  # the user's code: say which rule and how
      fail(fn, TypeError, f"`{name}` must be a function {signature}, "
           "called on scalars (float32 score, int32 indices); calling it "
           f"raised {type(e).__name__}: {e}")
    shape = getattr(out, "shape", None)
    dtype = getattr(out, "dtype", None)
    if shape != ():
      fail(fn, ValueError, f"`{name}` must return one value per (b, h, "
           "q_idx, kv_idx): it is called on scalars and mapped over the "
           f"scores; got {out!r}")
    good = (jnp.issubdtype(dtype, jnp.floating) if name == "score_mod"
            else dtype == jnp.bool_)
    if not good:
      fail(fn, TypeError, f"`{name}` must return "
           f"{'a float score' if name == 'score_mod' else 'a bool'}, got "
           f"{dtype}")


class User(NamedTuple):
  """The user rules of one call, ready to evaluate on a grid: `b`, `h`
  int arrays that broadcast with the score grid's leading axes (the
  batch row and query head of each score), and the rules themselves
  (None: absent; the blockwise kernel binds its hoisted arrays into
  them)."""
  b: jax.Array
  h: jax.Array
  score_mod: Callable | None
  mask_mod: Callable | None


def user_of(rules, b, h) -> User | None:
  """`User` of `rules` with batch and head indices `b`, `h`; None when
  the call has no user rule."""
  if rules.score_mod is None and rules.mask_mod is None:
    return None
  return User(b, h, rules.score_mod, rules.mask_mod)


def elementwise(rule, args, shape):
  """`rule` on scalars, mapped over every element of `shape`: each of
  `args` broadcasts to `shape` (same rank; axes of size 1 are shared, and
  are not mapped, so a head index [.., H, 1, 1] is not copied per key)."""
  if not shape:
    return rule(*args)
  n = shape[0]
  mapped = tuple(a.shape[0] == n and n != 1 for a in args)
  inner = lambda *xs: elementwise(rule, xs, shape[1:])
  if not any(mapped):  # nothing varies along this axis
    return jnp.broadcast_to(inner(*(a[0] for a in args))[None], shape)
  args = tuple(a if m else a[0] for a, m in zip(args, mapped))
  return jax.vmap(inner, in_axes=tuple(0 if m else None for m in mapped))(
      *args)


def _user_grid(user, q_pos, k_pos, ndim):
  """b, h, q, kv int32 index arrays of rank `ndim` for the grid of
  `q_pos [..., Tq]`, `k_pos [Tk]`."""
  qp, kp = masks.grid(q_pos, k_pos)
  fit = lambda x: jnp.reshape(
      jnp.asarray(x, jnp.int32), (1,) * (ndim - jnp.ndim(x)) + jnp.shape(x))
  return fit(user.b), fit(user.h), fit(qp), fit(kp)


def user_allowed(user, q_pos, k_pos, ndim):
  """bool `user.mask_mod` on every pair of the grid of `q_pos [..., Tq]`,
  `k_pos [Tk]`, with rank at least `ndim` (the grid's and the indices'
  axes broadcast)."""
  ndim = max(ndim, jnp.ndim(user.b), jnp.ndim(user.h))
  idx = _user_grid(user, q_pos, k_pos, ndim)
  shape = jnp.broadcast_shapes(*(x.shape for x in idx))
  return elementwise(user.mask_mod, idx, shape)


def user_scores(user, s, q_pos, k_pos):
  """`user.score_mod` on every score of `s [..., Tq, Tk]` (float32)."""
  b, h, qp, kp = _user_grid(user, q_pos, k_pos, s.ndim)
  out = elementwise(user.score_mod, (s, b, h, qp, kp), s.shape)
  return out.astype(jnp.float32)
