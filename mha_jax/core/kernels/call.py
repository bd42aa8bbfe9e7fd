"""The facts of one attention call, and of the device it runs on.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads (K divides H; K < H is GQA), Dh per-head query/key width,
Dv per-head value width.

A `Call` holds what is known when a program is traced (dtypes, shapes,
which of mask/bias/causal/dropout are present, the score rules in use);
a `Device` what the backend is and, on a GPU, whether it has cuDNN and
its compute capability. A path's record states its limits as a function
of the two (`AttentionPath.limits`), which `attend`'s validation and
`auto`'s choice both read (kernels/auto.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import numpy as np


def _dtype_name(dtype, name: str) -> str:
  try:
    return np.dtype(dtype).name
  except TypeError as e:
    raise TypeError(f"Call: `{name}` must be a dtype, got {dtype!r}") from e


def _trailing(shape, name: str):
  """A mask/bias given as False/True/shape -> None, or its (Tq?, Tk?) dims.

  True (shape unknown) is taken as spanning all of [Tq, Tk]: the caller
  that knows the shape (`attend`) always passes it.
  """
  if shape is None or shape is False:
    return None
  if shape is True:
    return "full"
  try:
    if isinstance(shape, str):
      raise TypeError(shape)
    dims = tuple(int(d) for d in shape)
  except (TypeError, ValueError) as e:
    raise TypeError(f"Call: `{name}` must be a bool or a shape, got "
                    f"{shape!r}") from e
  return ((1,) * 2 + dims)[-2:]


@dataclasses.dataclass(frozen=True)
class Call:
  """The facts of one attention call that `select` reads, all known when
  the program is traced. `Call.of(q, k, v, ...)` reads them off arrays.

  Attributes:
    q_dtype, k_dtype, v_dtype: dtypes of q, k, v (k, v default to q's).
    head_dim: Dh; value_dim: Dv (default Dh).
    q_len, kv_len: Tq, Tk. batch, num_heads: B, H (they size the scores).
    num_kv_heads: K (default H); K < H is GQA.
    mask, bias: False/None (absent), True (present, spanning [Tq, Tk]) or
      the shape (broadcastable to [B, H, Tq, Tk]).
    is_causal: bottom-right causal (`causal_mask(Tq, Tk)`).
    dropout: attention dropout is on. weights: the caller wants the
      weights (scores/pattern).
    rules: names of the `score_rules.ScoreRules` options in use
      (`ScoreRules.active()`); those jax.nn or Pallas cannot express send
      the call to the blockwise path.
    rule_problem: why the call's user rules (or its block mask's blocks)
      cannot be compiled into the Pallas GPU kernel
      (`pallas_gpu_plan.rules_problem`); None when they can or there are
      none.
  Every field is checked here, once; a bad one is an error naming it.
  """
  q_dtype: object
  head_dim: int
  q_len: int
  kv_len: int
  k_dtype: object = None
  v_dtype: object = None
  value_dim: int | None = None
  batch: int = 1
  num_heads: int = 1
  num_kv_heads: int | None = None
  mask: object = False
  bias: object = False
  is_causal: bool = False
  dropout: bool = False
  weights: bool = False
  rules: tuple[str, ...] = ()
  rule_problem: str | None = None

  def __post_init__(self):
    for name in ("head_dim", "q_len", "kv_len", "batch", "num_heads"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"Call: `{name}` must be >= 1, got "
                         f"{getattr(self, name)}")
    if self.kv_heads < 1 or self.num_heads % self.kv_heads:
      raise ValueError(f"Call: `num_kv_heads`={self.num_kv_heads} must "
                       f"divide num_heads={self.num_heads}")
    object.__setattr__(self, "rules", tuple(self.rules))
    self.dtypes  # pylint: disable=pointless-statement  (checks the dtypes)
    self.mask_dims, self.bias_dims  # pylint: disable=pointless-statement

  @classmethod
  def of(cls, q, k, v, *, mask=None, bias=None, is_causal=False,
         dropout=False, weights=False, rules=(),
         rule_problem=None) -> "Call":
    """The call `attend` makes on q `[B,Tq,H,Dh]`, k `[B,Tk,K,Dh]`, v
    `[B,Tk,K,Dv]` (arrays, tracers or `jax.ShapeDtypeStruct`s), mask/bias
    broadcastable to `[B,H,Tq,Tk]`."""
    for name, arr in (("q", q), ("k", k), ("v", v)):
      if len(getattr(arr, "shape", ())) != 4:
        raise ValueError(f"explain_auto: `{name}` must have rank 4 ([B, T, "
                         f"heads, dim]), got shape "
                         f"{getattr(arr, 'shape', arr)}")
    b, tq, h, dh = q.shape
    return cls(q_dtype=q.dtype, k_dtype=k.dtype, v_dtype=v.dtype,
               head_dim=dh, value_dim=v.shape[-1], q_len=tq,
               kv_len=k.shape[1], batch=b, num_heads=h,
               num_kv_heads=k.shape[2], mask=_shape(mask), bias=_shape(bias),
               is_causal=is_causal, dropout=dropout, weights=weights,
               rules=tuple(rules), rule_problem=rule_problem)

  @property
  def kv_heads(self) -> int:
    """K, with its default (H) applied."""
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def value_width(self) -> int:
    """Dv, with its default (Dh) applied."""
    return self.head_dim if self.value_dim is None else self.value_dim

  @property
  def dtypes(self) -> tuple[str, str, str]:
    """The dtype names of q, k, v."""
    q = _dtype_name(self.q_dtype, "q_dtype")
    return (q,
            q if self.k_dtype is None else _dtype_name(self.k_dtype,
                                                       "k_dtype"),
            q if self.v_dtype is None else _dtype_name(self.v_dtype,
                                                       "v_dtype"))

  @property
  def mask_dims(self):
    return _trailing(self.mask, "mask")

  @property
  def bias_dims(self):
    return _trailing(self.bias, "bias")

  @property
  def masked(self) -> bool:
    return self.mask_dims is not None or self.bias_dims is not None

  @property
  def trailing(self):
    """What reaches jax.nn's last two axes: mask, bias and (when a mask is
    given) the causal mask our adapter folds into it, broadcast together;
    None without mask or bias."""
    parts = [t for t in (self.mask_dims, self.bias_dims) if t is not None]
    if self.mask_dims is not None and self.is_causal:
      parts.append((self.q_len, self.kv_len))
    if "full" in parts:
      return (self.q_len, self.kv_len)
    return tuple(np.broadcast_shapes(*parts)) if parts else None

  @property
  def score_bytes(self) -> int:
    """Bytes of the float32 scores [B, H, Tq, Tk] a dense path forms."""
    return 4 * self.batch * self.num_heads * self.q_len * self.kv_len


class Device(NamedTuple):
  """The device facts a path's limits may read.

  Attributes:
    backend: "cpu", "gpu" or "tpu" (`jax.default_backend()`).
    cudnn: the GPU is a CUDA device with cuDNN (assumed when unknown).
    capability: (major, minor) CUDA compute capability; None: unknown.
  """
  backend: str
  cudnn: bool = True
  capability: tuple[int, int] | None = None


@functools.lru_cache(maxsize=None)
def gpu_facts() -> tuple[bool, tuple[int, int] | None]:
  """(cuDNN present, compute capability) of the first GPU of this process.

  A CUDA device reports its capability as "major.minor"; a ROCm one as a
  gfx name, and has no cuDNN. Read once: devices do not change in a process.
  """
  import jax  # pylint: disable=g-import-not-at-top
  try:
    text = jax.devices("gpu")[0].compute_capability
    major, minor = (int(x) for x in str(text).split(".")[:2])
  except (RuntimeError, AttributeError, ValueError, IndexError):
    return False, None
  return True, (major, minor)


def this_device(backend: str | None = None) -> Device:
  """The facts of this process's device for `backend` (default: JAX's).
  Asked about a GPU from a machine without one: a CUDA GPU with cuDNN
  and an unknown capability."""
  import jax  # pylint: disable=g-import-not-at-top
  backend = backend or jax.default_backend()
  if backend == "gpu" and jax.default_backend() == "gpu":
    cudnn, capability = gpu_facts()
    return Device(backend, cudnn, capability)
  return Device(backend)


def _shape(x):
  """The shape of an array, tracer or `jax.ShapeDtypeStruct` (None: absent)."""
  if x is None:
    return None
  return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
