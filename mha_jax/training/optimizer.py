"""The optimizer every training run uses: AdamW with linear warmup, cosine
decay and global-norm clipping, one object per setting.
"""

from __future__ import annotations

import functools

import jax
import ml_collections
import optax


def make_optimizer(train_cfg) -> optax.GradientTransformation:
  """AdamW with linear warmup, cosine decay and global-norm clipping."""
  tr = train_cfg
  return _optimizer(tr.learning_rate, tr.warmup_steps, tr.num_steps,
                    tr.end_lr_fraction, tr.weight_decay, tr.b1, tr.b2,
                    tr.grad_clip)


# Memoised so that equal settings give the SAME transformation object: it is
# a static field of TrainState, and jit reuses a compiled step only when the
# static fields compare equal (an optax transformation compares its
# functions by identity), so several seeds in one process compile once.
# A module-level cache rather than one the caller holds, because every
# TrainState (`create_train_state`, `load_state`) must get the same object
# without a caller threading it through. Keyed by the eight numbers;
# bounded at 64 settings (the least recently used is dropped, and a
# dropped setting's next state compiles its step again). What a user can
# observe: `make_optimizer` returns one immutable object for equal
# settings; never a different number.
@functools.lru_cache(maxsize=64)
def _optimizer(learning_rate, warmup_steps, num_steps, end_lr_fraction,
               weight_decay, b1, b2, grad_clip):
  tr = ml_collections.ConfigDict(locals())
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=tr.learning_rate,
      warmup_steps=tr.warmup_steps, decay_steps=tr.num_steps,
      end_value=tr.learning_rate * tr.end_lr_fraction)
  # Decay matrices only: shrinking LayerNorm scales and biases has no
  # regularising meaning.
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  adamw = optax.adamw(schedule, b1=tr.b1, b2=tr.b2,
                      weight_decay=tr.weight_decay, mask=decay_mask)
  if tr.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(tr.grad_clip), adamw)
  return adamw
