"""The score rules inside the blockwise kernel: one block's scores.

Shape letters: B batch, K key/value heads, G query heads per kv head,
Dh query/key width, Bq / Bk query / key block lengths.

`block_scores` is `score_rules.allowed` and `score_rules.scores` on one
`[Bq, Bk]` block, from the block's positions (`flash_visit.py`), so the
kernel's forward and backward apply the same rules as the reference
paths without a `[Tq, Tk]` array. A user's `score_mod` / `mask_mod` may
close over arrays (a table under grad, document ids under jit); a custom
VJP may not, so `user_rules` hoists them into the kernel's arguments
once per call and `_user` binds them back per block. The backward
differentiates score_mod itself (`score_mod_vjp`), which is how its
tables get gradients. Kept apart from the walk (`flash.py`,
`flash_backward.py`): these are what a block computes, not which blocks.
`cfg` and `ex` are `flash.BlockConfig` and `flash.Extras`.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.core.kernels.flash_visit import block_k_pos
from mha_jax.core.kernels.flash_visit import block_q_pos
from mha_jax.core.kernels.flash_visit import key_start


def _slice_block(x, qs, ks, cfg):
  """Cut the `[.., Bq, Bk]` block of a 5-d mask or bias (broadcast axes stay)."""
  if x is None:
    return None
  if x.shape[3] != 1:
    x = lax.dynamic_slice_in_dim(x, qs, cfg.bq, axis=3)
  if x.shape[4] != 1:
    x = lax.dynamic_slice_in_dim(x, ks, cfg.bk, axis=4)
  return x


def _user(ex, cfg, full=False, with_score=True):
  """The block's `score_rules.User` (None without user rules): the
  converted rules bound to their arrays. `full`: a block the block mask
  found full, whose mask_mod work is skipped."""
  bind = lambda f, consts: None if f is None else (
      lambda *a: f(*a, *consts))
  score = (bind(cfg.score_mod, ex.score_consts + ex.fixed_consts[0])
           if with_score else None)
  keep = None if full is True else bind(cfg.mask_mod, ex.fixed_consts[1])
  if score is None and keep is None:
    return None
  return score_rules.User(ex.b_ids, ex.h_ids, score, keep)


def block_scores(qb, kb, mask, bias, ex, qs, ks, cfg, full=False,
                 with_score=True):
  """float32 scores of one block `[B, K, G, Bq, Bk]`, -inf where forbidden,
  and the soft cap's derivative (None without one): `score_rules.scores`
  on the block. `full`: skip mask_mod (the block mask says it allows
  every key of the block); `with_score=False`: the scores before
  score_mod, not masked (the backward differentiates score_mod itself),
  returned with the mask."""
  qk = precision.einsum("bkgqd,bksd->bkgqs", qb, kb,
                        preferred_element_type=jnp.float32)
  q_pos = block_q_pos(ex, qs, cfg)
  k_pos = block_k_pos(ex, ks, cfg)
  cut_q = lambda x: lax.dynamic_slice_in_dim(x, qs, cfg.bq, axis=1)[
      :, None, None]
  cut_k = lambda x: lax.dynamic_slice_in_dim(x, ks, cfg.bk, axis=1)[
      :, None, None]
  segs = ex.q_seg is not None
  user = _user(ex, cfg, full, with_score)
  ok = score_rules.allowed(
      q_pos, k_pos, mask=_slice_block(mask, qs, ks, cfg),
      is_causal=cfg.is_causal, rules=cfg.rules,
      q_seg=cut_q(ex.q_seg) if segs else None,
      k_seg=cut_k(ex.k_seg) if segs else None,
      # Keys added by padding are never real.
      kv_len=key_start(ex) + cfg.tk if cfg.padded_keys else None,
      user=user)
  s, dcap = score_rules.scores(
      qk, q_pos, k_pos, scale=cfg.scale, rules=cfg.rules,
      bias=_slice_block(bias, qs, ks, cfg), slopes=ex.slopes,
      ok=ok if with_score else None, user=user)
  return (s, dcap) if with_score else (s, dcap, ok)


def score_mod_vjp(s, ex, qs, ks, cfg):
  """`score_mod` on a block of unmasked scores `s`, and its vjp to `s`
  and to the arrays it closes over."""
  q_pos, k_pos = block_q_pos(ex, qs, cfg), block_k_pos(ex, ks, cfg)
  def apply(s, consts):
    user = score_rules.User(ex.b_ids, ex.h_ids,
                            lambda *a: cfg.score_mod(*a, *consts,
                                                     *ex.fixed_consts[0]),
                            None)
    return score_rules.user_scores(user, s, q_pos, k_pos)
  return jax.vjp(apply, s, ex.score_consts)


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
