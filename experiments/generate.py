r"""Generate from a trained run's latest checkpoint and check the answers.

  python -m experiments.train --config=configs/copy.py --workdir=runs/copy
  python -m experiments.generate --workdir=runs/copy

Prompts come from the run's own task (copy or induction), drawn with a key
the training loop never uses, and each is cut where its scored span begins
(`mha_jax.measure.continuations`): the model must continue with the scored targets.
Prints a few examples and the accuracies of free-running (KV-cache)
generation and of teacher forcing on the same tokens.
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax

from experiments import cli
from mha_jax.measure import report as report_lib
from mha_jax.measure import continuations
from mha_jax.training import saved_run

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "A finished run of experiments.train (its config.json "
    "and checkpoints/).")
_EXAMPLES = flags.DEFINE_integer("num_examples", 256, "Prompts to generate "
                                 "from (one batch).")
_SHOW = flags.DEFINE_integer("show", 4, "Examples to print.")
_SEED = flags.DEFINE_integer("seed", 12345, "Seed of the prompt batch.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0: greedy.")
flags.mark_flags_as_required(["workdir"])


def _tokens(tokens) -> str:
  return " ".join(str(int(t)) for t in tokens)


def run(workdir, *, num_examples: int = 256, show: int = 4,
        seed: int = 12345, temperature: float = 0.0) -> dict:
  """Load the run in `workdir`, generate, print; returns the scores
  (`continuations.evaluate_generation`) and the checkpoint's "step"."""
  state, config = saved_run.load_state(workdir)
  rng = jax.random.PRNGKey(seed) if temperature > 0 else None
  res = continuations.evaluate_generation(
      state.model(), config, num_examples=num_examples, seed=seed,
      temperature=temperature, rng=rng)
  m = config.model
  print(f"Run {workdir}: task {config.task.name}, {m.num_heads} heads, "
        f"{m.num_kv_heads or m.num_heads} kv heads, {m.positions} positions, "
        f"checkpoint at step {int(state.step)}")
  for b in range(min(show, len(res["lengths"]))):
    n, p = res["counts"][b], res["lengths"][b]
    got, want = res["tokens"][b, :n], res["expected"][b, :n]
    print(f"\nprompt       ({p} tokens): {_tokens(res['prompt'][b, :p])}")
    print(f"continuation ({n} tokens): {_tokens(got)}")
    print(f"expected:                 {_tokens(want)}  "
          f"{'correct' if (got == want).all() else 'WRONG'}")
  print(f"\n{len(res['lengths'])} prompts, greedy={temperature == 0}: token "
        f"accuracy {res['token_accuracy']:.4f}, whole continuation correct "
        f"{res['sequence_accuracy']:.4f} (teacher-forced token accuracy on "
        f"the same sequences {res['teacher_forced_accuracy']:.4f})")
  return dict(res, step=int(state.step))


def main(argv):
  report_lib.check_no_arguments(argv)
  try:
    run(_WORKDIR.value, num_examples=_EXAMPLES.value, show=_SHOW.value,
        seed=_SEED.value, temperature=_TEMPERATURE.value)
  except FileNotFoundError as e:  # a workdir that holds no run: say which
    raise app.UsageError(str(e)) from e


if __name__ == "__main__":
  cli.run_app(main)
