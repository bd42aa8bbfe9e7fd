"""What every part of the GPU benchmark shares: the device, the three
precisions, torch's settings and synchronisation, the time budget.

The precisions, named as the config names them:

- "exact": float32 at mha_jax's policy (mha_jax.core.precision): every
  float32 matmul exact, no context; torch with `allow_tf32` False (its
  default).
- "tf32": float32 with both libraries opted into TF32: mha_jax inside
  `jax.default_matmul_precision("tensorfloat32")`, torch with
  `torch.backends.cuda.matmul.allow_tf32 = True`.
- "bf16": mixed precision: bf16 computation with float32 parameters and
  optimizer state (mha_jax: the model's `dtype` "bfloat16"; torch:
  `torch.autocast(..., dtype=torch.bfloat16)`).

On a CPU, "tf32" changes nothing in either library (both compute float32
matmuls exactly there).

torch is optional (the test extra installs it): `torch_or_reason` gives
the module or why it is missing. torch runs on CUDA when JAX runs on a
GPU and torch has CUDA, else on the CPU (the report says when the two
differ); each torch call a timer sees ends with `sync`, since CUDA
kernels run after the Python call returns (JAX's calls end in
`block_until_ready`, `mha_jax.measure.timing`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import time

import jax


@dataclasses.dataclass(frozen=True)
class Precision:
  name: str
  label: str
  jax_setting: str | None  # jax.default_matmul_precision(...) or None
  dtype: str  # the model's compute dtype
  torch_tf32: bool  # torch.backends.cuda.matmul.allow_tf32
  autocast: bool  # torch.autocast to bfloat16


PRECISIONS = {
    "exact": Precision("exact", "float32, exact (the policy's default)",
                       None, "float32", False, False),
    "tf32": Precision("tf32", "float32, TF32 (both opted in)",
                      "tensorfloat32", "float32", True, False),
    "bf16": Precision("bf16", "bf16 compute, float32 parameters", None,
                      "bfloat16", False, True),
}


def names(text: str) -> list[str]:
  """Comma-separated names of a config field ("" -> none)."""
  return [t.strip() for t in str(text).split(",") if t.strip()]


def precisions(text: str) -> list[Precision]:
  """The `Precision`s a comma-separated config field names."""
  bad = [n for n in names(text) if n not in PRECISIONS]
  if bad:
    raise ValueError(f"precisions: unknown {bad}; expected names from "
                     f"{list(PRECISIONS)}")
  return [PRECISIONS[n] for n in names(text)]


def jax_context(p: Precision):
  """JAX's matmul setting for `p` (no change for the policy's default)."""
  if p.jax_setting is None:
    return contextlib.nullcontext()
  return jax.default_matmul_precision(p.jax_setting)


def torch_or_reason():
  """`(torch, None)`, or `(None, why)` where torch cannot be imported."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None, "torch is not importable here (the test extra has it)"
  return torch, None


def torch_device(torch) -> str:
  """"cuda" where JAX runs on a GPU and torch sees a CUDA device, else
  "cpu": the device JAX computes on, where torch has it."""
  on_gpu = jax.default_backend() == "gpu" and torch.cuda.is_available()
  return "cuda" if on_gpu else "cpu"


@contextlib.contextmanager
def torch_settings(torch, p: Precision):
  """torch's TF32 switch for `p` while inside; the old value after."""
  old = torch.backends.cuda.matmul.allow_tf32
  torch.backends.cuda.matmul.allow_tf32 = p.torch_tf32
  try:
    yield
  finally:
    torch.backends.cuda.matmul.allow_tf32 = old


def autocast(torch, p: Precision, device: str):
  """`torch.autocast(device, bfloat16)` for "bf16", else no change."""
  if not p.autocast:
    return contextlib.nullcontext()
  return torch.autocast(device_type=device, dtype=torch.bfloat16)


def sync(torch, device: str):
  """Wait for the device's queued kernels (CUDA); nothing on a CPU."""
  if device == "cuda":
    torch.cuda.synchronize()


def facts() -> dict:
  """The machine, device and versions the numbers come from."""
  import flax  # pylint: disable=import-outside-toplevel
  d = jax.devices()[0]
  out = {"date": datetime.date.today().isoformat(),
         "jax_backend": jax.default_backend(),
         "jax_device": getattr(d, "device_kind", d.platform),
         "jax_device_count": jax.device_count(),
         "jax": jax.__version__, "flax": flax.__version__,
         "cpu_count": os.cpu_count()}
  torch, why = torch_or_reason()
  if torch is None:
    out["torch"] = why
    return out
  device = torch_device(torch)
  out.update(torch=torch.__version__, torch_device=device,
             torch_device_name=(torch.cuda.get_device_name(0)
                                if device == "cuda" else "cpu"))
  try:
    import transformers  # pylint: disable=import-outside-toplevel
    out["transformers"] = transformers.__version__
  except ImportError:
    out["transformers"] = "not importable here"
  return out


class Budget:
  """A deadline on `time.monotonic()`: a part asks `reason()` before each
  case, which is None while time is left, else the sentence the report
  records for a case skipped."""

  def __init__(self, seconds: float, what: str):
    self.seconds = float(seconds)
    self.what = what
    self.deadline = time.monotonic() + self.seconds

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def reason(self) -> str | None:
    if self.left() > 0:
      return None
    return (f"skipped: {self.what}'s share of the time budget "
            f"({self.seconds:.0f} s of config.budget_s) was spent")
