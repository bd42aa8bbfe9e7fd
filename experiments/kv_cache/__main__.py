r"""What a KV cache changes in decoding cost, measured on `DecoderLM`.

  python -m experiments.kv_cache --workdir=runs/kv_cache
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/behaviour/results.json

Writes report.md, results.json and PNG plots to `--workdir`. Sizes live in
configs/kv_cache.py (override with `--config.bench.contexts=64,128` etc.).

The model is the library's trained-model class, `transformer.DecoderLM`
(token embedding, L pre-LayerNorm attention + MLP blocks with rotary
positions, final LayerNorm, readout to V logits), which owns its cache;
the measurements are `experiments.kv_cache.decode_cost`.

`--behaviour_results` (optional) is a JSON file written by the training
experiments: {"command": str, "description": str, "runs": [{"name": str,
...metrics}]}. Its runs are shown side by side as a table; without it the
report says that behaviour was not measured in this run.
"""

from __future__ import annotations

import json
import pathlib

from absl import flags

from experiments import cli
from experiments.kv_cache import report
from experiments.kv_cache import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = cli.config_flag(
    "configs/kv_cache.py", "The measurement's config file; "
    "override fields as --config.bench.contexts=64,128")
_WORKDIR = flags.DEFINE_string("workdir", "runs/kv_cache",
                               "Where report.md, results.json, PNGs go.")
_BEHAVIOUR = flags.DEFINE_string(
    "behaviour_results", None, "Optional JSON of trained MHA/GQA/MQA LMs to "
    "include side by side (see the module docstring for its format).")


def run(cfg, workdir, *, behaviour=None,
        command: str | None = None) -> dict:
  """Measure (run.py), then write results.json, report.md and the plots
  (report.py).

  `behaviour`: the parsed `--behaviour_results` JSON, or None; `command`:
  the command line the report names (None: called from Python). Returns
  what results.json holds.
  """
  results = run_lib.measure(cfg, workdir, behaviour=behaviour)
  return report.write(cfg, results, workdir, command)


def main(argv):
  report_lib.check_no_arguments(argv)
  behaviour = None
  if _BEHAVIOUR.value:
    behaviour = json.loads(pathlib.Path(_BEHAVIOUR.value).read_text())
  run(_CONFIG.value, _WORKDIR.value, behaviour=behaviour,
      command=cli.command_line())
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  cli.run_app(main)
