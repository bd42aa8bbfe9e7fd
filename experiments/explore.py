r"""Explore a trained model's heads in a browser: one self-contained page.

  python -m experiments.train --config=configs/default.py \
      --workdir=runs/default
  python -m experiments.explore --workdir=runs/default --batch_from_task
  python -m experiments.explore --workdir=runs/default \
      --text="7 12 5 9 4 7 12 5"
  python -m experiments.explore --pretrained=path/to/gpt2 \
      --text="The cat sat on the mat. The cat" --output=gpt2.html

Writes explorer.html into --workdir (or --output): open it from disk in
any browser; it loads nothing from the network. It shows one example's
tokens, a layer x head grid of patterns, the chosen head's heatmap with
token labels and the weight under the pointer, where each head sends a
chosen query in the text, and a sortable table of each head's scores
(`mha_jax.interp.explorer`, docs/explorer.md).

Input, one of:
  --batch_from_task  held-out examples of the run's own task, drawn as the
                     experiments draw their analysis batch (same size and
                     seed), so the table's numbers are the report's;
  --text             one sequence of token ids separated by spaces (PAD,
                     BOS and SEP by name); for an encoder-decoder
                     "SOURCE | TARGET", the target optional (the model's
                     own greedy output).
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags

import mha_jax
from experiments import cli
from experiments import saved_patching
from mha_jax import pretrained
from mha_jax.measure import report as report_lib
from mha_jax.interp import explorer
from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import saved_run
from mha_jax.training import train_state

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "A run of experiments.train, or one seed's folder of an "
    "experiment (runs/induction/L2_seed0): its config.json and checkpoints/.")
_PRETRAINED = flags.DEFINE_string(
    "pretrained", None, "A Hugging Face checkpoint directory (config.json, "
    "safetensors, tokenizer.json) instead of --workdir; --text is then "
    "plain text.")
_TEXT = flags.DEFINE_string(
    "text", None, "Token ids separated by spaces (an encoder-decoder: "
    "'SOURCE | TARGET', the target optional); with --pretrained, text.")
_BATCH_FROM_TASK = flags.DEFINE_bool(
    "batch_from_task", False, "Use held-out examples of the run's task "
    "instead of --text.")
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples", 0, "With --batch_from_task: examples to score the heads "
    "on; 0: the experiment's analysis_examples (else the task's batch "
    "size).")
_EXAMPLE = flags.DEFINE_integer(
    "example", 0, "With --batch_from_task: which example the patterns show.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step; default: the "
                             "latest.")
_OUTPUT = flags.DEFINE_string("output", None, "Page to write; default: "
                              "WORKDIR/explorer.html.")
_ABLATE = flags.DEFINE_bool("ablate", True, "Ablate every head alone for "
                            "the table's ablation column.")
flags.mark_flags_as_mutual_exclusive(["workdir", "pretrained"],
                                     required=True)


def _default_examples(config) -> int:
  e = config.get("experiment")
  return (e.get("analysis_examples") if e else None) or config.task.batch_size


def run(workdir, *, text: str | None = None, batch_from_task: bool = False,
        num_examples: int = 0, example: int = 0, step: int | None = None,
        output=None, ablate: bool = True, raw_arrays: bool = True) -> dict:
  """Write the explorer page of the run in `workdir`.

  Returns {"path": the page, "data": `explorer.explore`'s data, "batch":
  the batch it measured, "step": the checkpoint's step}. Raises
  FileNotFoundError for a workdir without a run or checkpoint, ValueError
  for a bad input choice or text.
  """
  if (text is None) == (not batch_from_task):
    raise ValueError("give exactly one input: --text=... or "
                     "--batch_from_task")
  workdir = saved_run.check_run(workdir)
  state, config = saved_run.load_state(workdir, step)
  model = state.model()
  task = tasks.get_task(config.task.name)
  if batch_from_task:
    n = num_examples or _default_examples(config)
    seed = held_out.ANALYSIS_SEED + config.train.seed
    batch = held_out.analysis_batch(config, n, seed=seed)
    source = f"held-out batch of the task: {n} examples, seed {seed}"
  else:
    if example:
      raise ValueError(f"--example={example}: --text is one sequence, "
                       "example 0")
    batch = explorer.text_batch(model, config, text)
    source = "--text (one sequence)"
  c = model.config
  info = [("run", str(workdir)), ("checkpoint step", int(state.step)),
          ("task", config.task.name),
          ("model", f"{type(model).__name__}: {c.num_layers} layers x "
                    f"{c.num_heads} heads, d_model {c.d_model}, "
                    f"{c.positions} positions"),
          ("input", source)]
  init_model = train_state.create_train_state(config).model()
  data = explorer.explore(
      model, batch, loss=task.loss if ablate else None,
      init_model=init_model, example=example,
      specials=task.special_tokens)
  circuits = saved_patching.beside(workdir, c.num_layers, c.num_heads)
  path = pathlib.Path(output or workdir / "explorer.html")
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(explorer.render(
      data, title=f"Attention explorer: {workdir.name}", info=info,
      circuits=circuits, raw_arrays=raw_arrays))
  print(f"Wrote {path}: open it in a browser")
  return {"path": path, "data": data, "batch": batch,
          "step": int(state.step)}


def run_pretrained(directory, text: str, *, output=None,
                   ablate: bool = True, raw_arrays: bool = True) -> dict:
  """Write the explorer page of a Hugging Face checkpoint on `text`.

  The text goes through the checkpoint's tokenizer.json; the labels are
  its tokens. A decoder's table gets each head's ablation effect on the
  next-token loss of the text; an encoder (BERT) has no such loss. Returns
  {"path", "data", "batch"}; raises PretrainedError (a ValueError) for a
  bad directory.
  """
  directory = pathlib.Path(directory)
  model = mha_jax.load_pretrained(directory)
  tok = mha_jax.load_tokenizer(directory)
  c = model.config
  ids, _ = pretrained.encode(tok, text, max_len=c.max_len)
  decoder = isinstance(model, mha_jax.DecoderLM)
  batch = (explorer.decoder_text_batch(ids[0], "text", c.vocab_size)
           if decoder else {"inputs": ids})
  info = [("checkpoint", str(directory)),
          ("model", f"{type(model).__name__}: {c.num_layers} layers x "
                    f"{c.num_heads} heads, d_model {c.d_model}"),
          ("input", f"--text ({ids.shape[1]} tokens)")]
  data = explorer.explore(
      model, batch, loss="xent" if (ablate and decoder) else None,
      labels={"inputs": pretrained.labels(tok, ids[0])}, specials=False)
  path = pathlib.Path(output or "explorer.html")
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(explorer.render(
      data, title=f"Attention explorer: {directory.name}", info=info,
      circuits=None, raw_arrays=raw_arrays))
  print(f"Wrote {path}: open it in a browser")
  return {"path": path, "data": data, "batch": batch}


def main(argv):
  report_lib.check_no_arguments(argv)
  try:
    if _PRETRAINED.value:
      if _TEXT.value is None:
        raise ValueError("--pretrained needs --text (plain text)")
      run_pretrained(_PRETRAINED.value, _TEXT.value, output=_OUTPUT.value,
                     ablate=_ABLATE.value)
      return
    run(_WORKDIR.value, text=_TEXT.value,
        batch_from_task=_BATCH_FROM_TASK.value,
        num_examples=_NUM_EXAMPLES.value, example=_EXAMPLE.value,
        step=_STEP.value, output=_OUTPUT.value, ablate=_ABLATE.value)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from e


if __name__ == "__main__":
  cli.run_app(main)
