"""The docs' commands and links point at things that exist.

A fenced shell block right after a `<!-- runnable -->` line is a promise
that it runs as written from the repository root. Running them all would
take an hour, so this checks what breaks silently when code moves: every
`python -m` module exists, every `--flag` is defined by that entry point
(or is a field of its config, for `--config.a.b=...`), every `make`
target is in the Makefile, every `pytest` path exists and every
`python -c` program compiles. Parsing is static (no experiment module is
imported), so this costs well under a second. Python blocks marked
runnable are executed (they use tiny shapes). Relative links (files and
`#anchors`) in README.md and docs/ must resolve. That the README's
numbers are the committed results' is tests/measure/test_readme_claims.py.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import shlex

import ml_collections
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
# Committed experiment outputs (`make results`): report.md beside
# results.json and the figures, one folder per experiment.
RESULTS = ROOT / "docs" / "results"
MARK = "<!-- runnable -->"
# Flags every absl program accepts.
ABSL_FLAGS = {"help", "helpfull", "helpshort", "logtostderr",
              "alsologtostderr", "verbosity", "v", "log_dir"}


def runnable_blocks():
  """`(page, line, language, text)` of every block marked runnable."""
  blocks = []
  for page in PAGES:
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
      if line.strip() != MARK:
        continue
      fence = lines[i + 1].strip()
      assert fence in ("```bash", "```python"), (
          f"{page.name}:{i + 1}: {MARK} must precede a ```bash or ```python "
          f"block, found {fence!r}")
      end = next(j for j in range(i + 2, len(lines))
                 if lines[j].strip() == "```")
      blocks.append((page.name, i + 1, fence[3:],
                     "\n".join(lines[i + 2:end])))
  return blocks


def shell_commands(block: str) -> list[list[str]]:
  """The block as commands (token lists): continuations joined, comments
  dropped, `;`/`&&`/`&` split, leading `VAR=value` assignments removed."""
  text = block.replace("\\\n", " ")
  commands = []
  for line in text.splitlines():
    tokens = shlex.split(line, comments=True)
    current = []
    for token in tokens + [";"]:
      if token in (";", "&&", "&", "||"):
        while current and re.fullmatch(r"[A-Za-z_]+=.*", current[0]):
          current.pop(0)
        if current:
          commands.append(current)
        current = []
      else:
        current.append(token)
  return commands


def _module_file(module: str) -> pathlib.Path:
  """The file `python -m module` (or `import module`) runs."""
  path = ROOT / module.replace(".", "/")
  if (path / "__main__.py").exists():
    return path / "__main__.py"
  return path.with_suffix(".py") if not path.is_dir() else path / "__init__.py"


def _defined_flags(path: pathlib.Path, seen=None) -> set[str]:
  """Names passed to `flags.DEFINE_*`/`config_flags.DEFINE_*` in `path`
  and in the project modules it imports."""
  seen = set() if seen is None else seen
  if path in seen or not path.exists():
    return set()
  seen.add(path)
  tree = ast.parse(path.read_text())
  names = set()
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("DEFINE_") and node.args
        and isinstance(node.args[0], ast.Constant)):
      names.add(node.args[0].value)
    if isinstance(node, ast.ImportFrom) and node.module in ("experiments",):
      for alias in node.names:
        names |= _defined_flags(_module_file(f"experiments.{alias.name}"),
                                seen)
    elif isinstance(node, ast.ImportFrom) and node.module and (
        node.module.startswith("experiments.")):
      names |= _defined_flags(_module_file(node.module), seen)
  return names


def _default_config(path: pathlib.Path) -> str | None:
  """The default of `DEFINE_config_file("config", default)` in `path`, or
  of `cli.experiment_flags(config=default, ...)`."""
  for node in ast.walk(ast.parse(path.read_text())):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == "config_flag" and node.args
        and isinstance(node.args[0], ast.Constant)):
      return node.args[0].value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == "experiment_flags"):
      for k in node.keywords:
        if k.arg == "config" and isinstance(k.value, ast.Constant):
          return k.value.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == "DEFINE_config_file" and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "config"):
      default = node.args[1] if len(node.args) > 1 else next(
          (k.value for k in node.keywords if k.arg == "default"), None)
      if isinstance(default, ast.Constant):
        return default.value
  return None


def _load_config(spec: str) -> ml_collections.ConfigDict:
  """`configs/x.py[:arg]` -> its ConfigDict (configs import no JAX)."""
  path, _, arg = spec.partition(":")
  assert (ROOT / path).exists(), f"no config file {path}"
  module = importlib.import_module(
      path.removesuffix(".py").replace("/", "."))
  return module.get_config(arg) if arg else module.get_config()


def _check_python(args: list[str]) -> None:
  if args[:1] == ["-c"]:
    compile(args[1], "<docs>", "exec")
    return
  assert args[:1] == ["-m"], f"expected `python -m MODULE`, got {args}"
  module, flags = args[1], args[2:]
  if module == "pytest":
    _check_pytest(flags)
    return
  path = _module_file(module)
  assert path.exists(), f"module {module} not found ({path.name})"
  defined = _defined_flags(path) | ABSL_FLAGS
  given = dict(f[2:].partition("=")[::2] for f in flags
               if f.startswith("--"))
  assert all(f.startswith("--") for f in flags), (
      f"{module}: positional arguments {flags}")
  config_spec = given.get("config") or _default_config(path)
  if "config" in given:
    _load_config(given["config"])  # the file exists, its argument is known
  for name in given:
    if name.startswith("config."):
      assert config_spec, f"{module} takes no --config, got --{name}"
      config = _load_config(config_spec)
      *groups, field = name.split(".")[1:]
      for group in groups:
        config = config[group]
      assert field in config, f"{module}: --{name}: no field {field!r}"
    else:
      flag = name.removeprefix("no")
      assert name in defined or flag in defined, (
          f"{module}: no flag --{name} (defined: {sorted(defined)})")


def _check_pytest(args):
  for arg in args:
    if not arg.startswith("-"):
      assert (ROOT / arg.split("::")[0]).exists(), f"no test path {arg}"


def _check_make(args):
  targets = set(re.findall(r"^([A-Za-z_][\w-]*):",
                           (ROOT / "Makefile").read_text(), re.M))
  for target in args:
    assert target in targets, f"no make target {target!r}"


def _check(command):
  program, args = command[0], command[1:]
  if program in ("python", "python3"):
    raise AssertionError(
        "a bare `python` may lack the project's packages on a fresh "
        "machine: write `.venv/bin/python` (the venv `make test` makes), "
        "as the README's set-up says")
  if re.search(r"(^|/)python3?$", program):
    _check_python(args)
  elif program == "make":
    _check_make(args)
  elif program == "pytest":
    _check_pytest(args)
  elif program == "git":
    pass  # setting up a second checkout to compare with; nothing of ours
  else:
    raise AssertionError(f"unknown program {program!r} in a runnable block")


BLOCKS = runnable_blocks()
SHELL = [(p, l, b) for p, l, lang, b in BLOCKS if lang == "bash"]
PYTHON = [(p, l, b) for p, l, lang, b in BLOCKS if lang == "python"]


def test_the_front_page_and_docs_mark_their_code():
  assert "README.md" in {page for page, _, _ in SHELL}
  assert "README.md" in {page for page, _, _ in PYTHON}
  assert len(SHELL) >= 8, SHELL


@pytest.mark.parametrize("page,line,block", PYTHON,
                         ids=[f"{p}:{l}" for p, l, _ in PYTHON])
def test_python_examples_run_as_written(page, line, block):
  """The examples are executed: an API change that breaks one fails here."""
  exec(compile(block, f"{page}:{line}", "exec"), {"__name__": "docs"})  # pylint: disable=exec-used


@pytest.mark.parametrize("page,line,block", SHELL,
                         ids=[f"{p}:{l}" for p, l, _ in SHELL])
def test_runnable_commands_name_what_exists(page, line, block):
  commands = shell_commands(block)
  assert commands, f"{page}:{line}: empty runnable block"
  for command in commands:
    try:
      _check(command)
    except AssertionError as e:
      raise AssertionError(f"{page}:{line}: {shlex.join(command)}: {e}") \
          from None


def test_the_checker_catches_what_it_should():
  """Each kind of stale command is reported (a checker that passes
  everything would let the docs rot)."""
  bad = [".venv/bin/python -m experiments.no_such_module",
         ".venv/bin/python -m experiments.induction --no_such_flag=1",
         ".venv/bin/python -m experiments.train --config=configs/copy.py "
         "--config.model.no_such_field=1",
         "make no_such_target",
         ".venv/bin/python -m pytest tests/no_such_file.py",
         ".venv/bin/python -c 'print('",
         "python -m experiments.train --config=configs/copy.py"]
  for text in bad:
    with pytest.raises((AssertionError, SyntaxError)):
      for command in shell_commands(text):
        _check(command)
  good = ("A=1 .venv/bin/python -m experiments.train --config=configs/copy.py "
          "--workdir=w --config.model.num_heads=8 && make test")
  for command in shell_commands(good):
    _check(command)


def _slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
  return {_slug(m) for m in re.findall(r"^#+ (.*)$", text, re.M)}


def test_relative_links_resolve():
  broken = []
  for page in PAGES + sorted(RESULTS.glob("*/report.md")):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+:", target):
        continue  # http(s):, mailto:
      path, _, anchor = target.partition("#")
      resolved = (page.parent / path).resolve() if path else page
      if not resolved.exists():
        broken.append(f"{page.name}: {target}")
      elif anchor and resolved.suffix == ".md" and anchor not in _anchors(
          resolved):
        broken.append(f"{page.name}: {target} (no such heading)")
  assert not broken, broken


def test_front_page_stays_short():
  size = len((ROOT / "README.md").read_bytes())
  assert size <= 10_500, f"README.md is {size} bytes; depth goes in docs/"


def test_front_page_table_names_every_library_module():
  """The layer table is where a newcomer finds a file: a new module in
  mha_jax/ must appear there (inside a `mha_jax/{a,b}.py` group or alone)."""
  text = (ROOT / "README.md").read_text()
  named = set()
  for group in re.findall(r"`mha_jax/\{([^}]*)\}\.py`", text):
    named |= {m.strip() for m in group.split(",")}
  named |= set(re.findall(r"`mha_jax/(\w+)\.py`", text))
  modules = {p.stem for p in (ROOT / "mha_jax").glob("*.py")} - {"__init__"}
  assert modules <= named, sorted(modules - named)


def test_committed_results_are_complete():
  folders = sorted(p for p in RESULTS.iterdir() if p.is_dir())
  assert folders, "docs/results/ holds no experiment (run `make results`)"
  for folder in folders:
    assert (folder / "report.md").exists() and (
        folder / "results.json").exists(), folder.name
    report = (folder / "report.md").read_text()
    # Figures and the explorer page the report links sit beside it.
    for linked in re.findall(r"\]\(([\w.-]+\.(?:png|html))\)", report):
      assert (folder / linked).exists(), f"{folder.name}: {linked}"
