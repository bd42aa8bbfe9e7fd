"""The parameter counts docs/architecture.md states are the code's, and the
score rules travel through the models as one object.

The counts are read from the page's table ("**Measured** (parameters,
`self` not counted ..."): every row whose first cell names a function and
whose "after" cell starts with a number is checked, so a signature that
grows or shrinks fails here until the page says so.
"""

import dataclasses
import functools
import importlib
import inspect
import pathlib
import pkgutil
import re

import pytest

from mha_jax.core import score_rules
from mha_jax.models import blocks
from mha_jax.models import modules
from mha_jax.models import transformer

_PAGE = pathlib.Path(__file__).parents[2] / "docs" / "architecture.md"
_TABLE_START = "**Measured** (parameters, `self` not counted"
# Where a dotted name of the table may live: a module under one of these
# (`multi_head.attention_layer`, `kernels.auto.select`) or a class defined
# in one of their modules (`TransformerBlock.__call__`).
_PACKAGES = ("mha_jax.core", "mha_jax.models")


def documented_counts(text: str) -> dict[str, int]:
  """`{dotted name: parameter count}` from the measured table of `text`
  (the architecture page): its "after" column's leading number."""
  start = text.index(_TABLE_START)
  lines = text[start:].splitlines()[1:]
  rows = {}
  in_table = False
  for line in lines:
    if not line.startswith("|"):
      if in_table:
        break
      continue
    in_table = True
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    name = re.fullmatch(r"`([\w.]+)`", cells[0])
    count = re.match(r"(\d+)\b", cells[-1])
    if name and count:
      rows[name.group(1)] = int(count.group(1))
  return rows


@functools.cache
def _modules():
  found = []
  for pkg_name in _PACKAGES:
    pkg = importlib.import_module(pkg_name)
    for info in pkgutil.iter_modules(pkg.__path__):
      if not info.ispkg:
        found.append(importlib.import_module(f"{pkg_name}.{info.name}"))
  return found


def resolve(dotted: str):
  """The function a dotted name of the table means."""
  parts = dotted.split(".")
  for i in range(len(parts) - 1, 0, -1):
    for pkg in _PACKAGES:
      name = f"{pkg}.{'.'.join(parts[:i])}"
      try:
        obj = importlib.import_module(name)
      except ModuleNotFoundError as e:
        if e.name is not None and name.startswith(e.name):
          continue
        raise
      return functools.reduce(getattr, parts[i:], obj)
  owners = {getattr(m, parts[0]) for m in _modules()
            if inspect.isclass(getattr(m, parts[0], None))
            and getattr(m, parts[0]).__module__ == m.__name__}
  assert len(owners) == 1, f"{dotted}: defined in {len(owners)} modules"
  return functools.reduce(getattr, parts[1:], owners.pop())


def parameter_count(fn) -> int:
  """Parameters of `fn`, `self` not counted (as the page counts them)."""
  names = list(inspect.signature(fn).parameters)
  return len(names) - (names[:1] == ["self"])


def test_the_page_states_the_counts_of_the_rules_path():
  counts = documented_counts(_PAGE.read_text())
  assert {"MultiHeadAttention.__call__", "TransformerBlock.__call__",
          "multi_head.attention_layer"} <= set(counts), counts


@pytest.mark.parametrize("name", sorted(documented_counts(
    _PAGE.read_text())))
def test_documented_parameter_count_is_true(name):
  want = documented_counts(_PAGE.read_text())[name]
  got = parameter_count(resolve(name))
  assert got == want, (f"docs/architecture.md says {name} takes {want} "
                       f"parameters; it takes {got}")


def test_the_table_reader_reads_numbers_and_skips_words():
  text = "\n".join([
      _TABLE_START + ", ...):", "", "| | before | after |",
      "|---|---|---|", "| `a.f` | 9 | 3 (`x`, `y`, `z`) |",
      "| a new option | 4 files | 3 |", "", "| `b.g` | 1 | 2 |"])
  assert documented_counts(text) == {"a.f": 3}


@pytest.mark.parametrize("fn", [
    modules.MultiHeadAttention.__call__, blocks.TransformerBlock.__call__,
    transformer.DecoderLM.__call__])
def test_rules_and_dropout_pass_as_one_argument_each(fn):
  params = set(inspect.signature(fn).parameters)
  assert {"rules", "rngs"} <= params
  # No field of ScoreRules, nor the old spellings, beside `rules`.
  fields = {f.name for f in dataclasses.fields(score_rules.ScoreRules)}
  assert not params & (fields | {"segment_ids", "dropout_rng"}), params
