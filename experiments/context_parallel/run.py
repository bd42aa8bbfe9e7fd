"""Context parallelism, measuring: compiled memory per device against one
device, and one long forward+backward through the ring.

Shape letters: B batch (1), T tokens, H heads (= K kv heads), Dh width,
N devices on the sequence axis.
"""

from __future__ import annotations

import resource
import time

import jax
import jax.numpy as jnp

from mha_jax.core.kernels import flash
from mha_jax.parallel import ring
from mha_jax.parallel import sharding


def _memory(compiled) -> dict:
  """XLA's memory analysis of one device's program, in bytes; `peak` is
  arguments + outputs + temporaries less what outputs reuse (aliases)."""
  m = compiled.memory_analysis()
  out = {name: int(getattr(m, f"{name}_size_in_bytes"))
         for name in ("argument", "output", "temp", "alias")}
  out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
  return out


def _shapes(t, heads, head_dim):
  """q, k, v and the output's cotangent `[B, T, H, Dh]` as shapes."""
  return [jax.ShapeDtypeStruct((1, t, heads, head_dim), jnp.float32)] * 4


def _loss_grad(attention):
  """d/d(q, k, v) of sum(attention(q, k, v) * d_out): the backward pass
  with the cotangent d_out, as a training step would run it."""
  def loss(q, k, v, d_out):
    return jnp.sum(attention(q, k, v) * d_out)
  return jax.grad(loss, argnums=(0, 1, 2))


def _ring_fn(mesh, e):
  return _loss_grad(lambda q, k, v: ring.ring_attention(
      q, k, v, is_causal=True, mesh=mesh, layout=e.layout, block_q=e.block,
      block_k=e.block))


def _placed(mesh, shapes):
  spec = sharding.NamedSharding(mesh, sharding.P(None, sharding.SEQUENCE))
  return [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=spec)
          for s in shapes]


def memory(e, mesh) -> dict:
  """Compiled (never run) forward+backward at `e.memory_len` tokens: the
  blockwise kernel on one device, and one device of the ring."""
  shapes = _shapes(e.memory_len, e.memory_heads, e.memory_head_dim)
  one = jax.jit(_loss_grad(lambda q, k, v: flash.flash_attention(
      q, k, v, is_causal=True, block_q=e.block, block_k=e.block)))
  one_mem = _memory(one.lower(*shapes).compile())
  ring_mem = _memory(jax.jit(_ring_fn(mesh, e)).lower(
      *_placed(mesh, shapes)).compile())
  return {"tokens": e.memory_len, "heads": e.memory_heads,
          "head_dim": e.memory_head_dim, "one_device": one_mem,
          "ring_per_device": ring_mem,
          "ratio": ring_mem["peak"] / one_mem["peak"]}


def long_run(e, mesh) -> dict:
  """One forward+backward of the ring at `e.long_len` tokens, timed, with
  its compiled per-device memory and this process's peak resident set."""
  shapes = _placed(mesh, _shapes(e.long_len, e.long_heads,
                                 e.long_head_dim))
  fn = jax.jit(_ring_fn(mesh, e))
  start = time.perf_counter()
  compiled = fn.lower(*shapes).compile()
  compile_s = time.perf_counter() - start
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  args = [jax.device_put(jax.random.normal(key, s.shape), s.sharding)
          for key, s in zip(keys, shapes)]
  start = time.perf_counter()
  grads = jax.block_until_ready(compiled(*args))
  run_s = time.perf_counter() - start
  finite = all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
  return {"tokens": e.long_len, "heads": e.long_heads,
          "head_dim": e.long_head_dim, "compile_s": compile_s,
          "run_s": run_s, "finite": finite,
          "per_device": _memory(compiled),
          # Linux reports kilobytes.
          "process_peak_rss": resource.getrusage(
              resource.RUSAGE_SELF).ru_maxrss * 1024}


def measure(config) -> dict:
  e = config.experiment
  mesh = sharding.make_mesh(data=1, sequence=e.devices,
                            devices=jax.devices()[:e.devices])
  results = {"devices": e.devices, "layout": e.layout, "block": e.block,
             "memory": memory(e, mesh)}
  if e.long_len:
    results["long"] = long_run(e, mesh)
  return results
