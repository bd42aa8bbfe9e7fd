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
them). What each kernel can take is its record's `limits` (the same
words `attend` refuses a call with): cuDNN's are JAX's own
(`xla.cudnn_limits`), the splash adapter's `pallas.limits`, the Pallas
GPU kernel's `pallas_gpu.limits` (what its Triton lowering takes: one
dtype, power-of-two widths of 16-256, no dense mask or bias) and, for its
user rules, the primitives Triton lowers and a block mask's blocks
(`pallas_gpu_plan.rules_problem`, passed in as `Call.rule_problem`).
That kernel is taken on a CUDA GPU whenever cuDNN cannot take the call
(a user rule, float32, a head width or a causal alignment cuDNN lacks),
ahead of xla and flash; its speed there is not yet measured
(experiments/gpu_bench/flex.py is ready to).
The score-rule options (`ScoreRules.active()`, passed as `rules`) each
kernel's adapter takes are its record's (`attention_path.AttentionPath.
rules_for_auto`); any other option sends the call to the blockwise path,
which takes them all.
"""

from __future__ import annotations

import dataclasses

from mha_jax.core import reference
from mha_jax.core.kernels import call as call_lib
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
# The call's facts: public as `auto.Call`, the type `select` takes.
Call = call_lib.Call


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


def _fallback(ruled_out, call: Call, device, available) -> AutoChoice:
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
  elif xla.XLA.limits(call, device):
    ruled_out.append(("xla", xla.XLA.limits(call, device)))
  elif "xla" in available:
    return AutoChoice("xla", "jax.nn.dot_product_attention's XLA path: the "
                      f"float32 scores ({gib:.2g} GiB) fit in 1 GiB",
                      tuple(ruled_out))
  else:
    ruled_out.append(("xla", "not among the available implementations"))
  return AutoChoice("flash", flash.FLASH.computes, tuple(ruled_out))


def _pallas_gpu_reason(call: Call, device) -> str | None:
  """Why the Pallas GPU kernel cannot take the call (None: it can)."""
  if not device.cudnn:
    return ("it is written for Triton on CUDA GPUs (not tried elsewhere), "
            "and this is not a CUDA device")
  return (_rules_reason("pallas_gpu", call.rules)
          or pallas_gpu.PALLAS_GPU.limits(call, device) or call.rule_problem)


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

  device = call_lib.Device(backend, cudnn, gpu_capability)
  ruled_out = []
  if backend == "gpu":
    why = _rules_reason("cudnn", call.rules) or xla.CUDNN.limits(call, device)
    if why is None and "cudnn" in available:
      return AutoChoice("cudnn", "cuDNN's fused attention supports this "
                        "call (dtype, head width, mask/bias, causal)")
    ruled_out.append(("cudnn", why or "not among the available "
                      "implementations"))
    why = _pallas_gpu_reason(call, device)
    if why is None and "pallas_gpu" in available:
      return AutoChoice("pallas_gpu", "the Pallas GPU kernel takes the call "
                        "cuDNN cannot (the user rules traced in, the block "
                        "mask's empty blocks skipped; its GPU speed is not "
                        "yet measured)", tuple(ruled_out))
    ruled_out.append(("pallas_gpu", why or "not among the available "
                      "implementations"))
  elif backend == "tpu":
    why = (_rules_reason("pallas_tpu", call.rules)
           or pallas.PALLAS_TPU.limits(call, device))
    if why is None and "pallas_tpu" in available:
      return AutoChoice("pallas_tpu", "JAX's Pallas TPU splash attention "
                        "supports this call (causal/window masks skip "
                        "blocks, GQA without repeating k/v)")
    ruled_out.append(("pallas_tpu", why or "not among the available "
                      "implementations"))
  return _fallback(ruled_out, call, device, available)


def select_for(q, k, v, *, mask=None, bias=None, is_causal=False,
               dropout=False, weights=False, backend=None,
               rules=()) -> AutoChoice:
  """`select` for arrays (or `jax.ShapeDtypeStruct`s) laid out as `attend`
  takes them (see `Call.of`). `rules`: the option names in use, or the
  `score_rules.ScoreRules` itself (then, on a GPU, its user rules are
  checked for the Pallas GPU kernel's lowering). `backend` defaults to
  JAX's default; on a GPU the cuDNN facts are read from the device."""
  device = call_lib.this_device(backend)
  problem = None
  if hasattr(rules, "active"):  # a ScoreRules
    if device.backend == "gpu":
      problem = pallas_gpu_plan.rules_problem(rules)
    rules = rules.active()
  call = Call.of(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                 dropout=dropout, weights=weights, rules=rules,
                 rule_problem=problem)
  return select(device.backend, call, gpu_capability=device.capability,
                cudnn=device.cudnn)


def explain_auto(q, k, v=None, *, mask=None, bias=None, is_causal=False,
                 dropout_rate=0.0, weights=False, backend=None,
                 rules=()) -> AutoChoice:
  """What `attend(q, k, v, implementation="auto", ...)` would run, and why
  each faster kernel was ruled out. `print(explain_auto(...))` reads well.

  Takes what `attend` takes (arrays or `jax.ShapeDtypeStruct`s): q
  `[B,Tq,H,Dh]`, k `[B,Tk,K,Dh]`, v `[B,Tk,K,Dv]` (default: k), mask/bias
  broadcastable to `[B,H,Tq,Tk]`; `weights=True` asks which path forms the
  weights. `backend` ("cpu", "gpu", "tpu") defaults to JAX's; asked about a
  GPU from another machine, a CUDA GPU with cuDNN and an unknown compute
  capability are assumed. `rules`: the call's `score_rules.ScoreRules`
  (or the names of its options), as `attend` takes it: a user rule
  changes the choice on a GPU (cuDNN takes none; the Pallas GPU kernel
  takes those Triton can lower).
  """
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"explain_auto: `dropout_rate` must be in [0, 1), got "
                     f"{dropout_rate}")
  return select_for(q, k, k if v is None else v, mask=mask, bias=bias,
                    is_causal=is_causal, dropout=dropout_rate > 0.0,
                    weights=weights, backend=backend, rules=rules)
