"""Where the time goes, by kind of operation, in XLA and in torch.

XLA side: `jax.profiler` traces a few calls of a jitted function (its
Perfetto JSON has one event per executed HLO instruction, named as in the
compiled module), and the compiled module's HLO text says what each
instruction is: a fusion is classed by the operations it fuses
(`classify`). torch side: `torch.profiler` on the same calls, each aten
op by its self time (time in the op less the ops it calls), so nothing
counts twice. Both give milliseconds per call in the same `KINDS`.

Per-op times sum the time of each op on whichever thread ran it, so on
2 cores a kind's milliseconds can exceed its share of the wall time;
what the tables compare is each library's time in each kind of work.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re
import tempfile

import jax

KINDS = ("matmul", "attention kernel", "softmax, norms, reductions",
         "elementwise", "copies and layout", "gather, scatter, slices",
         "other")

_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?\s([a-z][\w\-]*)\(")
_COMP = re.compile(r"^%([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"(?:calls|body|condition|to_apply)=%([\w.\-]+)")
_WRAPPERS = {"while", "call", "conditional"}  # their insides are traced


def _hlo_index(hlo_text: str):
  """`(opcode of each instruction, computations each instruction calls,
  instructions of each computation)` from compiled HLO text."""
  opcode, calls, members = {}, {}, collections.defaultdict(list)
  comp = None
  for line in hlo_text.splitlines():
    m = _COMP.match(line)
    if m:
      comp = m.group(1)
      continue
    m = _INSTR.match(line)
    if m and comp is not None:
      name, op = m.groups()
      opcode[name] = op
      calls[name] = _CALLS.findall(line) if op == "fusion" else []
      members[comp].append(name)
  return opcode, calls, members


def _fused_ops(name, opcode, calls, members) -> set[str]:
  ops, todo, seen = set(), list(calls.get(name, [])), set()
  while todo:
    comp = todo.pop()
    if comp in seen:
      continue
    seen.add(comp)
    for inner in members.get(comp, []):
      ops.add(opcode[inner])
      todo.extend(calls.get(inner, []))
  return ops or {opcode[name]}


def classify(ops: set[str]) -> str:
  """The kind of an XLA instruction from the opcodes it runs (a fusion's
  fused ones): a matmul if any is a dot, and so on down `KINDS`."""
  if ops & {"dot", "convolution"}:
    return "matmul"
  if ops & {"scatter", "gather", "dynamic-slice", "dynamic-update-slice",
            "slice", "pad", "concatenate", "select-and-scatter"}:
    return "gather, scatter, slices"
  if ops & {"reduce", "reduce-window", "sort"}:
    return "softmax, norms, reductions"
  if ops <= {"copy", "transpose", "bitcast", "reshape", "broadcast",
             "parameter", "constant", "tuple", "get-tuple-element"}:
    return "copies and layout"
  return "elementwise"


def xla_ops(jitted, args, kwargs=None, *, calls: int) -> dict:
  """`{"kinds": {kind: ms per call}, "total", "top": [[op, kind, ms per
  call]]}` of `calls` calls of the jitted `jitted(*args, **kwargs)`,
  after one untimed call (it compiles)."""
  kwargs = kwargs or {}
  jax.block_until_ready(jitted(*args, **kwargs))
  hlo = jitted.lower(*args, **kwargs).compile().as_text()
  opcode, fused, members = _hlo_index(hlo)
  with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    try:
      for _ in range(calls):
        jax.block_until_ready(jitted(*args, **kwargs))
    finally:
      jax.profiler.stop_trace()
    trace = next(pathlib.Path(d).rglob("perfetto_trace.json.gz"))
    events = json.loads(gzip.decompress(trace.read_bytes()))
  events = events["traceEvents"] if isinstance(events, dict) else events
  per_op = collections.Counter()
  for e in events:
    name = e.get("name")
    if e.get("ph") == "X" and name in opcode and (
        opcode[name] not in _WRAPPERS):
      per_op[name] += e.get("dur", 0.0) / 1e3 / calls  # us -> ms per call
  kind_of = {n: classify(_fused_ops(n, opcode, fused, members))
             for n in per_op}
  return _tables(per_op, kind_of)


# aten op names (less "aten::") by kind; `torch_kind` also matches
# "softmax", "norm" and "scaled_dot_product" anywhere in a name.
_TORCH_KINDS = {
    "matmul": {"mm", "addmm", "bmm", "matmul", "linear", "baddbmm",
               "addbmm"},
    "softmax, norms, reductions": {
        "mean", "sum", "pow", "rsqrt", "max", "argmax", "amax", "var",
        "nll_loss_forward", "nll_loss_backward", "nll_loss",
        "nll_loss_nd", "cross_entropy_loss", "logsumexp"},
    "copies and layout": {
        "copy_", "contiguous", "clone", "to", "_to_copy", "transpose",
        "view", "reshape", "expand", "permute", "t", "_unsafe_view",
        "empty", "empty_like", "zeros", "zeros_like", "fill_", "zero_",
        "ones", "ones_like", "new_zeros", "new_empty", "detach",
        "as_strided", "unsqueeze", "squeeze", "resize_", "empty_strided",
        "lift_fresh", "alias", "expand_as", "_reshape_alias", "flatten",
        "unflatten", "split", "chunk", "unbind"},
    "gather, scatter, slices": {
        "index", "gather", "scatter", "embedding", "slice", "cat",
        "select", "narrow", "index_select", "masked_fill", "where",
        "embedding_dense_backward", "embedding_backward", "index_put_",
        "slice_backward", "select_backward", "index_add_", "stack"},
    "elementwise": {
        "mul", "add", "sub", "div", "neg", "silu", "cos", "sin", "exp",
        "sigmoid", "rsub", "threshold", "tanh", "ne", "eq", "lt", "gt",
        "ge", "le", "bitwise_and", "bitwise_or", "bitwise_not",
        "logical_and", "logical_or", "logical_not", "isin", "cumsum",
        "clamp", "mul_", "add_", "div_", "sub_", "silu_backward",
        "sigmoid_backward", "neg_", "arange", "all", "any", "__and__",
        "__or__", "sqrt", "reciprocal", "log", "fmod", "remainder"},
}


def torch_kind(name: str) -> str:
  """The kind of a torch op from its name ("aten::mm"). Backward nodes
  ("MmBackward0") are "other": their self time is autograd's bookkeeping,
  the kernels they call count under their own names."""
  if "scaled_dot_product" in name or "flash_attention" in name:
    return "attention kernel"
  if "softmax" in name or "norm" in name:
    return "softmax, norms, reductions"
  short = name.removeprefix("aten::")
  for kind, names in _TORCH_KINDS.items():
    if name.startswith("aten::") and short in names:
      return kind
  return "other"


def torch_ops(fn, *, calls: int) -> dict:
  """`xla_ops`' tables for torch: `calls` calls of `fn()` under
  `torch.profiler`, after one untimed call, each op by its self CPU
  time."""
  import torch  # pylint: disable=import-outside-toplevel
  fn()
  with torch.profiler.profile(
      activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(calls):
      fn()
  per_op = collections.Counter()
  for row in prof.key_averages():
    per_op[row.key] += row.self_cpu_time_total / 1e3 / calls
  return _tables(per_op, {n: torch_kind(n) for n in per_op})


def _tables(per_op, kind_of, top: int = 8) -> dict:
  kinds = {k: 0.0 for k in KINDS}
  for name, ms in per_op.items():
    kinds[kind_of[name]] += ms
  ranked = sorted(per_op.items(), key=lambda kv: -kv[1])[:top]
  return {"kinds": kinds, "total": float(sum(per_op.values())),
          "top": [[n, kind_of[n], float(ms)] for n, ms in ranked]}
