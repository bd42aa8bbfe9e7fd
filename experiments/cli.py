"""The command line every experiment shares: its flags and its `main`.

`run_app(main)` is `absl.app.run` with two changes every entry point
uses: a `--config.<field>` that the config lacks is reported on one line
(the flag, the field and ml_collections' suggestion) with exit status 1,
where absl would end in a three-exception traceback; and JAX's INFO line
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
import logging
import os
import pathlib
import sys
from typing import Callable, NamedTuple

from absl import app
from absl import flags
from ml_collections import config_flags

from mha_jax.measure import report as report_lib


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
  """Exit with absl's one-line flag error for an override of a field the
  config lacks (re-raise anything else)."""
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
  """absl's report of a bad flag: one line, exit status 1, no traceback."""
  print(f"FATAL Flags parsing error: {message}\nPass --helpshort or "
        "--helpfull to see help on flags.", file=sys.stderr)
  sys.exit(1)


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
    _fatal(str(e))


def parse_flags(argv: list[str]) -> list[str]:
  """`flags.FLAGS(argv)`, with an override of a missing config field
  turned into absl's one-line flag error."""
  try:
    return flags.FLAGS(argv)
  except AttributeError as e:
    _unknown_field(e, argv)
  except flags.Error as e:
    _fatal(str(e))


def run_app(main_fn: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main_fn)` with `parse_flags`, and the command line
  recorded for the reports this process writes."""
  def _main(argv):
    # `python -m <this package>` and the flags as typed (absl has consumed
    # them from `argv`).
    spec = sys.modules["__main__"].__spec__
    module = spec.name.removesuffix(".__main__") if spec else sys.argv[0]
    report_lib.record_command(sys.argv, module)
    return main_fn(argv)
  app.run(_main, flags_parser=parse_flags)


def main(run: Callable[..., dict], fl: ExperimentFlags) -> None:
  """Parse the command line, then `run(config, workdir, reuse_runs=...)`
  and print where the report is."""
  def _main(argv):
    report_lib.check_no_arguments(argv)
    run(fl.config.value, fl.workdir.value, reuse_runs=fl.reuse_runs.value)
    print(f"Report: {pathlib.Path(fl.workdir.value) / 'report.md'}")
  run_app(_main)
