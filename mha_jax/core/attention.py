"""Stage 3 of the seed for all heads: `attend`, its paths and their checks.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads (K divides H), Dh per-head query/key width, Dv per-head
value width.

`attend` validates a call, then runs the path named by `implementation`.
Each path is one `attention_path.AttentionPath` record beside its
function: the reference paths in `reference.py` ("vmap", "einsum"), the
kernels in `kernels/` ("flash", "xla", "cudnn", "pallas_tpu",
"pallas_gpu"), and
"auto" below, which runs the one `kernels/auto.py` picks. `PATHS` lists
the core's own; `register` adds a record from a layer above (the
package's `__init__` registers the context-parallel paths). Validation, the refusals, the hook sites and the memory
check read the record, so a new path is its function and its record.
The one-head function and the softmax are `reference.py`'s and
`softmax.py`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax import hooks as hooks_lib
from mha_jax.core import attention_path
from mha_jax.core import device_memory
from mha_jax.core import reference
from mha_jax.core import score_rules
from mha_jax.core.kernels import auto
from mha_jax.core.kernels import call as call_lib
from mha_jax.core.kernels import flash
from mha_jax.core.kernels import pallas
from mha_jax.core.kernels import pallas_gpu
from mha_jax.core.kernels import xla


def choose_implementation(q, k, *, dropout=False, backend=None):
  """What "auto" runs for q and k (v shaped like k, no mask or bias): the
  fastest path that keeps the reference semantics. The rules, and why
  each faster kernel is passed over, are in `mha_jax.core.kernels.auto`.

  Measured with `python -m experiments.benchmark` on CPU, the blockwise path
  is the fastest at every shape tried (it also never forms [Tq, Tk]).
  Dropout needs the weights, so it goes to "einsum". On GPU cuDNN's fused
  kernel where it supports the call, then the Pallas GPU kernel, on TPU (where an adapter exists) JAX's
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
  chosen = PATHS[auto.select_for(q, k, v, mask=mask, bias=bias,
                                 is_causal=is_causal,
                                 dropout=keep is not None,
                                 rules=rules).implementation]
  extra = {"hooks": hooks_lib.NO_HOOKS} if chosen.forms_weights else {}
  out, _ = chosen.fn(q, k, v, mask, bias, keep, is_causal=is_causal,
                     dropout_rate=dropout_rate, rules=rules, **extra)
  return out, None


AUTO = attention_path.AttentionPath(
    name="auto", fn=_attend_auto, dropout=True,
    computes="the fastest path that takes the call (kernels/auto.py; "
    "mha_jax.explain_auto says which and why)")
# The core's own paths, by name.
PATHS = {p.name: p for p in (reference.VMAP, reference.EINSUM, flash.FLASH,
                             xla.XLA, xla.CUDNN, pallas.PALLAS_TPU,
                             pallas_gpu.PALLAS_GPU, AUTO)}
# The library's default path (the pure functions, `AttentionSpec`,
# `ModelConfig`): the reference, the seed's one head mapped over heads,
# which every other path is tested against.
DEFAULT_IMPLEMENTATION = "vmap"
# The one other default, for one reason: a caller that runs a whole model
# for its outputs at real sizes (`load_pretrained`; the experiments'
# default config says the same) takes the faster of the two paths that
# still form every hook site. Same numbers up to float rounding.
RUN_IMPLEMENTATION = "einsum"
# Paths a layer above the core added with `register`.
_REGISTERED: dict[str, attention_path.AttentionPath] = {}


def register(path: attention_path.AttentionPath) -> None:
  """Add the `attend` path of the record `path`, for paths that need more
  than the core has (a mesh): the core then dispatches to them without
  importing or naming them."""
  if not isinstance(path, attention_path.AttentionPath):
    raise TypeError(f"register: `path` must be an AttentionPath record, got "
                    f"{type(path).__name__}")
  if path.name in PATHS:
    raise ValueError(f"register: {path.name!r} is one of the core's own "
                     "implementations")
  _REGISTERED[path.name] = path


def all_paths() -> dict[str, attention_path.AttentionPath]:
  """Every path `attend` runs, by name: the core's and the registered."""
  return {**PATHS, **_REGISTERED}


def implementation_problem(name) -> str | None:
  """The one rule for an implementation name: None for a known one, else
  what was expected and what came (for `check_implementation` and
  `ModelConfig`'s field error)."""
  if name in PATHS or name in _REGISTERED:
    return None
  return (f"unknown `implementation`={name!r}; expected one of "
          f"{sorted(PATHS) + sorted(_REGISTERED)}")


def known_implementation(name) -> bool:
  """True for a path `attend` runs (`all_paths()`)."""
  return implementation_problem(name) is None


def check_implementation(name, fn: str = "attend") -> None:
  """Raise a ValueError naming `fn` unless `name` is a known path."""
  problem = implementation_problem(name)
  if problem is not None:
    raise ValueError(f"{fn}: {problem}")


def path_of(name, fn: str = "attend") -> attention_path.AttentionPath:
  """The record of the path `name`; an unknown name raises naming `fn`."""
  check_implementation(name, fn)
  return all_paths()[name]


def forms_weights(implementation) -> bool:
  """Whether `implementation` forms the weights and has the `scores` /
  `pattern` hook sites (False for an unknown name)."""
  path = all_paths().get(implementation)
  return path is not None and path.forms_weights


def weightless_reason(implementation: str) -> str:
  """Why `scores`/`pattern` do not exist on `implementation`, and the way
  out; used by every error that refuses them."""
  formers = " or ".join(repr(n) for n, p in all_paths().items()
                       if p.forms_weights)
  return (f"implementation={implementation!r} never forms the attention "
          f"weights (scores/pattern); use implementation={formers} to read "
          "or patch them (for a model: "
          "`transformer.with_implementation(model, 'einsum')`, same "
          "weights)")


def check_attend_inputs(q, k, v, mask, bias, implementation, fn="attend",
                        rules=score_rules.NO_RULES, is_causal=False,
                        dropout=False):
  """Validate head-split inputs; raise naming the argument. Returns nothing.

  What the path `implementation` can take is its record's: the rule
  options, dropout, the backend, its limits on shapes and dtypes, the
  memory its dense scores need."""
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
  reference.check_broadcast("mask", mask, target, boolean=True, fn=fn)
  reference.check_broadcast("bias", bias, target, boolean=False, fn=fn)
  path = path_of(implementation, fn)
  score_rules.check(rules, batch=b, q_len=tq, kv_len=k.shape[1],
                    num_heads=h, fn=fn)
  why = attention_path.refusal(path, all_paths(), rules=rules.active(),
                               dropout=dropout,
                               backend=jax.default_backend())
  if why is not None:
    raise ValueError(f"{fn}: {why}")
  if path.limits is not None:
    call = call_lib.Call.of(q, k, v, mask=mask, bias=bias,
                            is_causal=is_causal, rules=rules.active())
    why = path.limits(call, call_lib.this_device())
    if why is not None:
      raise ValueError(f"{fn}: implementation={implementation!r} cannot take "
                       f"this call: {why}; use 'auto' or 'flash'")
  itemsize = path.score_itemsize(jnp.dtype(q.dtype).itemsize)
  if itemsize is not None:
    device_memory.check_dense_scores(implementation, target, itemsize, fn)


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
  (docs/score_rules.md); all of them on "vmap", "einsum" and "flash", on
  the others what their record lists (the rest is refused naming the
  option). Paths added with `register` run too (the package registers its
  context-parallel ones; docs/multi_device.md).
  Returns `(out [B, Tq, H, Dv], pattern [B, H, Tq, Tk] float32)`; the
  pattern is None on the paths that do not form the weights.
  """
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"attend: `dropout_rate` must be in [0, 1), got "
                     f"{dropout_rate}")
  check_attend_inputs(q, k, v, mask, bias, implementation, rules=rules,
                      is_causal=is_causal, dropout=dropout_rate > 0.0)
  path = all_paths()[implementation]
  if not path.forms_weights and any(
      hooks.wants(s) for s in hooks_lib.WEIGHT_SITES):
    raise ValueError(f"attend: {weightless_reason(implementation)}")
  keep = None
  if dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("attend: `dropout_rate` > 0 needs `dropout_rng`")
    shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])  # [B,H,Tq,Tk]
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, shape)
  extra = {"hooks": hooks} if path.forms_weights else {}
  return path.fn(q, k, v, mask, bias, keep, is_causal=is_causal,
                 dropout_rate=dropout_rate, rules=rules, **extra)
