"""What a model accepts at its entry, checked so it cannot go silently wrong.

A token id outside `[0, V)` would not fail on its own: `nnx.Embed` gathers
with JAX's out-of-bounds rule, so id V or more gives NaN embeddings (and
NaN logits at every later position), and id -1 counts from the end and
quietly reads the last token's row. Text or a 1-D array would end in an
unpacking error far from the call. `check` refuses each of these by name,
at the model's entry:

  * text (a str, bytes or a list of str): a TypeError that says to
    tokenize first (`mha_jax.pretrained.encode(tokenizer, text)`);
  * the wrong rank: tokens are `[B, T]` (one sequence is `tokens[None]`),
    features `[B, T, F]`;
  * a non-integer token array;
  * an id outside the vocabulary, with its value and position (b, t).

The id check runs where the values are. On concrete arrays (an eager
call) it is a NumPy check before anything is computed. Under `jax.jit`,
`vmap` or `grad` the values exist only when the program runs, so the
program carries the check: one reduction over the ids and a
`jax.debug.callback`, inside a `lax.cond` that takes it only when an id
is out of range, raising the same message (it surfaces as a
`JaxRuntimeError` whose text ends with that message). A valid call pays
one reduction over the [B, T] ids; its cost next to a forward is in
docs/performance.md ("Checking token ids"). Under `vmap` with batched ids
the cond becomes a select, so the host is called once per mapped element
and reads a flag (a cost only there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _message(fn: str, name: str, vocab_size: int, value: int,
             where) -> str:
  return (f"{fn}: `{name}` holds token id {value} at position "
          f"{tuple(int(i) for i in where)}, outside the vocabulary "
          f"[0, {vocab_size}) (an id >= V gives NaN logits, a negative id "
          "reads a row counted from the end)")


def _raise_outside(any_bad, where, value, *, fn, name, vocab_size):
  """The host side of the traced check. `lax.cond` calls it only when an
  id is out of range, except under `vmap` with batched ids, where the
  cond becomes a select that runs both branches: hence the flag, read
  here (and once per mapped element)."""
  if bool(any_bad):
    raise ValueError(_message(fn, name, vocab_size, int(value), where))


def _check_ids(ids, vocab_size: int, *, fn: str, name: str) -> None:
  """Every id of `ids [B, T]` in `[0, vocab_size)`, eager or traced."""
  if not isinstance(ids, jax.core.Tracer):
    host = np.asarray(ids)
    bad = (host < 0) | (host >= vocab_size)
    if bad.any():
      where = np.unravel_index(int(np.argmax(bad)), host.shape)
      raise ValueError(_message(fn, name, vocab_size, int(host[where]),
                                where))
    return
  bad = (ids < 0) | (ids >= vocab_size)
  first = jnp.argmax(bad.ravel())
  where = jnp.stack(jnp.unravel_index(first, ids.shape))

  def report(any_bad, where, value):
    jax.debug.callback(
        lambda a, w, v: _raise_outside(a, w, v, fn=fn, name=name,
                                       vocab_size=vocab_size),
        any_bad, where, value)

  # The host is called only when an id is out of range: a callback on
  # every call cost a 2 ms forward 0.3 ms (docs/performance.md).
  any_bad = bad.any()
  jax.lax.cond(any_bad, report, lambda *_: None, any_bad, where,
               ids.ravel()[first])


def _is_text(x) -> bool:
  return isinstance(x, (str, bytes)) or (
      isinstance(x, (list, tuple)) and bool(x)
      and all(isinstance(s, (str, bytes)) for s in x))


def check(inputs, config, *, fn: str, name: str = "inputs",
          check_ids: bool = True) -> jax.Array:
  """`inputs` as an array, after the checks above.

  Args:
    inputs: token ids `[B, T]`, or features `[B, T, F]` when
      `config.input_dim = F > 0`.
    config: the model's `ModelConfig` (`vocab_size`, `input_dim`).
    fn, name: the caller and argument, for the messages.
    check_ids: also check the ids' range (the static checks alone when
      the caller has checked them already).
  Returns:
    `jnp.asarray(inputs)`.
  """
  if _is_text(inputs):
    raise TypeError(
        f"{fn}: `{name}` must be token ids [B, T], got text "
        f"{inputs!r:.60}; tokenize it first (a language model from "
        "`load_language_model`: `lm.to_tokens(text)`; an encoder: "
        "`ids, mask = mha_jax.pretrained.encode(tokenizer, text)`)")
  arr = jnp.asarray(inputs)
  if config.input_dim > 0:
    if arr.ndim != 3 or not jnp.issubdtype(arr.dtype, jnp.floating):
      raise ValueError(f"{fn}: `{name}` must be float features [B, T, "
                       f"{config.input_dim}], got {arr.dtype} of shape "
                       f"{arr.shape}")
    return arr
  if arr.ndim != 2:
    one = (" (one sequence of T tokens is `tokens[None]`)"
           if arr.ndim == 1 else "")
    raise ValueError(f"{fn}: `{name}` must be integer token ids [B, T], "
                     f"got shape {arr.shape}{one}")
  if not jnp.issubdtype(arr.dtype, jnp.integer):
    raise TypeError(f"{fn}: `{name}` must be integer token ids [B, T], "
                    f"got dtype {arr.dtype}")
  if check_ids:
    _check_ids(arr, config.vocab_size, fn=fn, name=name)
  return arr
