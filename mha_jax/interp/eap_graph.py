"""The computational graph of edge attribution patching: its nodes, its
edges, their names, and the ranked list of scored edges.

Shape letters: S senders, R receivers, H query heads, K kv heads.

Senders write into the residual stream: the input embedding (`embed`,
the value of `blocks.0.resid_pre`: tokens and positions), every attention
head's own output (its `result`, z_h W_O^h; named `L1H3` by
`hooks.head_name`) and every MLP's output (`MLP1`). Receivers read from
it: each head's query input (`L1H3.q`), each kv head's key and value
inputs (`L1H0.k`, `L1H0.v`: the index counts KV heads, as on the `k` and
`v` hook sites, so under grouped-query attention a k/v receiver serves
its whole group of query heads), each MLP's input (`MLP1`) and the
logits (`logits`). Senders come in the order of the computation, so the
senders a receiver reads are a prefix of them.

An edge runs from a sender to every receiver that reads the stream after
the sender wrote to it: heads of layer l reach the q, k and v of LATER
layers, the MLP of their own layer (in a sequential block) and the
logits; an MLP reaches everything after its layer; the embedding reaches
everything. In a parallel block (GPT-NeoX) the MLP reads the block's
input, so the heads of its own layer do not reach it. Blocks without an
MLP have no MLP nodes.

The decomposition needs pre-norm blocks: there the stream a receiver
reads is the sum of the senders' outputs before it plus constant biases,
so each edge is one term of the sum. Post-norm (BERT) and sandwich-norm
(Gemma 2 and 3) blocks normalise the sum itself, or each sublayer's
output, and an edge is then no longer a term: they are refused.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax import hooks as hooks_lib
from mha_jax.models.transformer import DecoderLM

EMBED, LOGITS = "embed", "logits"


def _reads(written_at: int, read_at: int) -> bool:
  """Whether a receiver reading the stream at stage `read_at` sees a
  sender that wrote at stage `written_at`. Stages: 0 the embedding;
  2l + 1 the attention of layer l (read and written), 2l + 2 a sequential
  MLP of layer l (a parallel one reads and writes at 2l + 1); 2L + 1 the
  logits."""
  return written_at < read_at


@dataclasses.dataclass(frozen=True)
class Group:
  """Receivers read together: one input (`kind` "q", "k", "v", "mlp" or
  "logits") of one layer, columns `start:start + size`, reading the first
  `senders` senders."""
  kind: str
  layer: int
  start: int
  size: int
  senders: int


@dataclasses.dataclass(frozen=True)
class Graph:
  """Labels, stages and receiver groups of one model's graph (hashable:
  a static argument under `jax.jit`)."""
  senders: tuple[str, ...]
  receivers: tuple[str, ...]
  sender_stages: tuple[int, ...]
  receiver_stages: tuple[int, ...]
  groups: tuple[Group, ...]

  @property
  def shape(self) -> tuple[int, int]:
    return len(self.senders), len(self.receivers)

  @property
  def exists(self) -> np.ndarray:
    """`[S, R]` bool: True where an edge runs from sender to receiver."""
    return np.array([[_reads(w, r) for r in self.receiver_stages]
                     for w in self.sender_stages], bool).reshape(self.shape)

  @property
  def num_edges(self) -> int:
    return int(self.exists.sum())


def check_model(model, fn: str = "eap") -> None:
  """Raise naming the reason unless `model` is a decoder whose blocks
  decompose the residual stream into sender terms (see the module
  docstring)."""
  if not isinstance(model, DecoderLM):
    raise TypeError(f"{fn}: `model` must be a DecoderLM (one causal stack "
                    f"of blocks, then the logits), got {type(model).__name__}")
  config = model.config
  if config.norm_placement != "pre":
    raise ValueError(
        f"{fn}: the model's norm_placement={config.norm_placement!r}; edge "
        "attribution needs pre-norm blocks (norm_placement='pre'), where the "
        "stream a receiver reads is a sum of the senders' outputs. "
        "Post-norm and sandwich-norm blocks normalise that sum (or each "
        "sublayer's output), so an edge is no longer one of its terms")


def graph(model) -> Graph:
  """The `Graph` of a pre-norm `DecoderLM` (refused otherwise, by
  `check_model`)."""
  check_model(model, "eap_graph.graph")
  c = model.config
  n_heads, n_kv = c.num_heads, c.num_kv_heads or c.num_heads
  has_mlp, parallel = not c.attention_only, c.parallel_block
  senders, s_stage = [EMBED], [0]
  receivers, r_stage, kinds = [], [], []
  for l in range(c.num_layers):
    attn = 2 * l + 1
    mlp = attn if parallel else attn + 1
    for kind, n in (("q", n_heads), ("k", n_kv), ("v", n_kv)):
      kinds.append((kind, l, len(receivers), n, attn))
      receivers += [f"{hooks_lib.head_name(l, h)}.{kind}" for h in range(n)]
      r_stage += [attn] * n
    senders += [hooks_lib.head_name(l, h) for h in range(n_heads)]
    s_stage += [attn] * n_heads
    if has_mlp:
      kinds.append(("mlp", l, len(receivers), 1, mlp))
      receivers.append(f"MLP{l}")
      r_stage.append(mlp)
      senders.append(f"MLP{l}")
      s_stage.append(attn + 1)
  end = 2 * c.num_layers + 1
  kinds.append((LOGITS, c.num_layers, len(receivers), 1, end))
  receivers.append(LOGITS)
  r_stage.append(end)
  groups = tuple(Group(kind, l, start, n,
                       sum(_reads(w, stage) for w in s_stage))
                 for kind, l, start, n, stage in kinds)
  return Graph(tuple(senders), tuple(receivers), tuple(s_stage),
               tuple(r_stage), groups)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EdgeScores:
  """`scores [S, R]`: each edge's attribution (0 where no edge runs);
  `graph`: its labels and `exists` mask (static under `jax.jit`)."""
  scores: jax.Array
  graph: Graph = dataclasses.field(metadata=dict(static=True))

  @property
  def exists(self) -> np.ndarray:
    return self.graph.exists

  @property
  def senders(self) -> tuple[str, ...]:
    return self.graph.senders

  @property
  def receivers(self) -> tuple[str, ...]:
    return self.graph.receivers


def ranked_edges(scores: EdgeScores, top: int | None = None
                 ) -> list[tuple[str, str, float]]:
  """`(sender, receiver, score)` of the edges that exist, largest |score|
  first (ties in the order of the senders, then the receivers); the first
  `top` of them, or all."""
  g = scores.graph
  values = np.asarray(scores.scores)
  s, r = np.nonzero(g.exists)
  order = np.argsort(-np.abs(values[s, r]), kind="stable")[:top]
  return [(g.senders[s[i]], g.receivers[r[i]], float(values[s[i], r[i]]))
          for i in order]


def top_edges(scores: EdgeScores, counts) -> jax.Array:
  """`[N, S, R]` bool: for each k of `counts`, the k edges of largest
  |score| (ties by position, as `ranked_edges`). Traceable: the scores
  may be traced, the counts are Python ints."""
  exists = jnp.asarray(scores.exists)
  s, r = scores.graph.shape
  flat = jnp.where(exists, jnp.abs(scores.scores), -jnp.inf).reshape(-1)
  rank = jnp.zeros(s * r, jnp.int32).at[
      jnp.argsort(-flat, stable=True)].set(jnp.arange(s * r, dtype=jnp.int32))
  keep = rank[None, :] < jnp.asarray(counts, jnp.int32)[:, None]
  return keep.reshape(-1, s, r) & exists[None]
