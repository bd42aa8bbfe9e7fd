r"""Generate from a trained run's latest checkpoint and check the answers.

  python -m experiments.train --config=configs/copy.py --workdir=runs/copy
  python -m experiments.generate --workdir=runs/copy

Shape letters: B examples, P padded prompt length, N generated tokens.

Prompts come from the run's own task (copy or induction), drawn with a key
the training loop never uses. Each example is cut where its scored span
begins: the model reads everything up to and including the token before the
first scored target (copy: `x_1..x_n SEP`; induction: the sequence up to
the first token of the repeated segment) and must continue with the scored
targets. Prompts and continuations have unequal lengths, so they run as one
ragged batch through `DecoderLM.generate` (KV cache, `lax.scan` loop).
"""

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mha_jax import generate
from mha_jax import tasks
from mha_jax import train

SUPPORTED = ("copy", "induction")  # tasks whose scored targets are one span

def task_prompts(config, num_examples: int, seed: int):
  """Ragged prompts from the run's task.

  Returns a dict: "prompt" `[B, P]` (right padded with PAD), "lengths"
  `[B]`, "expected" `[B, N]` (the scored targets, PAD after each row's
  own count) and "counts" `[B]`.
  """
  name = config.task.name
  if name not in SUPPORTED:
    raise ValueError(f"task_prompts: the run's task {name!r} has no "
                     f"continuation to check; expected one of {SUPPORTED}")
  c = ml_collections.ConfigDict(config.to_dict())
  c.task.batch_size = num_examples
  # Jitted: the task's vmapped sampler is slow op by op.
  batch = jax.device_get(train.batch_fn(c)(jax.random.PRNGKey(seed)))
  scored = batch["loss_mask"] > 0  # [B, T]
  first = scored.argmax(axis=1)  # the first scored target's position
  counts = scored.sum(axis=1)
  pos = np.arange(scored.shape[1])[None, :]
  span = (pos >= first[:, None]) & (pos < (first + counts)[:, None])
  if not (scored == span).all() or (counts < 1).any():
    raise ValueError(f"task_prompts: task {name!r} does not score one "
                     "contiguous span per example")
  # inputs[t] is the token before targets[t], so the prompt ends at
  # inputs[first] and the continuation is targets[first : first + count].
  lengths = first + 1
  p, n = int(lengths.max()), int(counts.max())
  prompt = np.where(pos[:, :p] < lengths[:, None], batch["inputs"][:, :p],
                    tasks.PAD)
  rows = np.arange(num_examples)[:, None]
  idx = np.minimum(first[:, None] + np.arange(n)[None, :],
                   scored.shape[1] - 1)
  expected = np.where(np.arange(n)[None, :] < counts[:, None],
                      batch["targets"][rows, idx], tasks.PAD)
  return {"prompt": prompt, "lengths": lengths, "expected": expected,
          "counts": counts, "inputs": batch["inputs"], "scored": scored,
          "targets": batch["targets"]}


def evaluate_generation(model, config, *, num_examples=256, seed=12345,
                        temperature=0.0, rng=None):
  """Generate every continuation in one ragged batch and score it.

  Returns a dict with "token_accuracy" (over all scored tokens),
  "sequence_accuracy" (whole continuation right), the prompts and outputs,
  and "teacher_forced_accuracy": the argmax of one full forward over the
  true sequences at the same scored tokens. Free-running generation feeds
  back its own tokens, so one mistake can derail the rest of a row; the gap
  between the two accuracies measures that compounding.
  """
  ex = task_prompts(config, num_examples, seed)
  tokens = np.asarray(generate.generate(
      model, jnp.asarray(ex["prompt"]), int(ex["counts"].max()),
      prompt_lengths=jnp.asarray(ex["lengths"]),
      new_tokens=jnp.asarray(ex["counts"]), temperature=temperature,
      rng=rng))
  valid = np.arange(tokens.shape[1])[None, :] < ex["counts"][:, None]
  hit = (tokens == ex["expected"]) & valid
  logits = jax.jit(lambda g, s, x: nnx.merge(g, s)(x))(
      *nnx.split(model), jnp.asarray(ex["inputs"]))
  forced = (np.asarray(jnp.argmax(logits, -1)) == ex["targets"])[ex["scored"]]
  return dict(ex, tokens=tokens,
              token_accuracy=float(hit.sum() / valid.sum()),
              sequence_accuracy=float((hit == valid).all(axis=1).mean()),
              teacher_forced_accuracy=float(forced.mean()))


def _fmt(tokens):
  return " ".join(str(int(t)) for t in tokens)


def _define_flags():
  """Flags are defined only when run as a script, so other experiments can
  import this module without clashing flags."""
  # pylint: disable=global-statement
  global _WORKDIR, _EXAMPLES, _SHOW, _SEED, _TEMPERATURE
  _WORKDIR = flags.DEFINE_string("workdir", None, "A run of experiments.train.")
  _EXAMPLES = flags.DEFINE_integer("num_examples", 256, "Prompts to generate "
                                   "from (one batch).")
  _SHOW = flags.DEFINE_integer("show", 4, "Examples to print.")
  _SEED = flags.DEFINE_integer("seed", 12345, "Seed of the prompt batch.")
  _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0: greedy.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  state, config = train.load_state(_WORKDIR.value)
  model = state.model()
  rng = (jax.random.PRNGKey(_SEED.value) if _TEMPERATURE.value > 0
         else None)
  res = evaluate_generation(model, config, num_examples=_EXAMPLES.value,
                            seed=_SEED.value, temperature=_TEMPERATURE.value,
                            rng=rng)
  m = config.model
  print(f"Run {_WORKDIR.value}: task {config.task.name}, {m.num_heads} "
        f"heads, {m.num_kv_heads or m.num_heads} kv heads, {m.positions} "
        f"positions, checkpoint at step {int(state.step)}")
  for b in range(min(_SHOW.value, len(res["lengths"]))):
    n = res["counts"][b]
    got, want = res["tokens"][b, :n], res["expected"][b, :n]
    print(f"\nprompt       ({res['lengths'][b]} tokens): "
          f"{_fmt(res['prompt'][b, :res['lengths'][b]])}")
    print(f"continuation ({n} tokens): {_fmt(got)}")
    print(f"expected:                 {_fmt(want)}  "
          f"{'correct' if (got == want).all() else 'WRONG'}")
  print(f"\n{len(res['lengths'])} prompts, greedy={_TEMPERATURE.value == 0}:"
        f" token accuracy {res['token_accuracy']:.4f}, whole continuation "
        f"correct {res['sequence_accuracy']:.4f} (teacher-forced token "
        f"accuracy on the same sequences {res['teacher_forced_accuracy']:.4f})"
        )


if __name__ == "__main__":
  _define_flags()
  app.run(main)
