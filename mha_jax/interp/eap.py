"""Edge attribution patching (EAP, EAP-IG) and exact circuit evaluation.

Shape letters: B batch, T length, D d_model, S senders, R receivers, N
circuits or gradient points.

The graph (senders, receivers, which edges exist, their labels) is
`eap_graph`'s. Each receiver reads its OWN input stream: in the model as
it is, every receiver of a layer reads the same residual stream, but here
the stream of receiver r is a separate variable x_r, so that an edge (s,
r) is the term a_s (sender s's output) in x_r alone.

`edge_scores`: an edge's score is the first-order change of the metric
when the edge carries the corrupted output instead of the clean one,

  score(s, r) = sum over batch and positions of
                (a_s(corrupted) - a_s(clean)) . dm/dx_r,

with the gradient dm/dx_r taken at the clean run (EAP; Syed et al.
2023), or averaged over `steps` points whose input embeddings lie on the
straight line from the corrupted to the clean ones, at k / steps for k =
1..steps (EAP-IG; Hanna et al. 2024). So steps=1 is EAP, and as steps
grows the embedding's scores summed over its receivers tend to m_x - m_c
(the completeness of integrated gradients: the metric depends on the
embedding only through the receivers' streams).

`circuit_metric`: the metric of a run in which every receiver reads its
own stream, the run's stream minus, for each sender not in the circuit
for that receiver, (the sender's output in this run minus its output in
the ablation source): the corrupted run, or (`ablation="mean"`) its mean
over the batch of `mean_inputs` at each position. Each receiver head's
q, k or v is recomputed from its own stream by the block's pre-norm and
the layer's own `attention_layer` with its parameters cut to that head,
and an MLP's output by the model's own block (the stream patched in at
`resid_mid`, or at the block's input for a parallel block); a `vmap`
over the layer's receivers, so norms, biases, QK-norm and rotary
positions are the model's. The runs use the default positions 0..T-1. The
full circuit is the clean run, the empty one the ablated run.

Pure functions: callers jit at the outside (the metric's arrays as
arguments), as in `patching`. A gradient point is one forward and one
backward pass; the N circuits of a curve run as one `jax.lax.map`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax import hooks as hooks_lib
from mha_jax.core import multi_head
from mha_jax.core import precision
from mha_jax.interp import eap_graph
from mha_jax.interp.eap_graph import EdgeScores
from mha_jax.interp.patching import Metric

METHODS = ("eap", "eap-ig")
ABLATIONS = ("corrupted", "mean")
# The fractions of the edges kept along a faithfulness curve (as in the
# MIB benchmark).
FRACTIONS = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _sender_sites(config) -> list[str]:
  sites = ["blocks.0.resid_pre"]
  for l in range(config.num_layers):
    sites.append(f"blocks.{l}.attn.result")
    if not config.attention_only:
      sites.append(f"blocks.{l}.mlp_out")
  return sites


def _sender_rows(model, inputs) -> jax.Array:
  """`[S, B, T, D]`: `sender_outputs` with the senders first, the layout
  in which XLA forms a head's `result` term (a product batched over
  heads), so that no transpose is written for it."""
  sites = _sender_sites(model.config)
  _, acts = model(inputs, capture=sites)
  return jnp.concatenate([jnp.moveaxis(acts[s], 2, 0)
                          if s.endswith("result") else acts[s][None]
                          for s in sites], axis=0)


def sender_outputs(model, inputs) -> jax.Array:
  """`[B, T, S, D]`: every sender's output on `inputs`, in the graph's
  order (the embedding, then per layer its heads and its MLP)."""
  return jnp.moveaxis(_sender_rows(model, inputs), 0, 2)


def _own_inputs(block, positions, read, out, x):
  """`x [B, T, n, D]`, one stream per receiver -> `[B, T, n, ...]`: entry
  i is what receiver i computes from stream i: head i of the site `out`
  ("attn.q", "attn.k", "attn.v"; `_head_inputs`), or all of an MLP's
  output (n = 1), by the model's own `block` with its site `read`
  ("resid_pre" or "resid_mid") holding that stream. Only the path from
  `read` to `out` survives XLA's dead-code elimination."""
  if out.startswith("attn."):
    return _head_inputs(block, positions, out.split(".")[1], x)

  def one(stream):
    hooks = hooks_lib.Hooks(capture=(out,), patch={read: stream})
    block(stream, positions=positions, hooks=hooks)
    return hooks.captured[out]

  return jax.vmap(one, in_axes=2, out_axes=2)(x)


# The spec fields that act only on scores, weights and outputs: cleared in
# the one-head layer that computes a receiver's q, k or v.
_SCORE_FIELDS = dict(alibi=False, sinks=False, score_mod=None, mask_mod=None,
                     block_mask=None, local_window=None, soft_cap=None,
                     implementation="einsum")


def _head_inputs(block, positions, site, x):
  """`x [B, T, n, D]` -> `[B, T, n, Dh]`: head i's `site` ("q", "k" or
  "v", after QK-norm and rotary positions) computed from stream i by the
  layer's own `attention_layer`, with the block's pre-norm, the layer's
  dtype and its parameters cut to that head (for "q" query head i and
  its key/value head; for "k", "v" key/value head i). Running the whole
  layer on each stream and keeping one head would pay every head's
  projection per stream: on SmolLM2 that doubled the FLOPs of EAP's
  backward pass."""
  attn = block.attn
  spec, params = attn.spec, attn.core_params()
  group = spec.num_heads // spec.num_kv_heads
  index = jnp.arange(x.shape[2])
  q_head, kv_head = ((index, index // group) if site == "q"
                     else (index * group, index))
  one_spec = spec.replace(num_heads=1, num_kv_heads=1,
                          head_dim=spec.head_dim, **_SCORE_FIELDS)
  params.pop("sinks", None)
  by_head = {"w_q": 1, "b_q": 0, "w_o": 0, "w_k": 1, "b_k": 0, "w_v": 1,
             "b_v": 0}

  def one(stream, qh, kh):
    cut = {}
    for name, arr in params.items():
      if name in by_head:
        head = qh if name in ("w_q", "b_q", "w_o") else kh
        arr = jax.lax.dynamic_slice_in_dim(arr, head, 1, axis=by_head[name])
      cut[name] = arr
    xs = block.ln_attn(stream)
    if attn.dtype is not None:
      xs = xs.astype(attn.dtype)
    hooks = hooks_lib.Hooks(capture=(site,))
    multi_head.attention_layer(cut, xs, spec=one_spec, positions=positions,
                               hooks=hooks)
    return hooks.captured[site][:, :, 0]

  return jax.vmap(one, in_axes=(2, 0, 0), out_axes=2)(x, q_head, kv_head)


def _run(model, inputs, metric, graph, *, embed=None, drop=None, source=None,
         eps=None):
  """The metric of one run where every receiver reads its own stream.

  `embed [B, T, D]` replaces the embedding (`blocks.0.resid_pre`);
  `drop [S, R]` (1: the edge is ablated) with `source [S, B, T, D]`
  (the ablation's sender outputs, `_sender_rows`) removes edges; `eps`,
  one `[B, T, n, D]` per receiver group of `graph.groups`, is added to
  its receivers' streams (its gradient is dm/dx_r).
  """
  c = model.config
  # `changes`: each sender's output in this run minus its output in the
  # ablation source, [n, B * T * D] per block of senders as they write.
  # Rows, senders major, so that a group's correction is one plain product
  # (drop^T [r, n] x [n, B * T * D]) over a concatenation of whole rows:
  # kept as [B, T, n, D], XLA transposed every group's prefix of senders
  # for its product (SmolLM2, 64 IOI prompts: 13 of a circuit's 28 s of
  # op time).
  changes, bases = [], {}
  if drop is not None:
    source_rows = source.reshape(len(source), -1)
  group_index = {g.start: i for i, g in enumerate(graph.groups)}
  # The columns of the groups that read the same first n senders (a
  # layer's q, k and v; its MLP too in a parallel block; adjacent in the
  # graph's order): one product over them reads those senders' changes
  # once, not once per group. `spans`: per n, the columns (start, end);
  # `removed_by_n`: per n, (start, the product), once it is computed.
  spans, removed_by_n = {}, {}
  for g in graph.groups:
    lo, hi = spans.get(g.senders, (g.start, g.start + g.size))
    spans[g.senders] = (min(lo, g.start), max(hi, g.start + g.size))
  # The model's default positions: the only ones these functions use.
  b, t = jnp.shape(inputs)[:2]
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))

  def record(x):  # a sender's output in this run, [B, T, n, D]
    if drop is not None:
      start, n = sum(len(a) for a in changes), x.shape[2]
      changes.append(jnp.moveaxis(x, 2, 0).reshape(n, -1)
                     - source_rows[start:start + n])
    return x

  def streams(group, base):
    x = jnp.broadcast_to(base[:, :, None], base.shape[:2] + (
        group.size,) + base.shape[2:])
    if drop is not None:
      n = group.senders
      if n not in removed_by_n:
        a = jnp.concatenate(changes, axis=0)
        if len(a) < n:  # a sender the graph puts first has not run yet
          raise RuntimeError(f"eap: receivers {group} read {n} senders, "
                             f"but only {len(a)} have written")
        lo, hi = spans[n]
        w = drop[:n, lo:hi]  # [n, r]
        removed_by_n[n] = lo, jax.lax.dot_general(  # [r, B * T * D]
            w, a[:n], (((0,), (0,)), ((), ())),
            precision=precision.dot_precision(w, a))
      lo, removed = removed_by_n[n]
      rows = removed[group.start - lo:group.start - lo + group.size]
      x = x - jnp.moveaxis(rows.reshape((group.size,) + base.shape), 0, 2)
    return x if eps is None else x + eps[group_index[group.start]]

  def keep_base(name):
    def fn(x):
      if name == "blocks.0.resid_pre":
        x = x if embed is None else embed
        record(x[:, :, None])
      bases[name] = x
      return x
    return fn

  def computed(group, read, out):
    """The patch of block `group.layer`'s site `out`: each receiver of
    `group` computes its part from its own stream, read at the block's
    site `read` (an MLP's output is also a sender)."""
    def fn(_):
      base = bases[f"blocks.{group.layer}.{read}"]
      y = _own_inputs(model.blocks[group.layer], positions, read, out,
                      streams(group, base))
      return record(y)[:, :, 0] if group.kind == "mlp" else y
    return fn

  patch = {}
  for l in range(c.num_layers):
    pre = f"blocks.{l}.resid_pre"
    patch[pre] = keep_base(pre)
    if drop is not None:
      # Only a run that removes edges reads the heads' terms; asking for
      # them costs their product and its gradient in every other run.
      patch[f"blocks.{l}.attn.result"] = record
    for g in graph.groups:
      if g.layer == l and g.kind == "mlp":
        # A sequential block's MLP reads resid_mid, a parallel one's the
        # block's input.
        read = "resid_pre" if c.parallel_block else "resid_mid"
        patch[f"blocks.{l}.{read}"] = keep_base(f"blocks.{l}.{read}")
        patch[f"blocks.{l}.mlp_out"] = computed(g, read, "mlp_out")
      elif g.layer == l:
        patch[f"blocks.{l}.attn.{g.kind}"] = computed(g, "resid_pre",
                                                      f"attn.{g.kind}")
  logits = graph.groups[-1]
  patch[f"blocks.{c.num_layers - 1}.resid_post"] = (
      lambda x: streams(logits, x)[:, :, 0])
  return metric(model(inputs, patch=patch))


def _check_pair(clean, corrupted, fn):
  if jnp.shape(clean) != jnp.shape(corrupted):
    raise ValueError(f"{fn}: `clean` and `corrupted` must have the same "
                     f"shape, got {jnp.shape(clean)} and "
                     f"{jnp.shape(corrupted)}")


def edge_scores(model, clean, corrupted, metric: Metric, *,
                method: str = "eap", steps: int = 5,
                batch_size: int | None = None) -> EdgeScores:
  """The attribution score of every edge (module docstring).

  Args:
    model: a pre-norm `DecoderLM` (others are refused, naming why).
    clean, corrupted: inputs of the same shape (`[B, T]` tokens).
    metric: logits -> scalar.
    method: "eap" (the gradient at the clean run) or "eap-ig" (averaged
      over `steps` >= 1 points from the corrupted to the clean embedding;
      ignored by "eap").
    batch_size: gradient points evaluated together (`jax.lax.map`).

  Returns:
    `EdgeScores`: `scores [S, R]` (0 where no edge runs), `exists`,
    `senders` and `receivers` labels (`eap_graph`). A score estimates
    m(edge corrupted) - m(clean): an edge the behaviour needs scores
    negative for a metric that is higher on the clean run. Rank by |score|
    (`eap_graph.ranked_edges`).
  """
  graph = eap_graph.graph(model)
  _check_pair(clean, corrupted, "edge_scores")
  if method not in METHODS:
    raise ValueError(f"edge_scores: `method` must be one of {METHODS}, got "
                     f"{method!r}")
  if not isinstance(steps, (int, np.integer)) or steps < 1:
    raise ValueError(f"edge_scores: `steps` must be an int >= 1, got "
                     f"{steps!r}")
  a_clean = _sender_rows(model, clean)  # [S, B, T, D]
  a_corrupt = _sender_rows(model, corrupted)
  _, b, t, d = a_clean.shape
  # One zero per receiver group, not one [B, T, R, D] sliced per group:
  # the gradient of slices is their pads summed, which XLA fused with the
  # transpose into the score product's layout as one loop over ~120
  # inputs (SmolLM2, 64 IOI prompts: 10.1 s of a 20.6 s EAP call).
  zeros = tuple(jnp.zeros((b, t, g.size, d), a_clean.dtype)
                for g in graph.groups)

  def grad_at(alpha):
    """`[R, B * T * D]`: dm/dx_r, one row per receiver."""
    embed = None if alpha is None else (
        a_corrupt[0] + alpha * (a_clean[0] - a_corrupt[0]))
    grads = jax.grad(lambda eps: _run(model, clean, metric, graph,
                                      embed=embed, eps=eps))(zeros)
    return jnp.concatenate([jnp.moveaxis(g, 2, 0).reshape(g.shape[2], -1)
                            for g in grads], axis=0)

  # [S, B * T * D]. Both operands of the score product as rows, so XLA
  # reads them with B, T, D minor; written as an einsum over [B, T, S, D]
  # and [B, T, R, D] it first transposed the gradient to [B * T * D, R]
  # (0.8 s of a 10 s call, as above).
  delta = (a_corrupt - a_clean).reshape(a_clean.shape[0], -1)

  def score_at(alpha):
    g = grad_at(alpha)
    return jax.lax.dot_general(delta, g, (((1,), (1,)), ((), ())),
                               precision=precision.dot_precision(delta, g))

  if method == "eap":
    scores = score_at(None)
  else:
    # The score is linear in the gradient, so the mean of the points'
    # scores [S, R] is the score of their mean gradient; mapping to scores
    # keeps one [B, T, R, D] gradient alive per point evaluated together,
    # not all `steps` of them (SmolLM2, 70,651 edges, 128 prompts: XLA's
    # scratch 10.3 GB with 5 points, as plain EAP's 10.2, instead of 20.9).
    alphas = jnp.arange(1, steps + 1, dtype=a_clean.dtype) / steps
    scores = jnp.mean(jax.lax.map(score_at, alphas, batch_size=batch_size),
                      axis=0)
  return EdgeScores(jnp.where(jnp.asarray(graph.exists), scores, 0.0), graph)


def _source(model, corrupted, ablation, mean_inputs, t, fn):
  if ablation not in ABLATIONS:
    raise ValueError(f"{fn}: `ablation` must be one of {ABLATIONS}, got "
                     f"{ablation!r}")
  if (ablation == "mean") != (mean_inputs is not None):
    raise ValueError(f"{fn}: `mean_inputs` (the batch to average the senders "
                     "over) goes with ablation='mean' and only with it; got "
                     f"ablation={ablation!r} and mean_inputs "
                     f"{'given' if mean_inputs is not None else 'None'}")
  if ablation == "corrupted":
    return _sender_rows(model, corrupted)
  if jnp.ndim(mean_inputs) < 2 or jnp.shape(mean_inputs)[1] != t:
    raise ValueError(f"{fn}: `mean_inputs` must be [N, T={t}, ...], got "
                     f"shape {jnp.shape(mean_inputs)}")
  return jnp.mean(_sender_rows(model, mean_inputs), axis=1, keepdims=True)


def circuit_metric(model, clean, corrupted, metric: Metric, edge_mask, *,
                   ablation: str = "corrupted", mean_inputs=None,
                   batch_size: int | None = None) -> jax.Array:
  """The exact metric of the circuit `edge_mask` (module docstring).

  Args:
    model, clean, corrupted, metric: as `edge_scores` (`corrupted` is not
      read with `ablation="mean"` and may then be None).
    edge_mask: `[S, R]` bool, True for the edges in the circuit, or `[N,
      S, R]` for N circuits (one `jax.lax.map`); entries where no edge
      runs (`graph.exists` False) are ignored.
    ablation: what the edges outside the circuit carry: "corrupted" (the
      sender's output on `corrupted`) or "mean" (its mean over the batch
      axis of `mean_inputs [N, T]`, per position).
    batch_size: circuits evaluated together.

  Returns the metric of the circuit's run (a scalar, or `[N]`): the clean
  run's metric for the full mask, the ablated run's for the empty one.
  """
  graph = eap_graph.graph(model)
  if corrupted is not None:
    _check_pair(clean, corrupted, "circuit_metric")
  mask = jnp.asarray(edge_mask)
  if mask.shape[-2:] != graph.shape or mask.ndim not in (2, 3):
    raise ValueError(f"circuit_metric: `edge_mask` must be [S, R]="
                     f"{list(graph.shape)} (senders, receivers) or [N, S, R],"
                     f" got shape {list(mask.shape)}")
  source = _source(model, corrupted, ablation, mean_inputs,
                   jnp.shape(clean)[1], "circuit_metric")
  source = jnp.broadcast_to(  # [S, B, T, D]
      source, source.shape[:1] + jnp.shape(clean)[:2] + source.shape[3:])
  exists = jnp.asarray(graph.exists)

  def one(m):
    drop = (exists & ~m.astype(bool)).astype(source.dtype)
    return _run(model, clean, metric, graph, drop=drop, source=source)

  if mask.ndim == 2:
    return one(mask)
  return jax.lax.map(one, mask, batch_size=batch_size)


def faithfulness_curve(model, clean, corrupted, metric: Metric,
                       scores: EdgeScores, *,
                       counts: Sequence[int] | None = None,
                       fractions: Sequence[float] | None = None,
                       ablation: str = "corrupted", mean_inputs=None,
                       batch_size: int | None = None) -> dict:
  """The faithfulness of the top-|score| circuits and its MIB summaries.

  The circuit of size k keeps the k edges of largest |score|
  (`eap_graph.top_edges`); give the sizes as `counts` (edges) or as
  `fractions` of all edges (k = round(fraction * E); default `FRACTIONS`).
  Its faithfulness is (m_k - m_0) / (m_clean - m_0), with m_0 the empty
  circuit's metric (the corrupted run's, or the mean-ablated run's) and
  m_clean the clean run's (every edge kept).

  Returns `{"counts": [N] ints, "fractions": [N] k / E (the x axis),
  "faithfulness": [N], "m_clean", "m_empty", "cpr", "cmd"}`: CPR, the
  area under faithfulness over the fraction of edges kept (higher is
  better), and CMD, the area under |1 - faithfulness| (lower is better),
  both by the trapezoidal rule over the points in increasing fraction,
  between the smallest and largest fraction given (include 0 and 1 to
  cover all of [0, 1], as the default does).
  """
  n = scores.graph.num_edges
  if counts is not None and fractions is not None:
    raise ValueError("faithfulness_curve: give `counts` or `fractions`, "
                     "not both")
  if counts is None:
    fractions = FRACTIONS if fractions is None else fractions
    if any(not 0.0 <= f <= 1.0 for f in fractions):
      raise ValueError(f"faithfulness_curve: `fractions` must lie in [0, 1]"
                       f", got {list(fractions)}")
    counts = [int(round(f * n)) for f in fractions]
  if any(not 0 <= int(k) <= n for k in counts):
    raise ValueError(f"faithfulness_curve: `counts` must lie in [0, {n}] "
                     f"(the graph's edges), got {list(counts)}")
  counts = sorted(int(k) for k in counts)
  masks = eap_graph.top_edges(scores, counts + [0])
  m = circuit_metric(model, clean, corrupted, metric, masks,
                     ablation=ablation, mean_inputs=mean_inputs,
                     batch_size=batch_size)
  m_clean, m_empty = metric(model(clean)), m[-1]
  faith = (m[:-1] - m_empty) / (m_clean - m_empty)
  x = jnp.asarray(counts, jnp.float32) / n
  return {"counts": np.asarray(counts), "fractions": x,
          "faithfulness": faith, "m_clean": m_clean, "m_empty": m_empty,
          "cpr": jnp.trapezoid(faith, x),
          "cmd": jnp.trapezoid(jnp.abs(1.0 - faith), x)}
