"""Outputs and gradients of every `attend` path on a grid of calls, saved
to compare two versions of the library bit for bit.

    python scripts/path_identity.py save before.npz   # on the old commit
    python scripts/path_identity.py save after.npz    # on the new one
    python scripts/path_identity.py compare before.npz after.npz

The grid: every single-device path (vmap, einsum, flash, xla, auto, and
pallas_tpu in Pallas' interpreter at its block of 128) x the options of
`attend` one at a time (mask, bias, causal, each `ScoreRules` option,
the user rules and a block mask, dropout) x two shapes (MHA with Tq = Tk,
GQA with Tq < Tk), in float32; the gradient is of a fixed random
projection of the output with respect to q, k, v (and the bias). A call
a path refuses is recorded as refused, which must also agree. Used for
refactors that must not change a number (docs/architecture.md).
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

import mha_jax  # noqa: F401  (registers the package's paths)
from mha_jax.core import attention
from mha_jax.core import block_mask as block_mask_lib
from mha_jax.core import masks
from mha_jax.core import score_rules

PATHS = ("vmap", "einsum", "flash", "xla", "auto", "pallas_tpu")
# (B, Tq, Tk, H, K, Dh): MHA square, GQA with a query block shorter than
# the keys (decoding-like, bottom-right positions).
SHAPES = {"mha": (2, 12, 12, 4, 4, 8), "gqa": (1, 5, 11, 4, 2, 8)}
PALLAS_SHAPES = {"mha128": (1, 128, 128, 2, 2, 8)}


def _options(b, tq, tk, h):
  """name -> keyword arguments of `attend` (besides q, k, v)."""
  rng = np.random.default_rng(0)
  seg = np.sort(rng.integers(0, 3, (b, tk)), axis=1).astype(np.int32)
  bias = rng.normal(size=(b, h, tq, tk)).astype(np.float32)
  mask = rng.random((b, 1, tq, tk)) > 0.3
  rules = score_rules.ScoreRules
  doc = lambda bi, hi, qi, ki: (qi // 4) == (ki // 4)
  bmask = block_mask_lib.create(doc, None, None, tq, tk)
  return {
      "plain": {},
      "mask": {"mask": jnp.asarray(mask)},
      "bias": {"bias": jnp.asarray(bias)},
      "causal": {"is_causal": True},
      "window": {"is_causal": True, "rules": rules(local_window=(3, 0))},
      "window2": {"rules": rules(local_window=(2, 3))},
      "segments": {"rules": rules(q_segment_ids=jnp.asarray(seg[:, -tq:]),
                                  kv_segment_ids=jnp.asarray(seg))},
      "soft_cap": {"rules": rules(soft_cap=1.5)},
      "scale": {"rules": rules(scale=0.3)},
      "sinks": {"rules": rules(sinks=jnp.linspace(-1.0, 1.0, h))},
      "alibi": {"is_causal": True,
                "rules": rules(alibi_slopes=score_rules.alibi_slopes(h))},
      "q_positions": {"is_causal": True, "rules": rules(
          q_positions=jnp.tile(jnp.arange(tk - tq, tk)[None], (b, 1)))},
      "score_mod": {"rules": rules(
          score_mod=lambda s, bi, hi, qi, ki: s - 0.1 * (qi - ki) ** 2)},
      "mask_mod": {"rules": rules(mask_mod=masks.causal_mod())},
      "block_mask": {"rules": rules(mask_mod=doc, block_mask=bmask)},
      "dropout": {"dropout_rate": 0.2,
                  "dropout_rng": jax.random.key(3)},
  }


def _one(path, shape, kwargs):
  """(out, dq, dk, dv[, dbias]) of one call, or None when refused."""
  b, tq, tk, h, kh, dh = shape
  keys = jax.random.split(jax.random.key(1), 4)
  q = jax.random.normal(keys[0], (b, tq, h, dh))
  k = jax.random.normal(keys[1], (b, tk, kh, dh))
  v = jax.random.normal(keys[2], (b, tk, kh, dh))
  proj = jax.random.normal(keys[3], (b, tq, h, dh))
  bias = kwargs.pop("bias", None)

  def loss(q, k, v, bias):
    out, _ = attention.attend(q, k, v, bias=bias, implementation=path,
                              **kwargs)
    return jnp.sum(out * proj), out

  try:
    grads, out = jax.grad(loss, argnums=(0, 1, 2, 3) if bias is not None
                          else (0, 1, 2), has_aux=True)(q, k, v, bias)
  except (ValueError, TypeError, NotImplementedError):
    return None
  return (out, *grads)


def save(filename):
  arrays = {}
  for path in PATHS:
    shapes = PALLAS_SHAPES if path == "pallas_tpu" else SHAPES
    for shape_name, shape in shapes.items():
      b, tq, tk, h, _, _ = shape
      for name, kwargs in _options(b, tq, tk, h).items():
        key = f"{path}/{shape_name}/{name}"
        got = _one(path, shape, dict(kwargs))
        if got is None:
          arrays[key + "/refused"] = np.zeros(())
          continue
        for i, x in enumerate(got):
          arrays[f"{key}/{i}"] = np.asarray(x)
  np.savez(filename, **arrays)
  print(f"{filename}: {len(arrays)} arrays from {mha_jax.__file__}")


def compare(a_name, b_name):
  a, b = np.load(a_name), np.load(b_name)
  differ = sorted(set(a.files) ^ set(b.files))
  unequal = [k for k in sorted(set(a.files) & set(b.files))
             if a[k].tobytes() != b[k].tobytes()]
  ran = len({k.rsplit("/", 1)[0] for k in a.files
             if not k.endswith("/refused")})
  refused = sum(k.endswith("/refused") for k in a.files)
  print(f"{ran} calls ran, {refused} refused; {len(a.files)} arrays; "
        f"{len(differ)} present in one file only; {len(unequal)} not "
        "bit-identical")
  for k in (differ + unequal)[:20]:
    print("  ", k)
  return 0 if not differ and not unequal else 1


if __name__ == "__main__":
  if sys.argv[1:2] == ["save"]:
    save(sys.argv[2])
  elif sys.argv[1:2] == ["compare"]:
    sys.exit(compare(sys.argv[2], sys.argv[3]))
  else:
    sys.exit(__doc__)
