"""The command line every experiment shares: its flags and its `main`.

`run_app(main)` is `absl.app.run` with two changes every entry point
uses. Errors first: a command-line error ends in one line, `Error: ` and
what is wrong with which argument (and what to give instead), exit
status 1, where absl and ml_collections would print a traceback, the
config or the whole `--help` before it. That covers a `--config` file
that does not exist, a config argument (`:smok`) its `get_config`
refuses, a `--config.<field>` the config lacks or a value it cannot
parse, a value `validate_config` refuses (`ConfigError`), a workdir
another run holds, and every `app.UsageError`. And JAX's INFO line
"Unable to initialize backend 'tpu'", which its platform probe logs on
every machine without a TPU, is not shown (its warnings and errors, and
every other backend's lines, are).

Each `experiments/<name>/__main__.py` defines its flags at import with

  _FLAGS = cli.experiment_flags(config="configs/<name>.py",
                                workdir="runs/<name>")

(`--config`, with `--config.<field>=...` overrides, `--workdir` and
`--reuse_runs`), a `run(config, workdir, *, reuse_runs)` that measures
and reports, and hands both to `cli.main`.

An entry point that needs more devices than the machine has starts
itself again in a child whose environment `env_with_devices` sets
(simulated CPU devices exist only if XLA_FLAGS is set before JAX starts).
"""

from __future__ import annotations

import ast
import difflib
import logging
import os
import pathlib
import re
import sys
from typing import Callable, NamedTuple

from absl import app
from absl import flags
from ml_collections import config_flags

from mha_jax.measure import report as report_lib
from mha_jax.training import config as config_lib
from mha_jax.training import host_memory
from mha_jax.training import workdir as workdir_lib


class _NoTpuProbeLine(logging.Filter):
  """Drops the INFO record of JAX's failed probe for a TPU backend."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno <= logging.INFO and record.getMessage()
                .startswith("Unable to initialize backend 'tpu'"))


logging.getLogger("jax._src.xla_bridge").addFilter(_NoTpuProbeLine())


class ExperimentFlags(NamedTuple):
  config: flags.FlagHolder
  workdir: flags.FlagHolder
  reuse_runs: flags.FlagHolder


def experiment_flags(*, config: str, workdir: str) -> ExperimentFlags:
  """Define `--config` (default `config`), `--workdir` (default
  `workdir`) and `--reuse_runs`."""
  return ExperimentFlags(
      config_flag(config, "The experiment's config file; override fields "
                  "as --config.train.num_steps=..."),
      flags.DEFINE_string(
          "workdir", workdir, "Output folder: report.md, results.json, "
          "figures, explorer.html and one sub-folder per training run."),
      flags.DEFINE_bool(
          "reuse_runs", False, "Load a finished run whose config.json "
          "matches instead of training it again (to redo only the "
          "analysis)."))


def env_with_devices(devices: int) -> dict:
  """The environment of a child run: CPU, with `devices` simulated ones."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags_ = [f for f in env.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
  if devices > 1:
    flags_.append(f"--xla_force_host_platform_device_count={devices}")
  env["XLA_FLAGS"] = " ".join(flags_)
  return env


def _unknown_field(e: AttributeError, argv: list[str]) -> None:
  """Exit with one line for an override of a field the config lacks
  (re-raise anything else)."""
  # ml_collections raises AttributeError(KeyError(message)) from deep in
  # the override parser; its message is the repr of "'<key>'\n<hint>".
  try:
    message = ast.literal_eval(str(e))
  except (ValueError, SyntaxError):
    raise e from None
  if not isinstance(message, str):
    raise e from None
  key, _, hint = message.partition("\n")
  key = key.strip("'")
  given = [a.split("=")[0] for a in argv[1:]
           if a.startswith("--config.")
           and a.split("=")[0].rsplit(".", 1)[-1] == key] or [
               f"--config.{key}"]
  _fatal(f"{given[0]}: the config has no field {key!r}"
         + (f" ({hint})" if hint else ""))


def _fatal(message: str) -> None:
  """End the command with `message` as its one and last line: exit status
  1, no traceback, no help text."""
  print(f"Error: {message}", file=sys.stderr)
  sys.exit(1)


def _config_arg(argv: list[str]) -> str | None:
  """The value of `--config` as given in `argv`, else the flag's default
  (None if neither, or if this program has no `--config`)."""
  if "config" not in flags.FLAGS:
    return None
  for i, a in enumerate(argv[1:], 1):
    name, eq, value = a.partition("=")
    if name in ("--config", "-config"):
      if eq:
        return value
      return argv[i + 1] if i + 1 < len(argv) else None
  flag = flags.FLAGS["config"]
  return None if flag.default is None else flag.default_as_str.strip("'")


def missing_config_file(arg: str, cwd: pathlib.Path) -> str | None:
  """The one-line error for `--config=<arg>` if its file (`arg` before any
  `:`) does not exist relative to `cwd`, else None. Names a near file of
  the same folder, or the folder the configs live in."""
  path, colon, variant = arg.partition(":")
  if (cwd / path).is_file():
    return None
  folder = (cwd / path).parent
  names = sorted(f.name for f in folder.glob("*.py")
                 if f.name != "__init__.py") if folder.is_dir() else []
  # A typo of one of them, else the list to choose from.
  near = difflib.get_close_matches(pathlib.Path(path).name, names, n=1,
                                   cutoff=0.8)
  if near:
    fix = (f"did you mean --config="
           f"{pathlib.Path(path).with_name(near[0])}{colon}{variant}?")
  elif names:
    fix = f"{pathlib.Path(path).parent}/ holds {', '.join(names)}"
  else:
    fix = ("the experiments' configs are configs/*.py, run from the "
           "repository root")
  return f"--config={arg}: no such file {path} (in {cwd}); {fix}"


def _config_error(e: flags.Error, arg: str | None) -> str:
  """absl's message for a bad flag, or, when the config file's
  `get_config` raised, that exception's own message (ml_collections
  wraps it in the whole traceback)."""
  message = str(e)
  if "Error whilst parsing config file" not in message:
    return message
  last = message.strip().splitlines()[-1].strip()
  last = re.sub(r"^[A-Za-z_][\w.]*: ", "", last)  # "ValueError: ..."
  path = (arg or "").partition(":")[0]
  return last if path and path in last else f"--config={arg}: {last}"


def config_flag(default: str | None, help_text: str) -> flags.FlagHolder:
  """`--config` (a config file, `path.py[:arg]`, with `--config.<field>`
  overrides), locked. With a default, ml_collections parses the overrides
  here, at import, so a missing field is reported here too."""
  try:
    return config_flags.DEFINE_config_file("config", default, help_text,
                                           lock_config=True)
  except AttributeError as e:
    _unknown_field(e, sys.argv)
  except flags.Error as e:  # a bad value, as absl reports it at parse time
    _fatal(_config_error(e, default))


def parse_flags(argv: list[str]) -> list[str]:
  """`flags.FLAGS(argv)`, with every error in the `--config` flag and its
  overrides ended by `_fatal` in one line."""
  arg = _config_arg(argv)
  missing = arg and missing_config_file(arg, pathlib.Path.cwd())
  if missing:
    _fatal(missing)
  try:
    rest = flags.FLAGS(argv)
  except AttributeError as e:
    _unknown_field(e, argv)
  except flags.Error as e:
    _fatal(_config_error(e, arg))
  if arg is not None:
    try:
      # ml_collections stands in an object that raises OSError on any use
      # for a config file it could not read; say so now, not at first use.
      getattr(flags.FLAGS["config"].value, "lock", None)
    except OSError as e:
      reason = str(e.__cause__ or e).strip().splitlines()[-1].strip()
      _fatal(f"--config={arg}: could not be read ({reason})")
  return rest


# The errors of a command, not of the code: their messages name the
# argument, what was expected and what came.
_COMMAND_ERRORS = (app.UsageError, config_lib.ConfigError,
                   workdir_lib.WorkdirInUse)


def command_line() -> str:
  """This process's command as a report names it: `python -m <the
  package run>` and the flags as typed (`sys.argv`: absl leaves it whole
  and hands `main` what it did not consume). An entry point passes it to
  its run, which passes it to the report."""
  spec = sys.modules["__main__"].__spec__
  module = spec.name.removesuffix(".__main__") if spec else sys.argv[0]
  return report_lib.command_line(sys.argv, module)


def run_app(main_fn: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main_fn)` with `parse_flags` and `_COMMAND_ERRORS`
  reported in one line."""
  def _main(argv):
    try:
      return main_fn(argv)
    except _COMMAND_ERRORS as e:
      _fatal(str(e))
  app.run(_main, flags_parser=parse_flags)


def _trains(config) -> bool:
  """Whether `config` is a training config (its model, task, train and
  mesh groups)."""
  return hasattr(config, "keys") and all(
      g in config for g in ("model", "task", "train", "mesh"))


def keep_freed_memory_if_asked(config) -> dict:
  """`host_memory.keep_freed_memory()` when `config.keep_freed_memory` (a
  benchmark's setting), else the answer for a run that did not ask; the
  benchmarks record it beside their times."""
  if config.keep_freed_memory:
    return host_memory.keep_freed_memory()
  return {"applied": False, "reason": "off in the config"}


def main(run: Callable[..., dict], fl: ExperimentFlags) -> None:
  """Parse the command line, check a training config, then
  `run(config, workdir, reuse_runs=..., command=...)` and print where the
  report is. `command` is `command_line()`, the command the report names:
  an argument, so a run called from Python (`command=None`) or a report
  rendered again names its own, never one left by an earlier run in the
  process. The process keeps freed host memory first, unless the config
  has a `keep_freed_memory` setting of its own (a benchmark's, which the
  benchmark applies and records)."""
  def _main(argv):
    report_lib.check_no_arguments(argv)
    config = fl.config.value
    if _trains(config):
      # Refused here, before a run folder exists, rather than by the
      # first run (runs.variant checks every run's config again).
      config_lib.validate_config(config)
    if "keep_freed_memory" not in config:
      # A process-wide allocator setting (host_memory's docstring) is the
      # command's choice: the library's functions, which a user may call
      # in a process of their own, do not make it. Training and the
      # gradient calls of the interpretability experiments both gain
      # (docs/performance.md: SmolLM2's EAP edge scores 8.1-8.9 s a
      # call with it, 9.4-10.2 s without).
      host_memory.keep_freed_memory()
    run(config, fl.workdir.value, reuse_runs=fl.reuse_runs.value,
        command=command_line())
    print(f"Report: {pathlib.Path(fl.workdir.value) / 'report.md'}")
  run_app(_main)
