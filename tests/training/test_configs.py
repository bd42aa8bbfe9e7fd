"""Configs: every shipped one builds, overrides reach the model, bad fail."""

import importlib
import os
import pathlib
import subprocess
import sys

import pytest
from absl import flags
from flax import nnx
from ml_collections import config_flags

from configs import default
from mha_jax.core import attention
from mha_jax.training import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.py")
                 if p.name != "__init__.py")


def _abstract_model(config):
  """The model's parameter shapes, without allocating or computing them."""
  return nnx.eval_shape(lambda: config_lib.build_model(config,
                                                      nnx.Rngs(params=0)))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_training_config_validates_and_builds(path):
  module = importlib.import_module(f"configs.{path.stem}")
  config = module.get_config()
  text = path.read_text()
  assert "python -m experiments." in text.split('"""')[1]  # opens with command
  if not all(g in config for g in ("model", "task", "train", "mesh")):
    pytest.skip("not a training config")
  config_lib.validate_config(config)
  model = _abstract_model(config)
  assert model.config.num_layers == config.model.num_layers
  assert len(model.blocks if hasattr(model, "blocks")
             else model.decoder.blocks) == config.model.num_layers


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_has_a_smoke_variant_and_refuses_other_arguments(path):
  module = importlib.import_module(f"configs.{path.stem}")
  full, smoke = module.get_config(), module.get_config("smoke")
  # Smaller, never a different structure: every field still overridable.
  assert sorted(_leaves(smoke)) == sorted(_leaves(full))
  assert smoke.to_dict() != full.to_dict()
  if "train" in smoke:
    config_lib.validate_config(smoke)
    assert smoke.train.num_steps <= 10 < full.train.num_steps
    assert _abstract_model(smoke).config.d_model <= 16
  if "experiment" in smoke and "seeds" in smoke.experiment:
    assert 1 <= len(smoke.experiment.seeds) <= 2
  with pytest.raises(ValueError, match=(
      rf"configs/{path.stem}.py: unknown config argument 'smok'.*expected "
      r"none \(the full run\) or 'smoke'")):
    module.get_config("smok")


def _leaves(config, prefix=""):
  """Dotted names of every field of a ConfigDict."""
  out = []
  for k, v in config.items():
    if hasattr(v, "items"):
      out += _leaves(v, f"{prefix}{k}.")
    else:
      out.append(prefix + k)
  return out


def test_default_config_names_every_attention_implementation():
  """The comment on model.implementation lists attention.PATHS."""
  text = (ROOT / "configs" / "default.py").read_text()
  comment = text.split("m.implementation =")[0].rsplit("# Core attend", 1)[1]
  listed = {w.strip(" .\n#") for w in comment.split(":", 1)[1]
            .split("Only")[0].split("|")}
  assert listed == set(attention.PATHS)


def _parse(*overrides, path=ROOT / "configs" / "default.py"):
  argv = ["prog", f"--config={path}", *overrides]
  fv = flags.FlagValues()
  # The override flags are discovered from the argv seen at definition.
  holder = config_flags.DEFINE_config_file(
      "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv)
  fv(argv)
  return holder.value


def test_command_line_overrides_reach_the_model():
  config = _parse("--config.model.num_heads=8", "--config.model.num_kv_heads=2",
                  "--config.model.d_model=32", "--config.task.seq_len=20")
  attn = _abstract_model(config).blocks[0].attn
  assert attn.w_q.shape == (32, 8, 4)  # [D, H, Dh]
  assert attn.w_k.shape == (32, 2, 4)  # [D, K, Dh]
  assert _abstract_model(config).config.max_len == 20


def test_unknown_key_and_wrong_type_fail():
  with pytest.raises(AttributeError, match="num_head"):  # a typo is refused
    _parse("--config.model.num_head=8")
  with pytest.raises(flags.IllegalFlagValueError, match="four"):
    _parse("--config.model.num_heads=four")


@pytest.mark.parametrize("field,value,message", [
    ("model.num_heads", 3, "config.model.d_model: d_model=64 is not divisible"),
    ("model.num_kv_heads", 3, "config.model.num_kv_heads"),
    ("model.positions", "relative", "config.model.positions"),
    ("model.implementation", "cuda", "config.model.implementation"),
    ("model.dtype", "int8", "config.model.dtype"),
    ("model.dropout_rate", 1.5, "config.model.dropout_rate"),
    ("model.max_len", 8, "config.model.max_len"),
    ("task.name", "sort", "config.task.name"),
    ("task.max_segment", 30, "config.task.max_segment"),
    ("train.warmup_steps", 10**6, "config.train.warmup_steps"),
    ("train.learning_rate", 0.0, "config.train.learning_rate"),
    ("train.matmul_precision", "tf32", "config.train.matmul_precision"),
    ("mesh.model", 0, "config.mesh.model"),
])
def test_inconsistent_values_name_the_field(field, value, message):
  config = default.get_config()
  group, name = field.split(".")
  config[group][name] = value
  with pytest.raises(ValueError, match=message):
    config_lib.validate_config(config)


def test_rotary_needs_even_head_width():
  config = default.get_config()
  config.model.update(positions="rotary", d_model=12, num_heads=4)
  with pytest.raises(ValueError, match="config.model.head_dim"):
    config_lib.validate_config(config)


def _run_entry_point(*args, cwd):
  """The real command line, in its own process (absl flags are global)."""
  return subprocess.run(
      [sys.executable, "-m", "experiments.train", *args], cwd=cwd,
      capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("config, override, message", [
    ("configs/default.py", "--config.model.num_heads=3",
     "config.model.d_model"),
    ("configs/default.py", "--config.model.no_such_field=1", "no_such_field"),
    ("configs/default.py", "--config.model.num_heads=four", "num_heads"),
    ("configs/default.py:smok", "--config.train.seed=0",
     "unknown config argument 'smok'"),
])
def test_entry_point_rejects_bad_config_before_training(tmp_path, config,
                                                        override, message):
  root = pathlib.Path(__file__).parents[2]
  workdir = tmp_path / "run"
  proc = _run_entry_point(f"--config={config}", f"--workdir={workdir}",
                          override, cwd=root)
  assert proc.returncode != 0
  assert message in proc.stderr, proc.stderr[-2000:]
  assert not workdir.exists()  # failed before writing anything


def test_warmup_must_leave_at_least_one_decay_step():
  config = default.get_config()
  config.train.warmup_steps = config.train.num_steps
  with pytest.raises(ValueError, match="config.train.warmup_steps"):
    config_lib.validate_config(config)


@pytest.mark.parametrize("args, message", [
    (["experiments.train", "--config=configs/copy.py:smoke",
      "--config.model.num_head=8", "--workdir=unused"],
     "--config.model.num_head: the config has no field 'num_head' "
     "(Did you mean \"num_heads\" instead of \"num_head\"?)"),
    # Without --config, ml_collections parses overrides of the default
    # config when the flag is defined, at import.
    (["experiments.pruning", "--config.model.num_head=8"],
     "--config.model.num_head: the config has no field 'num_head'"),
    (["experiments.pruning", "--config.model.num_heads=abc"],
     "flag --config.model.num_heads=abc: invalid literal for int()"),
])
def test_a_bad_config_override_is_one_line_and_a_failure(args, message):
  """A typo or a bad value in --config.<field> gets one line naming the
  field (and the suggestion), exit status 1, no traceback, no help dump
  and no "Pass --helpshort" line."""
  proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert message in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_entry_points_do_not_print_the_tpu_probe_line(tmp_path):
  """JAX logs "Unable to initialize backend 'tpu'" at INFO on every
  machine without one; the entry points' log leaves that line out and
  keeps the rest."""
  proc = _run_entry_point("--config=configs/copy.py:smoke",
                          f"--workdir={tmp_path}",
                          "--config.train.num_steps=3",
                          "--config.train.warmup_steps=1",
                          cwd=pathlib.Path(__file__).parents[2])
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "Unable to initialize backend 'tpu'" not in proc.stderr
  assert "eval step 3" in proc.stderr  # the INFO log itself still shows
