"""The indirect-object prompts: names, templates, the ABBA and BABA
orders and the ABC corruption, as token ids with each name's position.

Shape letters: N prompts, T tokens (the longest prompt; shorter ones are
right-padded, which a causal model never reads from an earlier
position, so every score is taken at a prompt's own END).

A template (Wang et al. 2022's style, our own sentences) holds three name
slots and ends where the indirect object (IO) is the natural next word:

  "When {A} and {B} went to the store, {C} gave a bottle of milk to"

ABBA fills A = IO, B = S, C = S ("When Mary and John ..., John gave ...
to" -> " Mary"); BABA fills A = S, B = IO, C = S. The roles' positions:
S1 (the subject's first mention), IO, S2 (its second) and END (the last
token, where the name is predicted). The ABC corruption of a prompt keeps
the template and the positions and puts three names in the slots that are
distinct from each other and from the clean prompt's IO and S: no name is
repeated, so nothing marks a subject, and neither of the clean names the
metric reads is in the prompt.
"""

from __future__ import annotations

import numpy as np

# Common first names; each model keeps those its tokenizer writes as ONE
# token after a space (`single_token_names`).
CANDIDATE_NAMES = (
    "Mary", "John", "Tom", "James", "Sarah", "Alice", "Bob", "Paul", "Lisa",
    "Anna", "Kate", "Mark", "David", "Peter", "Emma", "Jack", "Michael",
    "Laura", "Rachel", "Daniel", "Sam", "Max", "Ben", "Jane", "Adam", "Eric",
    "Steve", "Amy", "Chris", "Ryan", "Luke", "George", "Henry", "Grace",
    "Ruth", "Helen", "Robert", "William", "Richard", "Thomas", "Charles",
    "Joseph", "Susan", "Karen", "Nancy", "Linda", "Emily", "Jessica",
    "Kevin", "Brian", "Jason", "Matthew", "Andrew", "Joshua", "Anthony",
    "Edward", "Martin", "Simon", "Victoria", "Julia")

# Our own sentences in the form of Wang et al.'s templates: two names, a
# clause, the subject again, an act of giving or saying, and "to"/"for".
TEMPLATES = (
    "When {A} and {B} went to the store, {C} gave a bottle of milk to",
    "Then, {A} and {B} had a long argument. Afterwards {C} said to",
    "After {A} and {B} went to the park, {C} handed a ball to",
    "While {A} and {B} were cooking dinner, {C} passed the salt to",
    "When {A} and {B} arrived at the office, {C} sent an email to",
    "Then, {A} and {B} went to the beach. {C} threw a towel to",
    "After the meeting, {A} and {B} stayed late, and {C} wrote a note to",
    "When {A} and {B} found a lost dog, {C} gave the dog to",
)
ORDERS = ("ABBA", "BABA")


def single_token_names(tokenizer, names=CANDIDATE_NAMES, *,
                       prefix: str = "Then") -> dict:
  """`{name: id}` for the names that `tokenizer` writes as one token
  after a space: encoding `prefix + " " + name` adds exactly one id to
  encoding `prefix` (and leaves the prefix's ids as they were), and that
  id decodes to the name (not to an unknown-token id). A tokenizer that
  adds BOS adds it to both."""
  base = tokenizer.encode(prefix).ids
  out = {}
  for name in names:
    ids = tokenizer.encode(f"{prefix} {name}").ids
    if (len(ids) == len(base) + 1 and ids[:len(base)] == base
        and tokenizer.decode([ids[-1]]).strip() == name):
      out[name] = ids[-1]
  return out


def _fill(template: str, a: str, b: str, c: str) -> str:
  return template.format(A=a, B=b, C=c)


def _positions(ids, name_ids, slots):
  """The position of each slot's name in `ids`: the k-th occurrence of a
  name token, in slot order (A before B before C in every template)."""
  hits = [t for t, i in enumerate(ids) if i in name_ids]
  if len(hits) != 3:
    raise ValueError(f"prompts: expected 3 name tokens in a prompt, found "
                     f"{len(hits)} (ids {list(ids)}): a name is not one "
                     "token in this context")
  return dict(zip(slots, hits))


def build(tokenizer, names: dict, *, per_template_order: int, seed: int,
          prefix: str = "", templates=TEMPLATES) -> dict:
  """`per_template_order` prompts for every template and order, and their
  ABC corruptions.

  Args:
    tokenizer: a `tokenizers.Tokenizer`.
    names: `{name: token id}` (`single_token_names`), at least 5.
    prefix: text before each prompt (SmolLM2's "<|endoftext|>", which it
      saw at the start of documents; "" where the tokenizer adds a BOS).

  Returns `{"tokens", "corrupted"}` `[N, T]` int32 (right-padded with the
  last token of each prompt, never read), `"end", "io_pos", "s1_pos",
  "s2_pos", "io", "s", "template", "order"` `[N]` int32 (order 0 ABBA, 1
  BABA), and `"names"`, `"texts"` (the clean prompts).
  """
  if len(names) < 5:
    raise ValueError(f"prompts.build: `names` must hold at least 5 "
                     f"single-token names (IO, S and three ABC names), got "
                     f"{len(names)}")
  rng = np.random.default_rng(seed)
  pool = sorted(names)
  ids = set(names.values())
  rows, texts = [], []
  for ti, template in enumerate(templates):
    for oi, order in enumerate(ORDERS):
      for _ in range(per_template_order):
        io, s, x, y, z = rng.choice(pool, size=5, replace=False)
        a, b = (io, s) if order == "ABBA" else (s, io)
        clean = tokenizer.encode(prefix + _fill(template, a, b, s)).ids
        abc = tokenizer.encode(prefix + _fill(template, x, y, z)).ids
        slots = ("A", "B", "C")
        pos = _positions(clean, ids, slots)
        if (len(abc) != len(clean)
            or _positions(abc, ids, slots) != pos):
          raise ValueError("prompts: the ABC prompt's names sit elsewhere "
                           f"than the clean prompt's ({template!r})")
        io_slot, s_slot = ("A", "B") if order == "ABBA" else ("B", "A")
        rows.append(dict(ids=clean, abc=abc, end=len(clean) - 1,
                         io_pos=pos[io_slot], s1_pos=pos[s_slot],
                         s2_pos=pos["C"], io=names[io], s=names[s],
                         template=ti, order=oi))
        texts.append(prefix + _fill(template, a, b, s))
  t = max(len(r["ids"]) for r in rows)
  pad = lambda x: list(x) + [x[-1]] * (t - len(x))
  out = {"tokens": np.asarray([pad(r["ids"]) for r in rows], np.int32),
         "corrupted": np.asarray([pad(r["abc"]) for r in rows], np.int32)}
  for k in ("end", "io_pos", "s1_pos", "s2_pos", "io", "s", "template",
            "order"):
    out[k] = np.asarray([r[k] for r in rows], np.int32)
  out["names"], out["texts"] = pool, texts
  return out


def subset(prompts: dict, index) -> dict:
  """The prompts at `index` (every per-prompt array sliced alike)."""
  index = np.asarray(index)
  return {k: (v[index] if isinstance(v, np.ndarray) else v)
          for k, v in prompts.items() if k != "texts"} | {
              "texts": [prompts["texts"][i] for i in index]}
