"""The models and tokens of the SAE experiment.

Shape letters: B batch, T tokens, N windows.

`load(config, workdir)` gives a `Source`: the model, the token batches
whose activations train the SAEs, the held-out batches (with next-token
targets and a loss mask) on which they are measured, and the token range
and BOS of the repeated random tokens:
  * "induction": the 2-layer model of configs/induction.py, trained here
    with the project's own training code into `workdir/model_seed0` unless
    a finished run with the same config is there; its data are the task's
    batches (random tokens, one segment repeated), training batches and
    held-out batches from separate keys.
  * "smollm2": SmolLM2-135M-Instruct from its GGUF file, on windows of
    the standard library's text (`text_corpus`, stdlib), tokenized by the
    model's tokenizer; training windows from the corpus's train files,
    held-out windows from its held-out files.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from flax import nnx
import jax
import numpy as np

import mha_jax
from mha_jax.interp import head_metrics
from mha_jax.measure import runs as runs_lib
from mha_jax.pretrained import real_models
from mha_jax.sae import buffer
from mha_jax.training import held_out
from mha_jax.training import text_corpus
from mha_jax.training import train_state


class Source(NamedTuple):
  model: object
  label: str
  train_tokens: list  # [B, T] int32 batches
  eval_batches: list  # dicts: inputs, targets, loss_mask
  decode: object  # ids -> list of token strings (the viewer's labels)
  model_wall_s: float  # time to train or load the model


def load(config, workdir) -> Source:
  if config.source == "induction":
    return _induction(config, workdir)
  if config.source == "smollm2":
    return _smollm2(config)
  raise ValueError(f"config.source: expected 'induction' or 'smollm2', got "
                   f"{config.source!r}")


def _induction(config, workdir) -> Source:
  start = time.perf_counter()
  run = next(runs_lib.seed_runs(config.model, workdir, (0,),
                                "model_seed{seed}", reuse=True))
  model = run.state.model()
  e = config.experiment
  # Keys far from the training run's data keys and from held_out's.
  draw = lambda key: held_out.analysis_batch(run.config, run.config.task
                                             .batch_size, seed=key)
  train_tokens = [np.asarray(draw(700_000 + i)["inputs"])
                  for i in range(e.train_batches)]
  evals = [jax.tree.map(np.asarray, draw(800_000 + i))
           for i in range(e.eval_batches)]
  return Source(model, "2-layer induction model (configs/induction.py, "
                "seed 0)", train_tokens, evals,
                lambda ids: [str(int(i)) for i in ids],
                time.perf_counter() - start)


def reinitialised(config, src: Source, seed: int) -> Source:
  """`src` with its model replaced by the same architecture freshly
  initialised and never trained: the same tokens, the same hook sites, no
  learned circuit. The induction model is re-made by the training code
  (`train.seed` = `seed`); a loaded model (SmolLM2) by the model class's
  own initialiser on its config (`nnx.Rngs(seed)`), not by the original
  training recipe's, which the weights file does not record."""
  if config.source == "induction":
    c = runs_lib.variant(config.model, **{"train.seed": seed})
    model = train_state.create_train_state(c).model()
  elif config.source == "smollm2":
    model = type(src.model)(src.model.config, rngs=nnx.Rngs(seed))
  else:
    raise ValueError(f"reinitialised: config.source: expected 'induction' "
                     f"or 'smollm2', got {config.source!r}")
  return src._replace(model=model, label=f"the same architecture, "
                      f"re-initialised (seed {seed}) and untrained",
                      model_wall_s=0.0)


def _smollm2(config) -> Source:
  start = time.perf_counter()
  path = real_models.smollm2_135m()
  model = mha_jax.load_pretrained(path)
  tok = mha_jax.pretrained.load_tokenizer(path)
  e = config.experiment

  def encode(texts):
    ids, mask = mha_jax.pretrained.encode(tok, list(texts))
    return [np.asarray(i[m], np.int32) for i, m in zip(ids, mask)]

  corpus = text_corpus.load(text_corpus.STDLIB, window=e.text_len)
  windows = buffer.text_windows(encode, corpus.train, e.text_windows,
                                e.text_len, seed=e.data_seed)
  held = buffer.text_windows(encode, corpus.held_out, e.eval_windows,
                             e.text_len + 1, seed=e.data_seed)
  batch = e.collect_batch
  train_tokens = [windows[a:a + batch] for a in range(0, len(windows), batch)]
  evals = [{"inputs": held[a:a + batch, :-1], "targets": held[a:a + batch, 1:],
            "loss_mask": np.ones_like(held[a:a + batch, 1:], np.float32)}
           for a in range(0, len(held), batch)]
  labels = lambda ids: [tok.decode([int(i)]) for i in ids]
  return Source(model, "SmolLM2-135M-Instruct (Q4_1 GGUF)", train_tokens,
                evals, labels, time.perf_counter() - start)


def induction_heads_of(pattern, tokens, threshold: float):
  """`(scores [H], heads)`: induction scores of a layer's `pattern [N, H,
  T, T]` on `tokens [N, T]`, and the heads above `threshold`."""
  scores = np.asarray(head_metrics.induction_score(pattern,
                                                   jax.numpy.asarray(tokens)))
  return scores, [int(h) for h in np.flatnonzero(scores > threshold)]
