"""One load, alone in its process: load time and peak RSS as JSON.

    python -m experiments.pretrained_bench.load_child PATH mha_jax|transformers

PATH is a checkpoint directory or a GGUF file; transformers reads a
GGUF file through `gguf_file=` with its weights dequantized to float32,
as mha_jax's are. The parent (`run.py`) starts one process per load, so
each peak (VmHWM) belongs to that load only; the RSS after the imports
is the baseline the load is measured from.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time


def _status_kb(key: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(key + ":"):
        return int(line.split()[1])
  raise KeyError(key)


def _transformers_loader(path: str):
  """The call that loads `path` in transformers; made before the
  baseline so that the imports it needs are not counted as the load."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(2)
  transformers.utils.logging.disable_progress_bar()
  p = pathlib.Path(path)
  if p.is_file():  # GGUF: a causal LM, as the speed comparison runs it
    return lambda: transformers.AutoModelForCausalLM.from_pretrained(
        str(p.parent), gguf_file=p.name, dtype=torch.float32)
  return lambda: transformers.AutoModel.from_pretrained(path)


def main(path: str, loader: str) -> dict:
  if loader == "mha_jax":
    import jax  # pylint: disable=import-outside-toplevel
    from flax import nnx  # pylint: disable=import-outside-toplevel
    import mha_jax  # pylint: disable=import-outside-toplevel
    jax.block_until_ready(jax.numpy.ones(1))  # start the CPU client first
    base = _status_kb("VmRSS")
    start = time.perf_counter()
    model = mha_jax.load_pretrained(path)
    jax.block_until_ready(nnx.state(model))
  else:
    load = _transformers_loader(path)
    base = _status_kb("VmRSS")
    start = time.perf_counter()
    load()
  seconds = time.perf_counter() - start
  return {"seconds": seconds, "base_mb": base / 1024,
          "peak_mb": _status_kb("VmHWM") / 1024}


if __name__ == "__main__":
  print(json.dumps(main(*sys.argv[1:3])))
