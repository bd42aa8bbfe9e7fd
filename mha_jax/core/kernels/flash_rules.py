"""The user rules of the blockwise kernel, made fit for a custom VJP.

A user's `score_mod` / `mask_mod` may close over arrays (a table under
grad, document ids under jit); a custom VJP may not, so `user_rules`
hoists them into the kernel's arguments once per call
(`flash_config.Extras.score_consts`, `fixed_consts`), and the kernel
binds them back per block (`flash_kernel.block_scores`). The floats
among them get gradients: the backward differentiates score_mod itself
(`flash_kernel.score_mod_vjp`), which is how its tables are trained.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _hoist(rule, example):
  """`rule` traced once on `example` scalars, with every array it closes
  over hoisted out: `(fn, floats, others)`, `fn(*args, *floats, *others)`
  the rule. A custom VJP may not close over traced values (a parameter
  under grad, document ids under jit), so the kernel takes them as
  arguments; the floats get gradients."""
  closed = jax.make_jaxpr(rule)(*example)
  is_float = [jnp.issubdtype(jnp.result_type(c), jnp.inexact)
              for c in closed.consts]
  floats = tuple(c for c, f in zip(closed.consts, is_float) if f)
  others = tuple(c for c, f in zip(closed.consts, is_float) if not f)
  n, nf = len(example), len(floats)

  def fn(*args):
    fl, ot = iter(args[n:n + nf]), iter(args[n + nf:])
    consts = [next(fl) if f else next(ot) for f in is_float]
    return jax.core.eval_jaxpr(closed.jaxpr, consts, *args[:n])[0]
  return fn, floats, others


def user_rules(rules):
  """`(score_mod, mask_mod, score_consts, fixed_consts)`: the user rules
  with the arrays they close over hoisted (`_hoist`). score_mod takes
  `(*args, *score_consts, *its fixed consts)`, mask_mod `(*args, *its
  consts)`; `fixed_consts` = (score_mod's, mask_mod's), not
  differentiated."""
  i32 = jnp.zeros((), jnp.int32)
  score, mask, floats, fixed = None, None, (), ((), ())
  if rules.score_mod is not None:
    score, floats, others = _hoist(
        rules.score_mod, (jnp.zeros((), jnp.float32), i32, i32, i32, i32))
    fixed = (others, ())
  if rules.mask_mod is not None:
    mask, fl, others = _hoist(rules.mask_mod, (i32, i32, i32, i32))
    fixed = (fixed[0], fl + others)
  return score, mask, floats, fixed
