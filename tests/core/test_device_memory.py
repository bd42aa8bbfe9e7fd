"""A dense path asked for by name is refused, naming the size, when its
scores alone cannot fit in the devices' memory; nothing is allocated."""

import jax
import jax.numpy as jnp
import pytest

import mha_jax
from mha_jax.core import device_memory

# B=1, H=8, n=2**17: the [B, H, n, n] scores are 2**37 entries, 512 GiB in
# float32 and 256 GiB in bf16, more than any one machine here or an H200
# (139 GiB) holds.
N = 2 ** 17
Q = jax.ShapeDtypeStruct((1, N, 8, 64), jnp.bfloat16)


def _trace(implementation, q=Q):
  return jax.eval_shape(
      lambda q: mha_jax.attend(q, q, q, is_causal=True,
                               implementation=implementation)[0], q)


@pytest.mark.parametrize("implementation, size", [
    ("einsum", "512.0 GiB at 4 bytes"),  # our dense paths: float32 scores
    ("vmap", "512.0 GiB at 4 bytes"),
    ("xla", "256.0 GiB at 2 bytes"),  # jax.nn's: at least q's dtype
])
def test_dense_scores_past_the_devices_memory_are_refused(implementation,
                                                          size):
  with pytest.raises(ValueError) as err:
    _trace(implementation)
  message = str(err.value)
  assert f"implementation={implementation!r}" in message
  assert f"[1 x 8 x {N} x {N}]" in message and size in message
  assert "'flash' or 'auto'" in message


@pytest.mark.parametrize("implementation", ["flash", "auto"])
def test_paths_that_never_form_the_scores_are_not_refused(implementation):
  out = _trace(implementation)
  assert out.shape == Q.shape and out.dtype == Q.dtype


def test_refusal_is_at_the_capacity_not_before(monkeypatch):
  """At exactly the capacity the call goes through; one byte less and it is
  refused (the bound compares the scores' bytes, not a margin)."""
  q = jax.ShapeDtypeStruct((2, 64, 4, 8), jnp.float32)
  need = 2 * 4 * 64 * 64 * 4  # [B, H, Tq, Tk] float32
  monkeypatch.setattr(device_memory, "capacity",
                      lambda backend=None: (need, "a test device"))
  assert _trace("einsum", q).shape == q.shape
  monkeypatch.setattr(device_memory, "capacity",
                      lambda backend=None: (need - 1, "a test device"))
  with pytest.raises(ValueError, match="more than a test device holds"):
    _trace("einsum", q)


def test_capacity_of_this_machine():
  have, what = device_memory.capacity()
  assert have > 2 ** 30 and isinstance(what, str)
