r"""Default: a 2-layer attention-only decoder on the induction task.

  python -m experiments.train --config=configs/default.py \
      --workdir=runs/default

Trains in about a minute on 2 CPU cores. The eval loss on the repeated
half starts near ln(V - 3) = ln 13 = 2.56 (guessing among the symbols) and
falls below 1.0 by step 1500 once induction heads form (seed 0: 0.92).
Every experiment config imports this one and overrides a few fields.

Every config takes one optional argument after a colon:
`--config=configs/<name>.py:smoke` shrinks the run to seconds (a tiny model,
a handful of steps, one or two seeds), to check that a command runs end to
end; tests/experiments/test_experiments.py runs every experiment that way.
"""

import ml_collections

SMOKE = "smoke"  # the one accepted `get_config` argument


def is_smoke(arg, path: str) -> bool:
  """Whether `arg` (after the colon of `--config=<path>:<arg>`) asks for
  the smoke run; None is the full run and anything else is refused."""
  if arg is None:
    return False
  if arg == SMOKE:
    return True
  raise ValueError(
      f"{path}: unknown config argument {arg!r} (as in --config={path}:"
      f"{arg}); expected none (the full run) or {SMOKE!r} (a tiny run of a "
      "few seconds)")


def shrink(c) -> None:
  """Smoke sizes for any training config: a 16-wide model with 2 heads on
  short induction sequences of 8 ids, 6 steps of batch 8, evaluated at
  steps 3 and 6 on one batch. Configs of other tasks override the task."""
  c.model.update(d_model=16, num_heads=2)
  c.task.update(batch_size=8, seq_len=12, vocab_size=8, min_segment=2,
                max_segment=4)
  c.train.update(num_steps=6, warmup_steps=2, log_every=3, eval_every=3,
                 eval_batches=1)
  c.smoke = True


def get_config(arg=None) -> ml_collections.ConfigDict:
  """The full set of fields; experiment configs override some of them.

  `arg`: None, or "smoke" for a few-second run (see `shrink`).
  """
  smoke = is_smoke(arg, "configs/default.py")
  c = ml_collections.ConfigDict()
  # True for the smoke sizes (`shrink`): the report then says it is a
  # smoke run and draws no conclusion.
  c.smoke = False

  c.model = m = ml_collections.ConfigDict()
  m.d_model = 64  # D, residual stream width
  m.num_layers = 2  # L, transformer blocks
  m.num_heads = 4  # H, query heads per attention layer
  m.num_kv_heads = 0  # K, key/value heads; 0 means K = H (1 = multi-query)
  m.head_dim = 0  # Dh, per-head width; 0 means d_model // num_heads
  m.mlp_dim = 0  # MLP hidden width; 0 means 4 * d_model
  m.attention_only = True  # drop the MLPs (attention + residuals only)
  m.positions = "learned"  # learned | sinusoidal | rotary | alibi | none
  m.max_len = 0  # longest sequence; 0 means the task's seq_len
  m.final_ln = True  # LayerNorm before the readout (decoder models)
  m.use_bias = False  # biases on the attention projections
  m.dropout_rate = 0.0  # attention-weight dropout while training
  # Core attend path, a key of mha_jax.core.attention.PATHS: vmap |
  # einsum | flash | xla | cudnn | pallas_tpu | pallas_gpu | auto. Only vmap
  # and einsum form the weights that return_weights and the head analyses
  # read.
  m.implementation = "einsum"
  # Attention variants (mha_jax.core.score_rules; 0 / "" / False: off).
  m.local_window = 0  # W > 0: keys at most W positions away (sliding)
  m.logit_soft_cap = 0.0  # c > 0: scores -> c * tanh(scores / c)
  m.attn_scale = 0.0  # > 0: the q.k multiplier instead of 1 / sqrt(Dh)
  m.attention_sinks = False  # a learned sink logit per head
  m.qk_norm = ""  # "" | rms | layer: QK-norm on q and k per head
  m.dtype = "float32"  # compute dtype (softmax stays float32)
  m.param_dtype = "float32"  # parameter storage dtype

  c.task = t = ml_collections.ConfigDict()
  t.name = "induction"  # see mha_jax.training.tasks.TASKS
  t.batch_size = 64  # examples per step
  t.seq_len = 32  # T, model input length
  t.vocab_size = 16  # V, ids incl. PAD/BOS/SEP (two_offset_token: symbols)
  t.min_segment = 3  # induction: shortest repeated segment
  t.max_segment = 8  # induction: longest repeated segment
  t.bos = False  # induction: every sequence starts with BOS (tasks.BOS)
  t.min_len = 4  # reverse: shortest source sequence
  t.feature_dim = 8  # two_offset_continuous: F, width of each u_t

  c.train = tr = ml_collections.ConfigDict()
  tr.seed = 0  # one seed for init, data and dropout
  tr.num_steps = 1500  # optimizer steps
  tr.learning_rate = 3e-3  # peak learning rate
  tr.warmup_steps = 50  # linear warmup from 0 to the peak
  tr.end_lr_fraction = 0.1  # cosine decays to this fraction of the peak
  tr.weight_decay = 0.01  # AdamW decay on matrices (not biases, norms)
  tr.b1 = 0.9  # Adam beta1
  tr.b2 = 0.98  # Adam beta2
  tr.grad_clip = 1.0  # global gradient norm clip; 0 disables
  tr.log_every = 100  # steps between metrics lines
  tr.eval_every = 500  # steps between evaluations on held-out batches
  tr.eval_batches = 4  # batches per evaluation
  tr.checkpoint_every = 500  # steps between orbax checkpoints
  tr.max_checkpoints = 2  # checkpoints kept on disk
  # What float32 matmuls compute (mha_jax/core/precision.py, docs/
  # precision.md): "" is exact float32 on every backend; "tensorfloat32"
  # or "bfloat16" opt into the GPU's or TPU's faster passes (any name
  # jax.default_matmul_precision takes). A CPU is exact whatever it says.
  tr.matmul_precision = ""

  # Device mesh for sharded runs; sizes of the (data, sequence, model) axes.
  c.mesh = ms = ml_collections.ConfigDict()
  ms.data = -1  # data-parallel axis; -1 means all remaining devices
  ms.model = 1  # head-parallel axis size
  # Context-parallel axis; > 1 needs implementation ring or all_to_all, and
  # all_to_all also needs it to divide the heads per device (H / model).
  ms.sequence = 1
  if smoke:
    shrink(c)
  return c
