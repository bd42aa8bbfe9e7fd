"""One load, alone in its process: load time and peak RSS as JSON.

    python -m experiments.pretrained_bench.load_child DIR mha_jax|transformers

The parent (`run.py`) starts one process per load, so each peak
(VmHWM) belongs to that load only; the RSS after the imports is the
baseline the load is measured from.
"""

from __future__ import annotations

import json
import sys
import time


def _status_kb(key: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(key + ":"):
        return int(line.split()[1])
  raise KeyError(key)


def main(directory: str, loader: str) -> dict:
  if loader == "mha_jax":
    import jax  # pylint: disable=import-outside-toplevel
    from flax import nnx  # pylint: disable=import-outside-toplevel
    import mha_jax  # pylint: disable=import-outside-toplevel
    jax.block_until_ready(jax.numpy.ones(1))  # start the CPU client first
    base = _status_kb("VmRSS")
    start = time.perf_counter()
    model = mha_jax.load_pretrained(directory)
    jax.block_until_ready(nnx.state(model))
  else:
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    base = _status_kb("VmRSS")
    start = time.perf_counter()
    transformers.AutoModel.from_pretrained(directory)
  seconds = time.perf_counter() - start
  return {"seconds": seconds, "base_mb": base / 1024,
          "peak_mb": _status_kb("VmHWM") / 1024}


if __name__ == "__main__":
  print(json.dumps(main(*sys.argv[1:3])))
