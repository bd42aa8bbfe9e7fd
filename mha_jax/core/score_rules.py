"""The rules that turn q.k into the softmax input, in one place for every path.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
Dh per-head query/key width.

Modern models change the attention rule beyond a boolean mask. `ScoreRules`
holds those changes; every `attend` implementation that supports them
builds its scores with `scores` and `allowed` below, on a whole `[Tq, Tk]`
matrix (vmap, einsum) or one block at a time (flash), so the rule is
written once:

    s = scale * q.k + bias - slope_h * |pos_q - pos_k|     (ALiBi)
    s = cap * tanh(s / cap)                                (soft cap)
    s = -inf where the key is not allowed                  (masks)
    weights = softmax over [s, sink_h], the sink column dropped

A key is allowed when the boolean `mask` allows it, and the causal rule
(`pos_k <= pos_q`), the local window (`pos_q - left <= pos_k <= pos_q +
right`) and the segment rule (`seg_q == seg_k`) hold. Positions are key
indices: key j sits at j and query i at `Tk - Tq + i` (bottom-right, as
`masks.causal_mask`) unless `q_positions` says otherwise (decoding with a
cache passes each new token's true position).

The sink (Xiao et al. 2023, gpt-oss) is a per-head logit that joins every
row's softmax as an "attend to nothing" column: its weight multiplies no
value, so a row's weights sum to 1 minus the sink's share. A row with no
allowed key then gives its whole weight to the sink and outputs 0, the
same output the project's empty-row policy gives without a sink.

The soft cap (Gemma 2) applies to the scaled scores plus bias, before the
masks, so forbidden keys stay at exactly -inf. ALiBi (Press et al. 2022)
uses `-slope * |pos_q - pos_k|`, which is the paper's `slope * (pos_k -
pos_q)` on every key a causal query sees and stays symmetric without the
causal rule.

One definition per rule. The masks are `masks.causal`, `masks.window_mod`
and `masks.same_segment`, and the score changes `soft_capped` and
`with_alibi` below: `allowed` and `scores` apply the built-in arguments by
calling them on broadcast position grids (plain jnp arithmetic, so no
per-element map and no cost), and the rule factories (`masks.*_mod`,
`soft_cap_mod`, `alibi_mod`) hand the same functions to a user's
`mask_mod` / `score_mod`. The arguments stay the convenient names, and the
faster route in the blockwise kernel, which skips blocks for them from
closed-form ranges where a rule needs a block mask. Prefix-LM has no
argument: its rule, `masks.prefix_lm_mod`, is the way. Scale and sinks are
not per-(query, key) rules (a factor of q.k, a softmax column) and stay
arguments only. The user rules' machinery is `user_rules.py`; its public
names are importable from here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
from jax.custom_derivatives import SymbolicZero
import jax.numpy as jnp
import numpy as np

from mha_jax.core import masks
from mha_jax.core import user_rules
# Re-exported: the callers of the user rules find them here.
from mha_jax.core.user_rules import User  # noqa: F401
from mha_jax.core.user_rules import check_user
from mha_jax.core.user_rules import elementwise  # noqa: F401
from mha_jax.core.user_rules import user_of  # noqa: F401
from mha_jax.core.user_rules import user_scores


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScoreRules:
  """Options of the attention rule beyond `mask`, `bias` and `is_causal`.

  Static (part of the compiled program): `local_window`, `soft_cap`,
  `scale`. Arrays (traced): the rest.

  Attributes:
    local_window: `(left, right)` ints >= 0: query at position p sees keys
      at p - left .. p + right. With `is_causal` the right side is 0.
    soft_cap: c > 0: scores become `c * tanh(s / c)` before masking.
    scale: multiplier of q.k (None: 1 / sqrt(Dh)).
    q_segment_ids, kv_segment_ids: int `[B, Tq]` / `[B, Tk]`: packed
      sequences; a query sees only keys of its own segment. Give both
      (for self-attention the same array twice).
    sinks: float `[H]`: each head's sink logit.
    alibi_slopes: float `[H]`: each head's ALiBi slope (>= 0).
    q_positions: int `[B, Tq]`: the key position each query sits at, for
      the causal, window and ALiBi rules (None: `Tk - Tq + i`).
    score_mod: a user rule `score_mod(score, b, h, q_idx, kv_idx) ->
      score`, FlexAttention's, applied after the rules above and before
      the masks (docs/score_rules.md).
    mask_mod: a user rule `mask_mod(b, h, q_idx, kv_idx) -> bool`, True =
      may attend, ANDed with the masks above.
    block_mask: a `block_mask.BlockMask` built from `mask_mod` for this
      call's shape: the blockwise kernel then visits only its non-empty
      blocks and evaluates `mask_mod` only on its partial ones. Exact, so
      the other paths ignore it.

  The user rules are static fields of this object, not of the layer's
  `AttentionSpec` alone, because this object is what every path reads:
  the vmap and einsum paths and the blockwise kernel all apply them
  through `allowed` and `scores` below, one computation in one place
  (the spec holds them too and hands them here, as it does the window).
  They are called on scalars and mapped over every element (FlexAttention's
  semantics): `b` the batch row, `h` the query head, `q_idx` the query's
  position (as the causal rule sees it: `q_positions`, else `Tk - Tq +
  i`), `kv_idx` the key's index, all int32; `score` float32.
  """
  local_window: tuple[int, int] | None = dataclasses.field(
      default=None, metadata=dict(static=True))
  soft_cap: float | None = dataclasses.field(
      default=None, metadata=dict(static=True))
  scale: float | None = dataclasses.field(
      default=None, metadata=dict(static=True))
  q_segment_ids: jax.Array | None = None
  kv_segment_ids: jax.Array | None = None
  sinks: jax.Array | None = None
  alibi_slopes: jax.Array | None = None
  q_positions: jax.Array | None = None
  score_mod: Callable | None = dataclasses.field(
      default=None, metadata=dict(static=True))
  mask_mod: Callable | None = dataclasses.field(
      default=None, metadata=dict(static=True))
  block_mask: Any = dataclasses.field(
      default=None, metadata=dict(static=True))

  @property
  def segments(self) -> bool:
    return self.q_segment_ids is not None

  def active(self) -> tuple[str, ...]:
    """Names of the options in use (for errors and `auto`'s reasons)."""
    return tuple(n for n in OPTIONS if getattr(self, n) is not None)

  def replace(self, **changes) -> ScoreRules:
    return dataclasses.replace(self, **changes)


NO_RULES = ScoreRules()
# The user rules: fields a call may bring when its layer's spec has none.
USER_FIELDS = ("score_mod", "mask_mod", "block_mask")
# Each option in words, for the refusals of the paths that lack it
# (`attention_path.refusal`). Its keys are the options: `kv_segment_ids`
# travels with `q_segment_ids` and is not one of its own.
OPTION_WORDS = {
    "local_window": "a local window",
    "soft_cap": "logit soft-capping",
    "scale": "another scale",
    "q_segment_ids": "segment ids; pass a mask built from them instead",
    "sinks": "attention sinks",
    "alibi_slopes": "ALiBi; pass the bias instead",
    "q_positions": "per-row query positions",
    "score_mod": "user rules",
    "mask_mod": "user rules",
    "block_mask": "user rules",
}
OPTIONS = tuple(OPTION_WORDS)


def static(rules: ScoreRules) -> dict:
  """The static options of `rules` (those compiled into the program) by
  name: what a layer's `AttentionSpec` holds, so that code moving them
  between the two never lists them."""
  return {f.name: getattr(rules, f.name) for f in dataclasses.fields(rules)
          if f.metadata.get("static")}


def builtin_static(rules: ScoreRules) -> ScoreRules:
  """`rules` cut to its static built-in options (window, soft cap, scale,
  and any later one): what a kernel compiles in before it adds the user
  rules or the traced arrays of its own call."""
  return ScoreRules(**{n: v for n, v in static(rules).items()
                       if n not in USER_FIELDS})


_fail = user_rules.fail


def _is_known(x):
  return not isinstance(x, jax.core.Tracer)


def check(rules: ScoreRules, *, batch: int, q_len: int, kv_len: int,
          num_heads: int, fn: str = "attend") -> None:
  """Validate `rules` for one call before tracing; errors name the field."""
  if not isinstance(rules, ScoreRules):
    _fail(fn, TypeError, f"`rules` must be a ScoreRules, got "
          f"{type(rules).__name__}")
  w = rules.local_window
  if w is not None:
    ok = (isinstance(w, tuple) and len(w) == 2 and
          all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
              and x >= 0 for x in w))
    if not ok:
      _fail(fn, ValueError, "`local_window` must be a pair (left, right) of "
            f"ints >= 0, got {w!r}")
  for name in ("soft_cap", "scale"):
    val = getattr(rules, name)
    if val is not None and not (isinstance(val, (int, float)) and
                                math.isfinite(val) and val > 0):
      _fail(fn, ValueError, f"`{name}` must be a finite number > 0, got "
            f"{val!r}")
  qs, ks = rules.q_segment_ids, rules.kv_segment_ids
  if (qs is None) != (ks is None):
    _fail(fn, ValueError, "`q_segment_ids` and `kv_segment_ids` go together"
          " (for self-attention pass the same ids twice)")
  for name, arr, length in (("q_segment_ids", qs, q_len),
                            ("kv_segment_ids", ks, kv_len),
                            ("q_positions", rules.q_positions, q_len)):
    if arr is None:
      continue
    if tuple(jnp.shape(arr)) != (batch, length):
      _fail(fn, ValueError, f"`{name}` must have shape [B, T] = "
            f"[{batch}, {length}], got {tuple(jnp.shape(arr))}")
    if not jnp.issubdtype(jnp.result_type(arr), jnp.integer):
      _fail(fn, TypeError, f"`{name}` must be integer, got "
            f"{jnp.result_type(arr)}")
  for name in ("sinks", "alibi_slopes"):
    arr = getattr(rules, name)
    if arr is None:
      continue
    if tuple(jnp.shape(arr)) != (num_heads,):
      _fail(fn, ValueError, f"`{name}` must have shape [H] = [{num_heads}] "
            f"(one per query head), got {tuple(jnp.shape(arr))}")
    if not jnp.issubdtype(jnp.result_type(arr), jnp.floating):
      _fail(fn, TypeError, f"`{name}` must be floating, got "
            f"{jnp.result_type(arr)}")
  check_user(rules, fn)
  if rules.block_mask is not None:
    if not hasattr(rules.block_mask, "check_call"):
      _fail(fn, TypeError, "`block_mask` must be a block_mask.BlockMask "
            f"(block_mask.create), got {type(rules.block_mask).__name__}")
    rules.block_mask.check_call(rules, batch=batch, num_heads=num_heads,
                                q_len=q_len, kv_len=kv_len, fn=fn)
  slopes = rules.alibi_slopes
  if slopes is not None and _is_known(slopes):
    if np.any(~np.isfinite(np.asarray(slopes))) or np.any(
        np.asarray(slopes) < 0):
      _fail(fn, ValueError, f"`alibi_slopes` must be finite and >= 0, got "
            f"{np.asarray(slopes)}")


def alibi_slopes(num_heads: int) -> jax.Array:
  """ALiBi's fixed slopes `[H]`: the geometric sequence 2^(-8 i / H), i =
  1..H (Press et al. 2022). For a head count that is not a power of two
  the paper interleaves two such sequences; that choice is not made for
  the user here: pass your own slopes to `ScoreRules(alibi_slopes=...)`."""
  if not isinstance(num_heads, int) or num_heads < 1:
    raise ValueError(f"alibi_slopes: `num_heads` must be a positive int, "
                     f"got {num_heads!r}")
  if num_heads & (num_heads - 1):
    raise ValueError(f"alibi_slopes: `num_heads`={num_heads} is not a power"
                     " of two, for which the paper's slopes are defined; "
                     "pass explicit slopes instead")
  i = jnp.arange(1, num_heads + 1, dtype=jnp.float32)
  return 2.0 ** (-8.0 * i / num_heads)


def default_q_positions(q_len: int, kv_len: int) -> jax.Array:
  """`[Tq]` key positions of the queries when none are given: bottom-right."""
  return jnp.arange(q_len) + (kv_len - q_len)


def scale_of(rules: ScoreRules, head_dim: int) -> float:
  return head_dim ** -0.5 if rules.scale is None else float(rules.scale)


# The built-in score changes, one definition each: `scores` applies them to
# broadcast grids, `soft_cap_mod` and `alibi_mod` hand them to `score_mod`.


def soft_capped(score, cap):
  """`(cap * tanh(score / cap), 1 - tanh^2)`: the capped score and its
  derivative to `score`, which the blockwise backward multiplies by."""
  t = jnp.tanh(score / cap)
  return cap * t, 1.0 - t * t


@jax.custom_jvp
def _capped(score, cap):
  return soft_capped(score, cap)[0]


def _capped_jvp(primals, tangents):
  # d/d score is `soft_capped`'s derivative as written, so that autodiff
  # of the rule (the dense paths; a `score_mod` in the kernel's backward)
  # and the kernel's hand-written backward multiply by the same float32
  # number: autodiff of cap * tanh(score / cap) rounds through * cap and
  # / cap and differs in the last bits. A traced cap (a rule's closure)
  # gets d/d cap = tanh - (score / cap) * (1 - tanh^2).
  (score, cap), (d_score, d_cap) = primals, tangents
  out, dcap = soft_capped(score, cap)
  zero = lambda t: isinstance(t, SymbolicZero)
  tangent = jnp.zeros_like(out) if zero(d_score) else d_score * dcap
  if not zero(d_cap):
    tangent = tangent + d_cap * (out / cap - score / cap * dcap)
  return out, tangent


_capped.defjvp(_capped_jvp, symbolic_zeros=True)


def soft_cap_mod(cap: float):
  """`soft_cap=cap`: scores become cap * tanh(score / cap)."""
  return lambda score, b, h, q_idx, kv_idx: _capped(score, cap)


def _distance(q_idx, kv_idx):
  return jnp.abs(q_idx - kv_idx).astype(jnp.float32)


def distance(q_pos, k_pos):
  """float32 `|pos_q - pos_k|`, `[..., Tq, Tk]` (ALiBi's distance)."""
  return _distance(*masks.grid(q_pos, k_pos))


def with_alibi(score, slope, q_idx, kv_idx):
  """ALiBi: `score - slope * |q_idx - kv_idx|` (float32); the arguments
  broadcast (a slope `[..., H, 1, 1]` per head, or one head's scalar)."""
  return score - slope * _distance(q_idx, kv_idx)


def alibi_mod(slopes):
  """`alibi_slopes=slopes [H]` as a rule: `with_alibi` with head h's
  slope."""
  slopes = jnp.asarray(slopes, jnp.float32)
  return lambda score, b, h, q_idx, kv_idx: with_alibi(score, slopes[h],
                                                       q_idx, kv_idx)


def _on_grid(mod, qp, kp):
  """A built-in mask rule on the whole grid (it reads neither b nor h)."""
  return mod(None, None, qp, kp)


def allowed(q_pos, k_pos, *, mask=None, is_causal=False, rules=NO_RULES,
            q_seg=None, k_seg=None, kv_len=None, user=None):
  """Boolean "may attend" from positions and ids; None when all may.

  q_pos `[..., Tq]`, k_pos `[Tk]` (ints), q_seg `[..., Tq]`, k_seg
  `[..., Tk]`, mask broadcastable to `[..., Tq, Tk]`; the leading axes of
  the arguments broadcast together. `kv_len`: keys at positions >= kv_len
  are padding (the blockwise path's last block) and never allowed.
  `user`: the call's `User` rules; its `mask_mod` (if any) joins the AND,
  evaluated on the whole grid.
  """
  qp, kp = masks.grid(q_pos, k_pos)
  ok = mask
  def both(a, b):
    return b if a is None else a & b
  if kv_len is not None:
    ok = both(ok, kp < kv_len)
  if is_causal:
    ok = both(ok, _on_grid(masks.causal_mod(), qp, kp))
  if rules.local_window is not None:
    ok = both(ok, _on_grid(masks.window_mod(*rules.local_window), qp, kp))
  if q_seg is not None:
    ok = both(ok, masks.same_segment(q_seg[..., :, None],
                                     k_seg[..., None, :]))
  if user is not None and user.mask_mod is not None:
    ok = both(ok, user_rules.user_allowed(user, q_pos, k_pos, qp.ndim))
  return ok


def scores(qk, q_pos, k_pos, *, scale, rules=NO_RULES, bias=None,
           slopes=None, ok=None, user=None):
  """float32 dot products `qk [..., Tq, Tk]` -> the softmax input.

  `slopes` broadcasts to qk's leading axes (`[..., 1, 1]`); `ok` is
  `allowed(...)`. Returns `(s, dcap)`: `s` the scores (-inf where not
  allowed) and `dcap` = d s / d (pre-cap score) = 1 - tanh^2, or None
  without a soft cap (the blockwise backward needs it).
  """
  s = qk * scale
  if bias is not None:
    s = s + bias.astype(jnp.float32)
  if slopes is not None:
    s = with_alibi(s, slopes.astype(jnp.float32), *masks.grid(q_pos, k_pos))
  dcap = None
  if rules.soft_cap is not None:
    # One tanh once compiled (XLA merges the two); dcap feeds only the
    # blockwise backward.
    s, dcap = _capped(s, rules.soft_cap), soft_capped(s, rules.soft_cap)[1]
  if user is not None and user.score_mod is not None:
    s = user_scores(user, s, q_pos, k_pos)
  if ok is not None:
    s = forbid(s, ok)
  return s, dcap


@jax.custom_jvp
def forbid(s: jax.Array, ok: jax.Array) -> jax.Array:
  """`s` where `ok` allows a key, -inf elsewhere (`ok` broadcasts to `s`).

  -inf rather than a large negative number: exp(-inf) is exactly 0. The
  tangent passes through unmasked (`_forbid_jvp`).
  """
  return jnp.where(ok, s, -jnp.inf)


@forbid.defjvp
def _forbid_jvp(primals, tangents):
  # Autodiff's rule for the select zeroes the tangent of a forbidden key,
  # and its transpose is one more full pass over [B, H, Tq, Tk] in the
  # backward, which XLA's CPU backend did not fuse (about 10% of the
  # text-size training step; docs/performance.md). It is redundant: the
  # masked scores only reach the softmax, directly or through a `scores`
  # hook, and the softmax rule multiplies the tangent of every key by its
  # weight, which is exactly 0 for a key at -inf. So with finite q and k
  # both modes give the same numbers (a zero may change sign). A hook
  # patch that writes a finite value over a forbidden score replaces it,
  # and its own rule sends that key no gradient. What changes is NaN or
  # inf in the keys of forbidden slots: forward mode (jvp) now carries it
  # into the row's tangent, as reverse mode already did through the
  # softmax's row sum and dq = ds k.
  (s, ok), (ds, _) = primals, tangents
  out = forbid(s, ok)
  return out, jnp.broadcast_to(ds, out.shape)
