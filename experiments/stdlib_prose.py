"""English prose shipped with Python: the standard library's documents.

The documents are the topics of `pydoc_data.topics` (the language
reference's help pages: "if", "for", "exceptions", ...) and the docstrings
of the standard library's top-level modules (module, class and function
docstrings of one file, read with `ast` without importing it), one
document per topic or file. A document is split into paragraphs at blank
lines; paragraphs indented (grammar, code, examples) or made of
punctuation (underlines of headings) are dropped, since they are not
prose. A paragraph's lines are joined and cut into sentences after ".",
"!" or "?" followed by a space and a capital letter, and a sentence is
kept when it has `min_words` to `max_words` words, starts with a capital
letter and ends with a full stop. Nothing is downloaded.

Two experiments read it: `pretrained_heads` (BERT sentence pairs) and
`real_heads` (prose for the decoders).
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import sysconfig

from pydoc_data import topics

_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")
_CAPITAL = re.compile(r"^[A-Z]")


def _prose_paragraphs(text: str) -> list[str]:
  """The unindented prose paragraphs of one help page, lines joined."""
  out = []
  for para in re.split(r"\n\s*\n", text):
    lines = para.splitlines()
    if not lines or any(line.startswith((" ", "\t")) for line in lines):
      continue
    joined = " ".join(line.strip() for line in lines)
    if re.search(r"[A-Za-z]", joined) and not re.fullmatch(r"[*=\-~^ ]+",
                                                           joined):
      out.append(joined)
  return out


def sentences(text: str, *, min_words: int = 5, max_words: int = 40
              ) -> list[list[str]]:
  """The kept sentences of one document, grouped by paragraph."""
  out = []
  for para in _prose_paragraphs(text):
    kept = [s for s in _END.split(para)
            if min_words <= len(s.split()) <= max_words
            and _CAPITAL.match(s) and s.endswith(".")]
    if kept:
      out.append(kept)
  return out


def _docstrings(path: pathlib.Path) -> str:
  """A module file's docstrings (module, classes, functions), cleaned and
  separated by blank lines; "" when the file does not parse."""
  try:
    tree = ast.parse(path.read_text(encoding="utf-8"))
  except (SyntaxError, UnicodeDecodeError, ValueError):
    return ""
  nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
      n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
  docs = (ast.get_docstring(n, clean=False) for n in nodes)
  return "\n\n".join(inspect.cleandoc(d) for d in docs if d)


def texts(*, modules: bool = True) -> dict[str, str]:
  """name -> raw text: every pydoc topic ("topic:if") and, with `modules`,
  the docstrings of each top-level stdlib module ("module:json")."""
  out = {f"topic:{k}": v for k, v in sorted(topics.topics.items())}
  if modules:
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
      out[f"module:{path.stem}"] = _docstrings(path)
  return out


def documents(*, modules: bool = True, min_words: int = 5,
              max_words: int = 40) -> dict[str, list[list[str]]]:
  """document name -> its paragraphs' sentences (documents without a kept
  sentence dropped)."""
  docs = {name: sentences(text, min_words=min_words, max_words=max_words)
          for name, text in texts(modules=modules).items()}
  return {k: v for k, v in docs.items() if v}
