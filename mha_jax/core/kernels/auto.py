"""What `implementation="auto"` runs, and why: a pure function of the call.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads (K divides H; K < H is GQA), Dh per-head query/key width,
Dv per-head value width.

`select(backend, call)` looks only at facts known when a program is
traced: the backend and a `Call` (dtypes, shapes, which of mask/bias/
causal/dropout are present, whether the weights are wanted, the score
rules in use), checked once when it is made. So it runs without a device
and is unit-tested on CPU; `select_for` builds the `Call` from arrays.
It walks the candidates of a backend from the fastest down and keeps, for
each one it passes over, the reason in words:

  cpu  einsum (float32) -> flash once the float32 scores pass 32 MiB
  gpu  cudnn (no user rule) -> pallas_gpu -> xla, or flash once the
       float32 scores pass 1 GiB
  tpu  pallas_tpu -> xla, or flash once the float32 scores pass 1 GiB

Dropout needs the weights, so every backend sends it to "einsum"; asking
for the weights also means "einsum" (the faster of the two paths that form
them). The limits below are JAX's own (jax 0.10):
  * cuDNN (`jax.nn.dot_product_attention(implementation="cudnn")`):
    `check_layout` and `check_is_flash_attention` in
    jax/_src/cudnn/fused_attention_stablehlo.py, and `is_causal` of
    `dot_product_attention` in jax/_src/nn/functions.py.
  * Pallas TPU splash attention (jax/experimental/pallas/ops/tpu/
    splash_attention), through `mha_jax.core.kernels.pallas`, whose
    `unsupported` states what the adapter takes.
  * The Pallas GPU kernel (`mha_jax.core.kernels.pallas_gpu`): what its
    Triton lowering takes (`pallas_gpu_plan.unsupported`: one dtype,
    power-of-two widths of 16-256, no dense mask or bias) and, for the
    user rules, the primitives it lowers (`untraceable`, passed in as
    `Call.rule_problem`). Taken on a CUDA GPU whenever cuDNN cannot take
    the call (a user rule, float32, a head width or a causal alignment
    cuDNN lacks), ahead of xla and flash. Its speed there is not yet
    measured (experiments/gpu_bench/flex.py is ready to).
The score-rule options (`ScoreRules.active()`, passed as `rules`) each
kernel's adapter takes are its record's (`attention_path.AttentionPath.
rules_for_auto`); any other option sends the call to the blockwise path,
which takes them all.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from mha_jax.core import reference
from mha_jax.core.kernels import flash
from mha_jax.core.kernels import pallas
from mha_jax.core.kernels import pallas_gpu
from mha_jax.core.kernels import pallas_gpu_plan
from mha_jax.core.kernels import xla

# The paths `auto` may dispatch to, by name: what each takes (its rule
# options, `rules_for_auto`) and what it computes is read from its record.
# The order in which they are tried on each backend is `select`'s policy.
CANDIDATES = {p.name: p for p in (reference.EINSUM, flash.FLASH, xla.XLA,
                                  xla.CUDNN, pallas.PALLAS_TPU,
                                  pallas_gpu.PALLAS_GPU)}
ADAPTED = frozenset(CANDIDATES)


def _rules_reason(candidate, rules) -> str | None:
  """Why `candidate` cannot take the score rules in use (None: it can)."""
  takes = CANDIDATES[candidate].rules_for_auto
  missing = [r for r in rules if r not in takes]
  if not missing:
    return None
  return (f"mha_jax's adapter to it does not take {', '.join(missing)} "
          "(the blockwise path does)")


# Above this many bytes of float32 scores [B, H, Tq, Tk], a path that forms
# them (xla) gives way to the blockwise one, whose memory is O(T).
SCORE_BYTES_LIMIT = 2 ** 30
# On CPU, up to this many bytes of float32 scores the dense einsum path
# took 0.53-0.84x the blockwise path's forward+backward time and 0.78-1.11x
# its forward (two runs, 8 and 32 MiB, causal or not); from 64 MiB the
# blockwise forward was faster under a causal mask (1.2-1.4x at 64 MiB,
# 1.4-4.5x at 128-512), and its memory is O(T) (python -m
# experiments.benchmark.dense_vs_blockwise; docs/performance.md).
CPU_DENSE_SCORE_BYTES = 32 * 2 ** 20
_HALF = frozenset({"float16", "bfloat16"})
# Pallas TPU flash attention tiles q and k in blocks of 128
# (BlockSizes.get_default, MIN_BLOCK_SIZE).
_TPU_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class AutoChoice:
  """The answer of `select`.

  Attributes:
    implementation: the `attend` implementation `auto` runs.
    reason: why that one, in words.
    ruled_out: `(candidate, why)` for every faster candidate passed over,
      fastest first.
  """
  implementation: str
  reason: str
  ruled_out: tuple[tuple[str, str], ...] = ()

  def __str__(self) -> str:
    lines = [f"auto -> {self.implementation!r}: {self.reason}"]
    lines += [f"  not {name!r}: {why}" for name, why in self.ruled_out]
    return "\n".join(lines)


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
    rule_problem: why the call's user rules cannot be compiled into the
      Pallas GPU kernel (`pallas_gpu.untraceable`), None when they can
      or there are none.
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


def _cpu_choice(call: Call, available) -> AutoChoice:
  """float32 einsum while the scores fit in CPU_DENSE_SCORE_BYTES, flash
  beyond; its weights are formed but not returned (`auto` is weightless).
  Lower precisions were not measured and keep the blockwise path."""
  nbytes, dtypes = call.score_bytes, call.dtypes
  mib, limit = nbytes / 2 ** 20, CPU_DENSE_SCORE_BYTES / 2 ** 20
  if set(dtypes) != {"float32"}:
    why = ("the CPU comparison was measured in float32 only "
           f"(q, k, v: {', '.join(dtypes)})")
  elif nbytes > CPU_DENSE_SCORE_BYTES:
    why = (f"it forms the float32 scores [B, H, Tq, Tk] ({mib:.3g} MiB > "
           f"{limit:.0f} MiB), where the blockwise forward is faster under "
           "a causal mask and its memory O(T)")
  elif "einsum" not in available:
    why = "not among the available implementations"
  else:
    return AutoChoice("einsum", "on CPU the dense path is faster forward+"
                      "backward than the blockwise one while the float32 "
                      f"scores fit in {limit:.0f} MiB ({mib:.3g} MiB here; "
                      "python -m experiments.benchmark.dense_vs_blockwise)")
  return AutoChoice("flash", flash.FLASH.computes, (("einsum", why),))


def _fallback(ruled_out, call: Call, available) -> AutoChoice:
  """The accelerator rule without a fused kernel: xla while the float32
  scores fit in 1 GiB, flash beyond (and where jax.nn cannot take the call).
  """
  nbytes = call.score_bytes
  gib = nbytes / 2 ** 30
  if _rules_reason("xla", call.rules):
    ruled_out.append(("xla", _rules_reason("xla", call.rules)))
  elif nbytes > SCORE_BYTES_LIMIT:
    ruled_out.append(("xla", f"it forms the float32 scores [B, H, Tq, Tk] "
                      f"({gib:.1f} GiB > 1 GiB)"))
  elif call.value_width != call.head_dim:
    ruled_out.append(("xla", "mha_jax's jax.nn.dot_product_attention "
                      "adapter needs value width Dv == Dh"))
  elif len(set(call.dtypes)) != 1:
    ruled_out.append(("xla", "jax.nn.dot_product_attention needs one dtype "
                      "for q, k and v"))
  elif "xla" in available:
    return AutoChoice("xla", "jax.nn.dot_product_attention's XLA path: the "
                      f"float32 scores ({gib:.2g} GiB) fit in 1 GiB",
                      tuple(ruled_out))
  else:
    ruled_out.append(("xla", "not among the available implementations"))
  return AutoChoice("flash", flash.FLASH.computes, tuple(ruled_out))


def _cudnn_rules(call: Call, gpu_capability, cudnn):
  """Why cuDNN cannot take the call (None when it can)."""
  dtypes, head_dim = call.dtypes, call.head_dim
  q_len, kv_len = call.q_len, call.kv_len
  if not cudnn:
    return "no cuDNN on this GPU (not a CUDA device)"
  if len(set(dtypes)) != 1:
    return (f"q, k, v must share one dtype (check_layout), got "
            f"{', '.join(dtypes)}")
  if dtypes[0] not in _HALF:
    return (f"cuDNN's fused attention takes float16/bfloat16 only "
            f"(check_layout), got {dtypes[0]}")
  hopper = gpu_capability is not None and tuple(gpu_capability) >= (9, 0)
  h_max = 256 if hopper else 128
  if head_dim > h_max or head_dim % 8:
    where = ("compute capability >= 9.0" if hopper else
             "before compute capability 9.0" if gpu_capability is not None
             else "compute capability unknown, so the pre-Hopper limit")
    return (f"head width Dh={head_dim} must be <= {h_max} and a multiple of "
            f"8 ({where}; check_is_flash_attention)")
  if call.value_width != head_dim:
    return ("mha_jax's jax.nn.dot_product_attention adapter needs value "
            f"width Dv == Dh, got Dv={call.value_width}, Dh={head_dim}")
  if call.is_causal and q_len != kv_len:
    return (f"jax's is_causal is top-left aligned (tril of [Tq, Tk]); ours is "
            f"bottom-right, which differs when Tq={q_len} != Tk={kv_len} and "
            "would need a dense [Tq, Tk] mask, losing the kernel's causal "
            "block skipping")
  if call.masked:
    if call.trailing != (q_len, kv_len):
      return ("a mask/bias reaches cuDNN as a bias that must span [Tq, Tk] in "
              f"its last two axes (check_layout); these broadcast to "
              f"{call.trailing}")
    if q_len % 2 or kv_len % 2:
      return ("with a mask/bias cuDNN's backward needs even Tq and Tk "
              f"(check_is_flash_attention), got Tq={q_len}, Tk={kv_len}")
  return None


def _pallas_tpu_rules(call: Call):
  """Why the splash attention adapter cannot take the call (None: it can)."""
  head_dim = call.head_dim
  why = pallas.unsupported(
      q_len=call.q_len, kv_len=call.kv_len, head_dim=head_dim,
      value_dim=call.value_width, one_dtype=len(set(call.dtypes)) == 1,
      mask=call.mask_dims is not None, bias=call.bias_dims is not None)
  if why is None and head_dim > _TPU_BLOCK and head_dim % _TPU_BLOCK:
    why = (f"head width Dh={head_dim} above {_TPU_BLOCK} must be a multiple "
           f"of {_TPU_BLOCK} (the TPU's lane width)")
  return why


def _pallas_gpu_rules(call: Call, cudnn) -> str | None:
  """Why the Pallas GPU kernel cannot take the call (None: it can)."""
  if not cudnn:
    return ("it is written for Triton on CUDA GPUs (not tried elsewhere), "
            "and this is not a CUDA device")
  return (_rules_reason("pallas_gpu", call.rules)
          or pallas_gpu_plan.unsupported(
              head_dim=call.head_dim, value_dim=call.value_width,
              block_q=pallas_gpu.BLOCK_Q, block_k=pallas_gpu.BLOCK_K,
              dtypes=call.dtypes, mask=call.mask_dims is not None,
              bias=call.bias_dims is not None, interpret=False)
          or call.rule_problem)


def select(backend: str, call: Call, *, gpu_capability=None,
           cudnn: bool = True, available=ADAPTED) -> AutoChoice:
  """The implementation `auto` uses for one call, and why.

  Args:
    backend: "cpu", "gpu" or "tpu" (`jax.default_backend()`); any other
      name gets the accelerator rule without a fused kernel.
    call: the call's traced facts (`Call(...)`, or `Call.of(q, k, v)`).
    gpu_capability: (major, minor) CUDA compute capability; None: unknown
      (the cuDNN head-width limit of older GPUs is used).
    cudnn: the GPU is a CUDA device with cuDNN.
    available: the implementations that may be returned.
  Returns:
    `AutoChoice(implementation, reason, ruled_out)`.
  """
  if not isinstance(backend, str):
    raise TypeError(f"select: `backend` must be a string such as 'gpu', got "
                    f"{backend!r}")
  if not isinstance(call, Call):
    raise TypeError(f"select: `call` must be an auto.Call, got "
                    f"{type(call).__name__}")
  # The weightless candidates of this backend, fastest first.
  weightless = {"cpu": ["flash"],
                "gpu": ["cudnn", "pallas_gpu", "xla", "flash"],
                "tpu": ["pallas_tpu", "xla", "flash"]}.get(backend,
                                                           ["xla", "flash"])
  if call.weights or call.dropout:
    what = ("the weights (scores/pattern)" if call.weights else
            "dropout, which drops entries of the weights")
    why = "it never forms the weights" + (
        "" if call.weights else " (and jax.nn/Pallas kernels have no dropout)")
    return AutoChoice(
        "einsum", f"{what} exist only on 'vmap' and 'einsum'; einsum is the "
        "faster" + ("; `attend(implementation='auto')` refuses weight hooks, "
                    "pass implementation='einsum'" if call.weights else ""),
        tuple((n, why) for n in weightless))

  if backend == "cpu":
    return _cpu_choice(call, available)

  ruled_out = []
  if backend == "gpu":
    why = (_rules_reason("cudnn", call.rules)
           or _cudnn_rules(call, gpu_capability, cudnn))
    if why is None and "cudnn" in available:
      return AutoChoice("cudnn", "cuDNN's fused attention supports this "
                        "call (dtype, head width, mask/bias, causal)")
    ruled_out.append(("cudnn", why or "not among the available "
                      "implementations"))
    why = _pallas_gpu_rules(call, cudnn)
    if why is None and "pallas_gpu" in available:
      return AutoChoice("pallas_gpu", "the Pallas GPU kernel takes the call "
                        "cuDNN cannot (the user rules traced in, the block "
                        "mask's empty blocks skipped; its GPU speed is not "
                        "yet measured)", tuple(ruled_out))
    ruled_out.append(("pallas_gpu", why or "not among the available "
                      "implementations"))
  elif backend == "tpu":
    why = _rules_reason("pallas_tpu", call.rules) or _pallas_tpu_rules(call)
    if why is None and "pallas_tpu" in available:
      return AutoChoice("pallas_tpu", "JAX's Pallas TPU splash attention "
                        "supports this call (causal/window masks skip "
                        "blocks, GQA without repeating k/v)")
    ruled_out.append(("pallas_tpu", why or "not among the available "
                      "implementations"))
  return _fallback(ruled_out, call, available)


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


def _shape(x):
  """The shape of an array, tracer or `jax.ShapeDtypeStruct` (None: absent)."""
  if x is None:
    return None
  return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def select_for(q, k, v, *, mask=None, bias=None, is_causal=False,
               dropout=False, weights=False, backend=None,
               rules=()) -> AutoChoice:
  """`select` for arrays (or `jax.ShapeDtypeStruct`s) laid out as `attend`
  takes them (see `Call.of`). `rules`: the option names in use, or the
  `score_rules.ScoreRules` itself (then its user rules are checked for
  the Pallas GPU kernel's lowering). `backend` defaults to JAX's default;
  on a GPU the cuDNN facts are read from the device."""
  import jax  # pylint: disable=g-import-not-at-top
  problem = None
  if hasattr(rules, "active"):  # a ScoreRules
    backend = backend or jax.default_backend()
    if backend == "gpu":
      problem = pallas_gpu_plan.untraceable(rules)
    rules = rules.active()
  call = Call.of(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                 dropout=dropout, weights=weights, rules=rules,
                 rule_problem=problem)
  backend = backend or jax.default_backend()
  cudnn, capability = True, None  # asked about a GPU from elsewhere
  if backend == "gpu" and jax.default_backend() == "gpu":
    cudnn, capability = gpu_facts()
  return select(backend, call, gpu_capability=capability, cudnn=cudnn)


def cudnn_problem(q, k, v, *, mask=None, bias=None,
                  is_causal=False) -> str | None:
  """Why cuDNN cannot take this `attend` call on this process's GPU (None
  when it can): the rules `auto` applies, for `implementation="cudnn"`
  asked by name, which would otherwise fail deep inside jax.nn."""
  call = Call.of(q, k, v, mask=mask, bias=bias, is_causal=is_causal)
  cudnn, capability = gpu_facts()
  return _cudnn_rules(call, capability, cudnn)


def explain_auto(q, k, v=None, *, mask=None, bias=None, is_causal=False,
                 dropout_rate=0.0, weights=False, backend=None) -> AutoChoice:
  """What `attend(q, k, v, implementation="auto", ...)` would run, and why
  each faster kernel was ruled out. `print(explain_auto(...))` reads well.

  Takes what `attend` takes (arrays or `jax.ShapeDtypeStruct`s): q
  `[B,Tq,H,Dh]`, k `[B,Tk,K,Dh]`, v `[B,Tk,K,Dv]` (default: k), mask/bias
  broadcastable to `[B,H,Tq,Tk]`; `weights=True` asks which path forms the
  weights. `backend` ("cpu", "gpu", "tpu") defaults to JAX's; asked about a
  GPU from another machine, a CUDA GPU with cuDNN and an unknown compute
  capability are assumed.
  """
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"explain_auto: `dropout_rate` must be in [0, 1), got "
                     f"{dropout_rate}")
  return select_for(q, k, k if v is None else v, mask=mask, bias=bias,
                    is_causal=is_causal, dropout=dropout_rate > 0.0,
                    weights=weights, backend=backend)
