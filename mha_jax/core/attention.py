"""Stage 3 of the seed: scaled dot-product attention, one head, and all heads.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads (K divides H), G = H // K query heads sharing one kv head,
Dh per-head query/key width, Dv per-head value width.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(Dh) + bias + M) V

and the variants of `mha_jax.core.score_rules` (local windows, packed segments,
soft-capping, sinks, another scale, ALiBi), passed as `rules=`.

Policies that hold on every path:
  * The boolean mask is applied BEFORE the softmax, as -inf on forbidden keys,
    so they get exactly zero weight (after the softmax would leak mass).
  * A query row with no allowed key gets weights 0 and output 0, with finite
    gradients (instead of NaN or the mean of V that some libraries return).
  * Logits and softmax are float32 even for bfloat16/float16 inputs; the
    weights are cast to the value dtype for the weighted sum, which
    accumulates in float32. The weights returned (the `pattern`) are the
    float32 softmax the output was computed from (before dropout).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mha_jax.core import precision
from mha_jax.core import device_memory
from mha_jax.core.kernels import auto
from mha_jax.core.kernels import flash
from mha_jax import hooks as hooks_lib
from mha_jax.core.kernels import pallas
from mha_jax.core import score_rules
from mha_jax.core.kernels import xla


@jax.custom_jvp
def _softmax_rows(x: jax.Array) -> jax.Array:
  """Softmax over the last axis of float32 `x` that may hold -inf; 0 rows."""
  row_max = jnp.max(x, axis=-1, keepdims=True)
  # An empty row has max -inf; shift by 0 so that exp gives 0, not NaN.
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  e = jnp.exp(x - row_max)
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


@_softmax_rows.defjvp
def _softmax_rows_jvp(primals, tangents):
  # The softmax derivative y * (dx - <y, dx>), written once instead of
  # letting autodiff trace max/exp/sum/divide: the backward pass then makes
  # two passes over [.., Tq, Tk] instead of about six, which halves the
  # reference path's forward+backward time (experiments/benchmark/). A
  # masked key or an empty row has y = 0 and so receives no gradient; the
  # rule is linear in dx, so JAX transposes it for reverse mode and can
  # differentiate it again (Hessians, jax.jacfwd).
  (x,), (x_dot,) = primals, tangents
  y = _softmax_rows(x)
  return y, y * (x_dot - jnp.sum(y * x_dot, axis=-1, keepdims=True))


def softmax_with_sink(scores: jax.Array, sinks: jax.Array | None):
  """The softmax of rows of `scores [..., Tk]` with one extra column of
  logit `sinks` (broadcast to `[..., 1]`) that is dropped afterwards: the
  weights of the real keys, summing to 1 minus the sink's share."""
  if sinks is None:
    return _softmax_rows(scores)
  column = jnp.broadcast_to(sinks.astype(jnp.float32),
                            scores.shape[:-1] + (1,))
  return _softmax_rows(jnp.concatenate([scores, column], axis=-1))[..., :-1]


def masked_softmax(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
  """float32 softmax over the last axis; masked keys and empty rows give 0."""
  logits = logits.astype(jnp.float32)
  if mask is not None:
    logits = score_rules.forbid(logits, mask)
  return _softmax_rows(logits)


def _check_single_head(q, k, v):
  for name, arr in (("q", q), ("k", k), ("v", v)):
    if jnp.ndim(arr) != 2:
      raise ValueError(f"scaled_dot_product_attention: `{name}` must have rank "
                       f"2 ([T, Dh]); got shape {jnp.shape(arr)}. Use "
                       "multi_head_attention or attend for batches and heads")
    if not jnp.issubdtype(jnp.result_type(arr), jnp.floating):
      raise TypeError(f"scaled_dot_product_attention: `{name}` must be "
                      f"floating, got {jnp.result_type(arr)}")
  if q.shape[1] != k.shape[1]:
    raise ValueError(f"scaled_dot_product_attention: q and k widths differ: "
                     f"q {q.shape}, k {k.shape}")
  if k.shape[0] != v.shape[0]:
    raise ValueError(f"scaled_dot_product_attention: k and v lengths differ: "
                     f"k {k.shape}, v {v.shape}")


def _check_broadcast(name, arr, target, *, boolean, fn):
  """Check that `arr` broadcasts to `target` and has the right dtype."""
  if arr is None:
    return
  dtype = jnp.result_type(arr)
  if boolean and dtype != jnp.bool_:
    hint = (" For an additive float mask (0 / -inf) pass it as `bias=`."
            if jnp.issubdtype(dtype, jnp.floating) else "")
    raise TypeError(f"{fn}: `{name}` must be boolean (True = may attend), got "
                    f"{dtype}.{hint}")
  if not boolean and not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{fn}: `{name}` must be floating, got {dtype}")
  shape = tuple(jnp.shape(arr))
  ok = len(shape) <= len(target) and all(
      s in (1, t) for s, t in zip(shape[::-1], target[::-1]))
  if not ok:
    raise ValueError(f"{fn}: `{name}` of shape {shape} does not broadcast to "
                     f"{list(target)}")


def _head_scores(q, k, mask, bias, slope, q_pos, q_seg, k_seg, b_id=0,
                 h_id=0, *, is_causal, rules):
  """One head: q [Tq,Dh], k [Tk,Dh] -> float32 scores [Tq,Tk].

  Scaled dot products plus `bias` (and ALiBi's `slope` term, soft-capped
  by `rules`), and -inf where `mask`, the causal rule, the window or the
  segments `q_seg [Tq]`, `k_seg [Tk]` forbid a key: the softmax's input,
  as the `scores` hook sees it. `q_pos [Tq]`: the queries' key positions
  (None: bottom-right). `b_id`, `h_id`: this head's batch row and query
  head, the `b` and `h` of the user rules.
  """
  tq, tk = q.shape[0], k.shape[0]
  if q_pos is None:
    q_pos = score_rules.default_q_positions(tq, tk)
  k_pos = jnp.arange(tk)
  q, scale = _fold_scale(q, score_rules.scale_of(rules, q.shape[-1]))
  qk = precision.einsum("qd,kd->qk", q, k,
                        preferred_element_type=jnp.float32)  # [Tq, Tk]
  user = score_rules.user_of(rules, jnp.reshape(b_id, (1, 1)),
                             jnp.reshape(h_id, (1, 1)))
  ok = score_rules.allowed(q_pos, k_pos, mask=mask, is_causal=is_causal,
                           rules=rules, q_seg=q_seg, k_seg=k_seg, user=user)
  s, _ = score_rules.scores(qk, q_pos, k_pos, scale=scale, rules=rules,
                            bias=bias, slopes=slope, ok=ok, user=user)
  return s


def _fold_scale(q, scale):
  """`(q', scale')` with q'.k * scale' = scale * (q.k): in float32 the
  scale multiplies q ([Tq, Dh]) instead of the scores ([Tq, Tk]), as
  flax.linen does, which saves a pass over the scores and lets XLA's CPU
  backend fuse the score product with the softmax; docs/performance.md.
  Lower precisions keep it on the float32 scores, where it does not
  round q (the blockwise kernel's rule, `flash.prescaled`)."""
  if flash.prescaled(q.dtype):
    return q * jnp.asarray(scale, q.dtype), 1.0
  return q, scale


def _head_mix(weights, v):
  """One head: weights [Tq,Tk] @ v [Tk,Dv] -> [Tq,Dv], float32 accumulation."""
  return precision.einsum("qk,kd->qd", weights.astype(v.dtype), v,
                          preferred_element_type=jnp.float32).astype(v.dtype)


def scaled_dot_product_attention(q, k, v, *, mask=None, bias=None):
  """Attention for ONE head: q `[Tq, Dh]`, k `[Tk, Dh]`, v `[Tk, Dv]`.

  `mask`: bool broadcastable to `[Tq, Tk]`, True = may attend.
  `bias`: float broadcastable to `[Tq, Tk]`, added to the scaled scores.
  Returns `(out [Tq, Dv], weights [Tq, Tk])`.
  """
  _check_single_head(q, k, v)
  target = (q.shape[0], k.shape[0])
  fn = "scaled_dot_product_attention"
  _check_broadcast("mask", mask, target, boolean=True, fn=fn)
  _check_broadcast("bias", bias, target, boolean=False, fn=fn)
  as_2d = lambda x: None if x is None else jnp.reshape(
      x, (1,) * (2 - jnp.ndim(x)) + jnp.shape(x))
  weights = _softmax_rows(_head_scores(
      q, k, as_2d(mask), as_2d(bias), None, None, None, None,
      is_causal=False, rules=score_rules.NO_RULES))
  return _head_mix(weights, v), weights


# ----------------------------------------------------------------------------
# All heads at once: q [B,Tq,H,Dh], k [B,Tk,K,Dh], v [B,Tk,K,Dv].


def _to_4d(x):
  """Left-pad an array broadcastable to [B, H, Tq, Tk] to rank 4."""
  return None if x is None else jnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)


def _weights(scores, keep, dropout_rate, hooks, sinks=None):
  """scores `[B,H,Tq,Tk]` -> the `pattern` `[B,H,Tq,Tk]` and the weights
  the values are mixed with (the pattern after dropout). `sinks [H]`: each
  head's sink logit, a softmax column that is not part of the pattern.

  The hook sites of stage 3 on the paths that form weights: `scores` may
  be read or replaced before the softmax, `pattern` after it.
  """
  sinks = None if sinks is None else sinks[None, :, None, None]
  pattern = hooks("pattern", softmax_with_sink(hooks("scores", scores),
                                               sinks))
  if keep is None:
    return pattern, pattern
  return pattern, jnp.where(keep, pattern / (1.0 - dropout_rate), 0.0)


def _attend_vmap(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                 hooks, rules=score_rules.NO_RULES):
  """Reference path: the one-head functions mapped with jax.vmap over G,
  K, then B (scores, then mixing the values); the softmax between them
  is elementwise over rows, so it runs on all heads at once."""
  b, tq, h, dh = q.shape
  tk, kh = k.shape[1], k.shape[2]
  g = h // kh
  q = q.reshape(b, tq, kh, g, dh)  # [B, Tq, K, G, Dh]

  def split_heads_axis(x):
    """[b?, h?, ...] -> ([b?, K?, G?, ...], in_axes for B, K, G)."""
    if x is None:
      return None, None, None, None
    bx, hx = x.shape[:2]
    if hx == h:
      x = x.reshape(bx, kh, g, *x.shape[2:])
      ax_k, ax_g = 0, 0
    else:  # shared by all heads: drop the head axis, map nothing over it
      x = x[:, 0]
      ax_k = ax_g = None
    if bx == b:
      ax_b = 0
    else:  # shared by the whole batch
      x, ax_b = x[0], None
    return x, ax_b, ax_k, ax_g

  mask, mb, mk, mg = split_heads_axis(_to_4d(mask))
  bias, bb, bk, bg = split_heads_axis(_to_4d(bias))

  # Per-head and per-row vectors of the score rules, and the axes they map.
  slope = (None if rules.alibi_slopes is None
           else rules.alibi_slopes.reshape(kh, g))  # [K, G]
  sk = sg = None if slope is None else 0
  per_row = lambda x: (None, None) if x is None else (x, 0)  # [B, T]
  q_pos, pb = per_row(rules.q_positions)
  q_seg, qsb = per_row(rules.q_segment_ids)
  k_seg, ksb = per_row(rules.kv_segment_ids)

  # The batch row and query head of each score, for the user rules.
  b_ids, h_ids = jnp.arange(b), jnp.arange(h).reshape(kh, g)  # [B], [K, G]

  head = functools.partial(_head_scores, is_causal=is_causal, rules=rules)
  # Over the G query heads that share one kv head: q is [Tq, G, Dh].
  over_g = jax.vmap(head, in_axes=(1, None, mg, bg, sg, None, None, None,
                                   None, 0))
  # Over the K kv heads: q [Tq, K, G, Dh], k [Tk, K, Dh].
  over_k = jax.vmap(over_g, in_axes=(1, 1, mk, bk, sk, None, None, None,
                                     None, 0))
  over_b = jax.vmap(over_k, in_axes=(0, 0, mb, bb, None, pb, qsb, ksb, 0,
                                     None))
  scores = over_b(q, k, mask, bias, slope, q_pos, q_seg, k_seg, b_ids,
                  h_ids).reshape(b, h, tq, tk)  # from [B, K, G, Tq, Tk]
  pattern, weights = _weights(scores, keep, dropout_rate, hooks, rules.sinks)

  mix_g = jax.vmap(_head_mix, in_axes=(0, None), out_axes=1)  # [Tq, G, Dv]
  mix_k = jax.vmap(mix_g, in_axes=(0, 1), out_axes=1)  # [Tq, K, G, Dv]
  mix_b = jax.vmap(mix_k, in_axes=(0, 0))  # [B, Tq, K, G, Dv]
  out = mix_b(weights.reshape(b, kh, g, tq, tk), v)
  return out.reshape(b, tq, h, v.shape[-1]), pattern


def _attend_einsum(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                   hooks, rules=score_rules.NO_RULES):
  """Fused path: batched einsums; GQA by grouping q, never repeating k/v."""
  b, tq, h, dh = q.shape
  tk, kh = k.shape[1], k.shape[2]
  g = h // kh
  # Head-major q and k: the score matmul is then batched over (B, K) and
  # writes [B, K, G, Tq, Tk] directly. With q as [B, Tq, K, G, Dh], XLA on
  # CPU transposed the whole score matrix after the matmul (compiled HLO).
  q, scale = _fold_scale(q, score_rules.scale_of(rules, dh))
  qg = q.reshape(b, tq, kh, g, dh).transpose(0, 2, 3, 1, 4)  # [B,K,G,Tq,Dh]
  kt = k.transpose(0, 2, 1, 3)  # [B, K, Tk, Dh]
  qk = precision.einsum("bkgqd,bksd->bkgqs", qg, kt,
                        preferred_element_type=jnp.float32)

  def to_5d(x):  # [b?, h?, tq?, tk?] -> [b?, K?, G?, tq?, tk?]
    if x is None:
      return None
    if x.shape[1] == h:
      return x.reshape(x.shape[0], kh, g, *x.shape[2:])
    return x[:, :, None]

  rows = lambda x: None if x is None else x[:, None, None]  # [B,1,1,T]
  q_pos = (score_rules.default_q_positions(tq, tk)[None, None, None]
           if rules.q_positions is None else rows(rules.q_positions))
  k_pos = jnp.arange(tk)
  user = score_rules.user_of(  # [B, 1, 1, 1, 1], [1, K, G, 1, 1]
      rules, jnp.arange(b).reshape(b, 1, 1, 1, 1),
      jnp.arange(h).reshape(1, kh, g, 1, 1))
  ok = score_rules.allowed(
      q_pos, k_pos, mask=to_5d(_to_4d(mask)), is_causal=is_causal,
      rules=rules, q_seg=rows(rules.q_segment_ids),
      k_seg=rows(rules.kv_segment_ids), user=user)
  slopes = (None if rules.alibi_slopes is None else
            rules.alibi_slopes.reshape(1, kh, g, 1, 1))
  logits, _ = score_rules.scores(
      qk, q_pos, k_pos, scale=scale, rules=rules,
      bias=to_5d(_to_4d(bias)), slopes=slopes, ok=ok, user=user)
  pattern, weights = _weights(logits.reshape(b, h, tq, tk), keep,
                              dropout_rate, hooks, rules.sinks)
  weights = weights.reshape(b, kh, g, tq, tk).astype(v.dtype)
  # Weights on the left, output [B, K, G, Tq, Dv]: asking einsum for
  # "bqkgd" directly made XLA compute (W V)^T as V^T W^T, which took twice
  # the CPU time of the vmap path at B=1, n=2048, H=8.
  out = precision.einsum("bkgqs,bksd->bkgqd", weights,
                         v.transpose(0, 2, 1, 3),
                         preferred_element_type=jnp.float32).astype(v.dtype)
  out = out.transpose(0, 3, 1, 2, 4)  # [B, Tq, K, G, Dv]
  return out.reshape(b, tq, h, v.shape[-1]), pattern


IMPLEMENTATIONS = {"vmap": _attend_vmap, "einsum": _attend_einsum,
                   # Paths that never form the weights (attend returns None):
                   "flash": flash.attend_flash,  # blockwise, O(T) memory
                   "xla": xla.attend_xla,
                   "cudnn": xla.attend_cudnn,
                   # JAX's Pallas TPU splash kernel (interpreted off TPU).
                   "pallas_tpu": pallas.attend_pallas_tpu}


def choose_implementation(q, k, *, dropout=False, backend=None):
  """What "auto" runs for q and k (v shaped like k, no mask or bias): the
  fastest path that keeps the reference semantics. The rules, and why
  each faster kernel is passed over, are in `mha_jax.core.kernels.auto`.

  Measured with `python -m experiments.benchmark` on CPU, the blockwise path
  is the fastest at every shape tried (it also never forms [Tq, Tk]).
  Dropout needs the weights, so it goes to "einsum". On GPU cuDNN's fused
  kernel where it supports the call, on TPU (where an adapter exists) JAX's
  Pallas kernel; otherwise XLA's fused attention while the float32 scores
  fit in 1 GiB, and the blockwise path beyond (not measured here).
  """
  return auto.select_for(q, k, k, dropout=dropout,
                                backend=backend).implementation


def _attend_auto(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                 rules=score_rules.NO_RULES):
  """The path `kernels/auto.py` picks for this call (`mha_jax.explain_auto`
  says which and why). The weights of a path that forms them (einsum on
  CPU for small scores) are not returned: `auto` is weightless."""
  impl = auto.select_for(q, k, v, mask=mask, bias=bias,
                                is_causal=is_causal, dropout=keep is not None,
                                rules=rules.active()).implementation
  extra = {} if impl in WEIGHTLESS else {"hooks": hooks_lib.NO_HOOKS}
  out, _ = IMPLEMENTATIONS[impl](q, k, v, mask, bias, keep,
                                 is_causal=is_causal,
                                 dropout_rate=dropout_rate, rules=rules,
                                 **extra)
  return out, None


IMPLEMENTATIONS["auto"] = _attend_auto
# The library's default path (the pure functions, `AttentionSpec`,
# `ModelConfig`): the reference, the seed's one head mapped over heads,
# which every other path is tested against.
DEFAULT_IMPLEMENTATION = "vmap"
# The one other default, for one reason: a caller that runs a whole model
# for its outputs at real sizes (`load_pretrained`; the experiments'
# default config says the same) takes the faster of the two paths that
# still form every hook site. Same numbers up to float rounding.
RUN_IMPLEMENTATION = "einsum"
# Paths that a layer above the core adds with `register` (the package's
# `__init__` wires them). Same signature as IMPLEMENTATIONS.
REGISTERED = {}
# Implementations whose `attend` returns weights=None ("auto" may pick one)
# and that have no `scores` / `pattern` hook sites; `register` adds to it.
WEIGHTLESS = {"flash", "xla", "cudnn", "pallas_tpu", "auto"}


# Paths that apply `score_mod` / `mask_mod` (score_rules.ScoreRules); the
# others (jax.nn's, Pallas', the context-parallel ones) refuse them.
USER_RULE_PATHS = frozenset({"vmap", "einsum", "flash", "auto"})
# Paths asked for by name that form the [B, H, Tq, Tk] scores, refused
# when those cannot fit (core/device_memory.py). Ours hold them in
# float32; jax.nn's XLA path at least in q's dtype.
DENSE_PATHS = frozenset({"vmap", "einsum", "xla"})


def register(name: str, path, *, forms_weights: bool = False) -> None:
  """Add the `attend` path `path` under `name`, for paths that need more
  than the core has (a mesh): the core then dispatches to them without
  importing or naming them. `path` takes `IMPLEMENTATIONS`' arguments;
  unless it `forms_weights` it returns None weights and takes no hooks."""
  if name in IMPLEMENTATIONS:
    raise ValueError(f"register: {name!r} is one of the core's own "
                     "implementations")
  REGISTERED[name] = path
  if not forms_weights:
    WEIGHTLESS.add(name)


def known_implementation(name) -> bool:
  """True for a key of `IMPLEMENTATIONS` or `REGISTERED`."""
  return implementation_problem(name) is None


def implementation_problem(name) -> str | None:
  """The one rule for an implementation name: None for a known one, else
  what was expected and what came (for `check_implementation` and
  `ModelConfig`'s field error)."""
  if name in IMPLEMENTATIONS or name in REGISTERED:
    return None
  return (f"unknown `implementation`={name!r}; expected one of "
          f"{sorted(IMPLEMENTATIONS) + sorted(REGISTERED)}")


def check_implementation(name, fn: str = "attend") -> None:
  """Raise a ValueError naming `fn` unless `name` is a known path."""
  problem = implementation_problem(name)
  if problem is not None:
    raise ValueError(f"{fn}: {problem}")


def weightless_reason(implementation: str) -> str:
  """Why `scores`/`pattern` do not exist on `implementation`, and the way
  out; used by every error that refuses them."""
  return (f"implementation={implementation!r} never forms the attention "
          "weights (scores/pattern); use implementation='vmap' or 'einsum' "
          "to read or patch them (for a model: "
          "`transformer.with_implementation(model, 'einsum')`, same "
          "weights)")


def check_attend_inputs(q, k, v, mask, bias, implementation, fn="attend",
                        rules=score_rules.NO_RULES, is_causal=False):
  """Validate head-split inputs; raise naming the argument. Returns nothing."""
  for name, arr in (("q", q), ("k", k), ("v", v)):
    if jnp.ndim(arr) != 4:
      raise ValueError(f"{fn}: `{name}` must have rank 4 ([B, T, heads, "
                       f"dim]), got shape {jnp.shape(arr)}")
    if not jnp.issubdtype(jnp.result_type(arr), jnp.floating):
      raise TypeError(f"{fn}: `{name}` must be floating, got "
                      f"{jnp.result_type(arr)}")
  b, tq, h, dh = q.shape
  if k.shape[0] != b or v.shape[0] != b:
    raise ValueError(f"{fn}: batch sizes differ: q {q.shape}, k {k.shape}, "
                     f"v {v.shape}")
  if k.shape[:3] != v.shape[:3]:
    raise ValueError(f"{fn}: k {k.shape} and v {v.shape} must agree in batch, "
                     "length and kv heads")
  if k.shape[3] != dh:
    raise ValueError(f"{fn}: q and k head widths differ: q {q.shape}, "
                     f"k {k.shape}")
  if h % k.shape[2]:
    raise ValueError(f"{fn}: kv heads K={k.shape[2]} must divide query heads "
                     f"H={h}")
  target = (b, h, tq, k.shape[1])
  _check_broadcast("mask", mask, target, boolean=True, fn=fn)
  _check_broadcast("bias", bias, target, boolean=False, fn=fn)
  check_implementation(implementation, fn)
  score_rules.check(rules, batch=b, q_len=tq, kv_len=k.shape[1],
                    num_heads=h, fn=fn)
  if implementation in ("xla", "cudnn"):
    xla.check_rules(rules, implementation, fn)
  if implementation == "cudnn" and jax.default_backend() == "gpu":
    why = auto.cudnn_problem(q, k, v, mask=mask, bias=bias,
                             is_causal=is_causal)
    if why is not None:
      raise ValueError(f"{fn}: implementation='cudnn' cannot take this call: "
                       f"{why}; use 'auto', 'flash' or 'xla'")
  if implementation in DENSE_PATHS:
    itemsize = jnp.dtype(q.dtype).itemsize if implementation == "xla" else 4
    device_memory.check_dense_scores(implementation, target, itemsize, fn)
  user = [n for n in score_rules.USER_FIELDS if getattr(rules, n) is not None]
  if user and implementation not in USER_RULE_PATHS:
    raise ValueError(f"{fn}: implementation={implementation!r} does not "
                     f"apply user rules (`{user[0]}`); use one of "
                     f"{sorted(USER_RULE_PATHS)}")


def attend(q, k, v, *, mask=None, bias=None, is_causal=False,
           implementation=DEFAULT_IMPLEMENTATION, dropout_rate=0.0,
           dropout_rng=None, hooks=hooks_lib.NO_HOOKS,
           rules=score_rules.NO_RULES):
  """Stage 3 for all heads: q `[B,Tq,H,Dh]`, k `[B,Tk,K,Dh]`, v `[B,Tk,K,Dv]`.

  Query head i reads kv head `i // (H // K)`. `mask` (bool) and `bias`
  (float) broadcast to `[B, H, Tq, Tk]`. `is_causal` adds the rule of
  `causal_mask(Tq, Tk)` without the caller building it. Dropout (rate > 0
  needs `dropout_rng`) zeroes weights after the softmax and rescales the rest;
  the same keep pattern is used by every implementation. `hooks` (see
  `mha_jax.hooks`) may read or replace the `scores` and `pattern` sites on
  the paths that form them. `rules` (`score_rules.ScoreRules`): local
  window, segment ids, soft cap, sinks, scale, ALiBi, query positions and
  the user rules `score_mod` / `mask_mod` / `block_mask`
  (docs/score_rules.md); all of them on "vmap", "einsum" and "flash", what
  jax.nn supports natively on "xla"/"cudnn" (the rest is refused naming
  the option; user rules by every path outside `USER_RULE_PATHS`).
  Paths added with `register` run too (the package registers its
  context-parallel ones; docs/multi_device.md).
  Returns `(out [B, Tq, H, Dv], pattern [B, H, Tq, Tk] float32)`; the
  pattern is None on the paths in `WEIGHTLESS`.
  """
  check_attend_inputs(q, k, v, mask, bias, implementation, rules=rules,
                      is_causal=is_causal)
  if implementation in WEIGHTLESS and any(
      hooks.wants(s) for s in hooks_lib.WEIGHT_SITES):
    raise ValueError(f"attend: {weightless_reason(implementation)}")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"attend: `dropout_rate` must be in [0, 1), got "
                     f"{dropout_rate}")
  keep = None
  if dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("attend: `dropout_rate` > 0 needs `dropout_rng`")
    shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])  # [B,H,Tq,Tk]
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, shape)
  extra = {} if implementation in WEIGHTLESS else {"hooks": hooks}
  path = IMPLEMENTATIONS.get(implementation) or REGISTERED[implementation]
  return path(
      q, k, v, mask, bias, keep, is_causal=is_causal,
      dropout_rate=dropout_rate, rules=rules, **extra)
