"""From a ConfigDict (`configs/default.py`) to a checked config and a model.

`validate_config` runs before anything is built or traced and raises a
`ConfigError` (a ValueError) that names the offending field
(`config.model.num_heads`), what was expected and what came; the command
line reports it on one line. absl already rejects unknown keys and wrong
types in command-line overrides; this catches values that are each fine but
inconsistent together (d_model not divisible by num_heads, ...).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from mha_jax.core import precision
from mha_jax.models import model_config as model_config_lib
from mha_jax.training import tasks
from mha_jax.models import transformer

DTYPES = ("float32", "bfloat16", "float16")


_need = tasks.need


def _positive(group, cfg, *names):
  for name in names:
    val = cfg[name]
    _need(isinstance(val, int) and val >= 1, f"{group}.{name}",
          f"must be a positive int, got {val!r}")


class ConfigError(ValueError):
  """A config value that is wrong or inconsistent; the message names the
  field (`config.<group>.<field>: ...`)."""


def validate_config(config) -> None:
  """Raise `ConfigError` naming the field if `config` is inconsistent."""
  try:
    _validate(config)
  except ConfigError:
    raise
  except ValueError as e:  # the checks of tasks and ModelConfig
    raise ConfigError(str(e)) from None


def _validate(config) -> None:
  for group in ("model", "task", "train", "mesh"):
    _need(group in config, group, "missing group (start from "
          "configs/default.py get_config())")
  m, t, tr, ms = config.model, config.task, config.train, config.mesh
  for name in ("num_kv_heads", "head_dim", "mlp_dim", "max_len"):
    _need(isinstance(m[name], int) and m[name] >= 0, f"model.{name}",
          f"must be an int >= 0 (0 = default), got {m[name]!r}")
  _need(m.dtype in DTYPES, "model.dtype",
        f"expected one of {DTYPES}, got {m.dtype!r}")
  _need(m.param_dtype in DTYPES, "model.param_dtype",
        f"expected one of {DTYPES}, got {m.param_dtype!r}")
  _need(tr.get("matmul_precision", "") in precision.SETTINGS,
        "train.matmul_precision", f"expected one of {precision.SETTINGS}, "
        f"got {tr.get('matmul_precision')!r}")
  task = tasks.get_task(t.name)
  _positive("task", t, "batch_size", "seq_len")
  task.check(t)
  if m.max_len:
    _need(m.max_len >= t.seq_len, "model.max_len",
          f"max_len={m.max_len} is shorter than task.seq_len={t.seq_len}")
  try:  # every model field, checked once where the model's config is built
    model_config(config)
  except model_config_lib.ModelConfigError as e:
    raise ConfigError(f"config.model.{e.field}: {e.message}") from None

  _positive("train", tr, "num_steps", "log_every", "eval_every",
            "eval_batches", "checkpoint_every", "max_checkpoints")
  _need(tr.learning_rate > 0, "train.learning_rate",
        f"must be > 0, got {tr.learning_rate}")
  # Strictly below num_steps: the cosine phase needs at least one step
  # (optax rejects a decay of zero steps).
  _need(0 <= tr.warmup_steps < tr.num_steps, "train.warmup_steps",
        f"must be in [0, num_steps={tr.num_steps}), got {tr.warmup_steps}")
  _need(0.0 <= tr.end_lr_fraction <= 1.0, "train.end_lr_fraction",
        f"must be in [0, 1], got {tr.end_lr_fraction}")
  _need(tr.grad_clip >= 0, "train.grad_clip",
        f"must be >= 0 (0 disables), got {tr.grad_clip}")
  _need(ms.data == -1 or (isinstance(ms.data, int) and ms.data >= 1),
        "mesh.data", f"must be -1 (all devices) or >= 1, got {ms.data!r}")
  _positive("mesh", ms, "model")
  # Heads are the model-parallel axis: each device holds whole query heads.
  # (Too few kv heads are replicated instead; batch size vs the data axis
  # needs the device count: `sharding.mesh_from_config` checks it.)
  _need(m.num_heads % ms.model == 0, "mesh.model",
        f"mesh.model={ms.model} must divide model.num_heads={m.num_heads}")
  seq = ms.get("sequence", 1)  # configs saved before the axis existed
  _need(isinstance(seq, int) and seq >= 1, "mesh.sequence",
        f"must be a positive int, got {seq!r}")
  if seq > 1:
    # The sequence split needs attention that works on a split sequence.
    _need(m.implementation in ("ring", "all_to_all"), "mesh.sequence",
          f"mesh.sequence={seq} needs model.implementation 'ring' or "
          f"'all_to_all', got {m.implementation!r}")
    _need(t.seq_len % seq == 0, "mesh.sequence",
          f"mesh.sequence={seq} must divide task.seq_len={t.seq_len}")
    # All-to-all swaps the sequence split for a head split: each device's
    # query heads are dealt out over the sequence axis, so they must
    # divide by it (the ring has no such limit). Checked here, before a
    # workdir exists, rather than when the step is traced.
    local = m.num_heads // ms.model
    if m.implementation == "all_to_all":
      _need(local % seq == 0, "mesh.sequence",
            f"mesh.sequence={seq} must divide the {local} query heads per "
            f"device (model.num_heads={m.num_heads} / mesh.model="
            f"{ms.model}) for model.implementation 'all_to_all'; use "
            f"'ring', or a sequence axis that divides {local}")


def model_config(config) -> model_config_lib.ModelConfig:
  """The `ModelConfig` that `config` describes: the `model` group (0 means
  "the default" for the optional sizes) plus the task's inputs/outputs."""
  m, t = config.model, config.task
  task = tasks.get_task(t.name)
  io = task.io(t)
  kwargs = dict(
      vocab_size=io["vocab_size"], output_dim=io["output_dim"],
      d_model=m.d_model, num_layers=m.num_layers, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads or None, head_dim=m.head_dim or None,
      mlp_dim=m.mlp_dim or None, attention_only=m.attention_only,
      positions=m.positions, max_len=m.max_len or t.seq_len,
      use_bias=m.use_bias, dropout_rate=m.dropout_rate,
      implementation=m.implementation,
      dtype=jnp.dtype(m.dtype), param_dtype=jnp.dtype(m.param_dtype))
  # The variants: absent from older configs, 0 / "" / False mean off. A
  # window of W is W keys back (and, bidirectional, W ahead: causal
  # models never see ahead).
  window = m.get("local_window", 0)
  kwargs.update(
      local_window=(window, window) if window else None,
      logit_soft_cap=m.get("logit_soft_cap", 0.0) or None,
      attn_scale=m.get("attn_scale", 0.0) or None,
      attention_sinks=bool(m.get("attention_sinks", False)),
      qk_norm=m.get("qk_norm", "") or None)
  if task.model == "decoder":
    kwargs.update(input_dim=io["input_dim"], final_ln=m.final_ln)
  return model_config_lib.ModelConfig(**kwargs)


def build_model(config, rngs: nnx.Rngs):
  """A `DecoderLM` or `EncoderDecoder`, as the task requires."""
  validate_config(config)
  kind = tasks.get_task(config.task.name).model
  cls = (transformer.EncoderDecoder if kind == "encoder_decoder"
         else transformer.DecoderLM)
  return cls(model_config(config), rngs=rngs)
