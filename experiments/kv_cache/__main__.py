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

import json
import os
import pathlib

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from mha_jax.measure import report as report_lib
from experiments.kv_cache import report as kv_cache_report
from experiments.kv_cache import decode_cost

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/kv_cache.py", "The measurement's config file; "
    "override fields as --config.bench.contexts=64,128", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/kv_cache",
                               "Where report.md, results.json, PNGs go.")
_BEHAVIOUR = flags.DEFINE_string(
    "behaviour_results", None, "Optional JSON of trained MHA/GQA/MQA LMs to "
    "include side by side (see the module docstring for its format).")


def _machine() -> dict:
  return {"backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()],
          "cpu_count": os.cpu_count(), "jax": jax.__version__,
          "loadavg": [os.getloadavg()[0]]}


def run(cfg, workdir, *, behaviour=None) -> dict:
  """Measure, then write results.json, report.md and the plots.

  `behaviour`: the parsed `--behaviour_results` JSON, or None. Returns what
  results.json holds.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  model = decode_cost.make_model(cfg, cfg.model.num_kv_heads)
  results = {
      "config": cfg.to_dict(),
      "machine": _machine(),
      "timing": [decode_cost.bench_context(cfg, model, n)
                 for n in cfg.bench.contexts],
      "cache_bytes": decode_cost.cache_bytes(cfg),
      "intensity": decode_cost.intensity(cfg),
      "exactness_max_rel_err": decode_cost.exactness(cfg),
      "behaviour": behaviour,
  }
  results["machine"]["loadavg"].append(os.getloadavg()[0])
  results["summary"] = kv_cache_report.summarise(cfg, results)
  kv_cache_report.plots(results, workdir)
  return report_lib.write_outputs(workdir, results,
                              kv_cache_report.report(cfg, results))


def main(argv):
  report_lib.check_no_arguments(argv)
  behaviour = None
  if _BEHAVIOUR.value:
    behaviour = json.loads(pathlib.Path(_BEHAVIOUR.value).read_text())
  run(_CONFIG.value, _WORKDIR.value, behaviour=behaviour)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
