"""What float32 means in mha_jax's matmuls: exact, unless you ask for less.

Every matmul and einsum of the library (projections, attention scores and
values on every path, MLPs, the unembedding, the SAE, the interpretability
views) takes its `precision` from `dot_precision`, so one setting governs
them all:

- By default a dot whose operands are float32 (or float64) runs at
  `lax.Precision.HIGHEST`: exact float32, as in PyTorch, whose
  `torch.backends.cuda.matmul.allow_tf32` is False unless asked. JAX's own
  default is the fastest the hardware has: TF32 on NVIDIA GPUs since
  Ampere (10 mantissa bits; 5e-4 to 8e-4 relative error in attention
  outputs on an H200, docs/precision.md), bf16 passes on TPUs. A patched and a clean run, or our logits
  and transformers', would then differ by that noise.
- The one place to change it is JAX's own setting, which the library
  follows whenever it is set: the context
  `with jax.default_matmul_precision("tensorfloat32"):` (or "bfloat16",
  "float32", "highest", ...), `jax.config.update(
  "jax_default_matmul_precision", ...)`, or the environment variable
  `JAX_DEFAULT_MATMUL_PRECISION`. Experiment configs carry it as the field
  `matmul_precision`. It is part of the key under which `jax.jit` caches
  its programs, so a function jitted under one setting is traced again
  under another, never silently reused.
- bf16 and f16 operands are left to JAX (`None`): their products are
  exact in the float32 accumulation, and HIGHEST would only ask some
  backends for slower algorithms.

The setting is read when a function is traced; a CPU computes float32
matmuls exactly whatever it says. `tests/core/test_precision.py` reads the
precision field of every dot in the lowered programs of the models'
forward and backward passes, so a dot that escapes the policy fails it.
"""

import contextlib

import jax
from jax import lax
import jax.numpy as jnp

_EXACT_DTYPES = (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128)
# The names a config's `matmul_precision` field takes: "" (the library's
# exact default) or one of `jax.default_matmul_precision`'s.
SETTINGS = ("", "default", "high", "highest", "bfloat16", "tensorfloat32",
            "float32")


def user_setting() -> str | None:
  """JAX's matmul precision when the user has set it (by context, config
  or environment variable), else None: the library's exact default."""
  return jax.config.jax_default_matmul_precision


def dot_precision(*operands) -> lax.Precision | None:
  """The `precision=` for a dot of `operands` under the policy (module
  docstring): None (JAX's setting) when the user set one or the operands
  are narrower than float32, else `lax.Precision.HIGHEST`."""
  if user_setting() is not None:
    return None
  dtype = jnp.result_type(*operands)
  return lax.Precision.HIGHEST if dtype in _EXACT_DTYPES else None


def einsum(subscripts: str, *operands, **kwargs):
  """`jnp.einsum` at the policy's precision."""
  return jnp.einsum(subscripts, *operands,
                    precision=dot_precision(*operands), **kwargs)


def matmul(a, b):
  """`a @ b` at the policy's precision."""
  return jnp.matmul(a, b, precision=dot_precision(a, b))


def tensordot(a, b, axes):
  """`jnp.tensordot` at the policy's precision."""
  return jnp.tensordot(a, b, axes, precision=dot_precision(a, b))


def dot_general(lhs, rhs, dimension_numbers, precision=None, **kwargs):
  """`lax.dot_general` at the policy's precision when the caller gives
  none: the `dot_general=` of the models' `nnx.Linear` layers, which
  otherwise trace their dots at JAX's default."""
  if precision is None:
    precision = dot_precision(lhs, rhs)
  return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                         **kwargs)


def scope(*operands):
  """A context in which code that is not ours (`jax.nn.
  dot_product_attention`) traces its dots at the policy's precision:
  `jax.default_matmul_precision("highest")` for float32 operands when the
  user has set nothing, else no change."""
  if dot_precision(*operands) == lax.Precision.HIGHEST:
    return jax.default_matmul_precision("highest")
  return contextlib.nullcontext()


def setting_context(name: str | None):
  """`jax.default_matmul_precision(name)`, or no change for None or "":
  how an experiment's `matmul_precision` config field is applied."""
  if not name:
    return contextlib.nullcontext()
  return jax.default_matmul_precision(name)
