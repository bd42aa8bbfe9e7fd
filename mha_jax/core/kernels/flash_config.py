"""What one call of the blockwise kernel (`flash_kernel.py`) is given
besides q, k, v, a mask and a bias: its static block configuration
(`BlockConfig`, hashable: the custom VJP's nondiff argument) and the
per-call arrays of its score rules (`Extras`, differentiated).

Shape letters: B batch, Tq / Tk query / key length, K key/value heads,
G query heads per kv head, Tq' / Tk' the lengths padded to whole blocks,
Bq / Bk query / key block lengths, Nq / Nk block counts, L the blocks
of a span.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from mha_jax.core import score_rules


class BlockConfig(NamedTuple):
  """The static facts of one kernel call (hashable: the custom VJP's
  nondiff argument). `flash_schedule.block_config` makes one; context
  parallelism (`parallel/ring.py`) makes one per device's slice.

  Attributes:
    tq, tk: the true query and key lengths (of this call's slice).
    bq, bk: the forward's query and key block lengths.
    bwd_bq, bwd_bk: the backward's (`backward_cfg` swaps them in).
    padded_keys: Tk is padded up to a whole number of forward blocks
      (the padded keys are masked by position).
    is_causal: the bottom-right aligned causal rule.
    rules: `score_rules.ScoreRules`; only its static fields (window, soft
      cap, scale) are read here.
    scale: the score scale (1.0 where q was scaled beforehand,
      `flash_schedule.prescaled`).
    score_mod, mask_mod: the user rules with the arrays they close over
      hoisted (`flash_rules.user_rules`): they take them
      (`Extras.score_consts`, `fixed_consts`) last. None: none.
    block_masked: visit the blocks `Extras.kv_*` list.
    span_len, span_group: walk the block mask as spans
      (`flash_schedule.span_plan`): each query block against `span_len`
      key blocks in one step, `span_group` query blocks per step (0: the
      block walk).
  """
  tq: int
  tk: int
  bq: int
  bk: int
  bwd_bq: int
  bwd_bk: int
  padded_keys: bool
  is_causal: bool
  rules: score_rules.ScoreRules
  scale: float
  score_mod: object = None
  mask_mod: object = None
  block_masked: bool = False
  span_len: int = 0
  span_group: int = 1


class Extras(NamedTuple):
  """The per-call arrays of the score rules, laid out for 5-d blocks
  (the kernel's differentiable argument; None: the rule is off)."""
  q_pos: jax.Array | None  # [B, Tq'] int, None: Tk - Tq + i
  q_seg: jax.Array | None  # [B, Tq'] int
  k_seg: jax.Array | None  # [B, Tk'] int
  slopes: jax.Array | None  # [1, K, G, 1, 1] float32 (ALiBi)
  sinks: jax.Array | None  # [1, K, G, 1] float32
  # [1] int: the position of key 0 (None: 0). Context parallelism passes
  # one device's slice of the keys, which starts further along.
  k_start: jax.Array | None = None
  # The user rules' inputs: batch rows [B, 1, 1, 1, 1] and query heads
  # [1, K, G, 1, 1] (int32), and the arrays their functions close over,
  # passed as arguments so that gradients reach them
  # (`flash_rules.user_rules`).
  b_ids: jax.Array | None = None
  h_ids: jax.Array | None = None
  score_consts: tuple = ()  # float: differentiated
  fixed_consts: tuple = ((), ())  # score_mod's others, mask_mod's: not
  # A block mask (`block_mask.kernel_lists`): per query block, how many
  # key blocks to visit [B', K', Nq], which [B', K', Nq, Nk] and whether
  # each is full [B', K', Nq, Nk] (its mask_mod work skipped).
  kv_num: jax.Array | None = None
  kv_idx: jax.Array | None = None
  kv_full: jax.Array | None = None
  # The span walk's (`flash_schedule.Span`): each query block's first key
  # [Nq] and which keys of its span are in listed blocks [Nq, L Bk].
  span_first: jax.Array | None = None
  span_keep: jax.Array | None = None



def backward_cfg(cfg):
  """`cfg` with the backward's block lengths."""
  return cfg._replace(bq=cfg.bwd_bq, bk=cfg.bwd_bk)
