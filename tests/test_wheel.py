"""The built wheel works on its own: it holds every file the package reads
at run time, nothing else of the repository, and once installed (without
the source tree) it renders the explorer page and the notebook views.

An editable install reads the source tree, so a package-data entry that
names the wrong folder passes every other test while the wheel ships no
explorer page. This test builds the wheel from a copy of the working tree
(`pip wheel --no-deps --no-build-isolation`: offline, and no `build/` left
in the checkout), installs it with `--no-deps` into a fresh venv that sees
this venv's third-party packages through a `.pth` line, and renders pages
from there, in a folder outside the checkout.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mha_jax"
# The explorer's template, styles and script (mha_jax/interp/explorer_page.py
# reads them relative to its own file).
STATIC = PACKAGE / "interp" / "explorer_static"
# What the wheel-building copy leaves out: version control, environments,
# run outputs and build leftovers (a stale build/lib would leak into the
# wheel: setuptools copies it as it finds it).
_SKIP = shutil.ignore_patterns(".git", ".venv", "runs", "build", "dist",
                               "*.egg-info", "__pycache__", ".pytest_cache",
                               ".hypothesis", "*.pyc")


def _run(cmd, **kwargs) -> str:
  """`cmd`'s stdout; on failure its stderr, in the assertion message."""
  done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        **kwargs)
  # The inline script left out: its traceback names the failing line.
  shown = " ".join(str(c) for c in cmd if "\n" not in str(c))
  assert done.returncode == 0, (f"`{shown}` failed ({done.returncode}):\n"
                                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
  return done.stdout


def _runtime_files() -> list[str]:
  """Every file of the package that is not Python source: what the package
  reads at run time (today the explorer's page, styles and script),
  relative to the repository root."""
  return sorted(
      str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*")
      if p.is_file() and "__pycache__" not in p.parts
      and p.suffix not in (".py", ".pyc"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
  """The wheel `pip wheel .` builds from a copy of the working tree."""
  # Without build isolation the build imports this venv's setuptools
  # (Python 3.12's venvs no longer come with it).
  assert importlib.util.find_spec("setuptools"), (
      "building the wheel offline needs setuptools in this venv: "
      f"{sys.executable} -m pip install 'setuptools>=68'")
  tmp = tmp_path_factory.mktemp("wheel")
  source = tmp / "source"
  shutil.copytree(ROOT, source, ignore=_SKIP, symlinks=True)
  _run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
        "--no-build-isolation", "--no-index", "-q", "-w", str(tmp / "dist")])
  (found,) = (tmp / "dist").glob("mha_jax-*.whl")
  return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> pathlib.Path:
  """A fresh venv with the wheel installed (no dependencies); this venv's
  site-packages is appended to its path by a plain `.pth` line, so the
  third-party packages import but this venv's `.pth` files (the editable
  install's finder among them) are never run."""
  env_dir = tmp_path_factory.mktemp("venv") / "env"
  _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
  python = env_dir / "bin" / "python"
  purelib = _run([str(python), "-c",
                  "import sysconfig; print(sysconfig.get_path('purelib'))"])
  (pathlib.Path(purelib.strip()) / "project_venv.pth").write_text(
      sysconfig.get_path("purelib") + "\n")
  _run([sys.executable, "-m", "pip", "--python", str(python), "install",
        "--no-deps", "--no-index", "-q", str(wheel)])
  return env_dir


def test_wheel_holds_the_package_and_its_files_and_nothing_else(wheel):
  names = zipfile.ZipFile(wheel).namelist()
  tops = {n.split("/")[0] for n in names}
  assert tops == {"mha_jax", wheel.name.split("-py3")[0] + ".dist-info"}, (
      f"the wheel's top-level entries are {sorted(tops)}: tests/, "
      "experiments/, configs/ or scripts/ must stay out of it")
  sources = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                   if "__pycache__" not in p.parts)
  missing = sorted(set(sources) - set(names))
  assert not missing, f"Python files missing from the wheel: {missing}"
  runtime = _runtime_files()
  # The page's three files at least; any other data file counts too.
  assert {f"mha_jax/interp/explorer_static/page.{e}"
          for e in ("html", "css", "js")} <= set(runtime)
  missing = sorted(set(runtime) - set(names))
  assert not missing, (
      f"files the package reads at run time are missing from the wheel: "
      f"{missing} (pyproject.toml's [tool.setuptools.package-data])")


# Run in the new venv from a folder outside the checkout: a tiny random
# decoder's explorer page and the three notebook views, written to files.
_RENDER = textwrap.dedent("""
    import json, os, pathlib, sys
    from flax import nnx
    import numpy as np
    import mha_jax
    from mha_jax.interp import explorer

    out = pathlib.Path(sys.argv[1])
    config = mha_jax.ModelConfig(vocab_size=8, d_model=8, num_layers=1,
                                 num_heads=2, max_len=6, attention_only=True,
                                 implementation="einsum")
    model = mha_jax.DecoderLM(config, rngs=nnx.Rngs(0))
    data = explorer.explore(model, {"inputs": np.array([[1, 3, 4, 5, 3, 4]])})
    (out / "explorer.html").write_text(
        explorer.render(data, title="wheel explorer", raw_arrays=False))
    pattern = data["kinds"][0]["weights"][0]               # [H, T, T]
    np.save(out / "pattern.npy", pattern)
    labels = ["BOS", "3", "4", "5", "3", "4"]
    views = {"heads": mha_jax.show.heads(pattern, labels, title="wheel heads"),
             "tokens": mha_jax.show.tokens(labels, np.arange(6.0)),
             "heads_bar": mha_jax.show.heads_bar(np.ones((1, 2)))}
    for name, view in views.items():
      view.save(out / f"{name}.html")
      (out / f"{name}.frame").write_text(view._repr_html_())
    (out / "where.json").write_text(json.dumps(
        {"mha_jax": mha_jax.__file__,
         "sys_path": [os.path.abspath(p) for p in sys.path]}))
""")


def _page_data(page: str) -> dict:
  """The JSON the page's script reads."""
  found = re.search(r'<script type="application/json" id="data">(.*?)'
                    r"</script>", page, re.S)
  return json.loads(found.group(1))


def _floats(b64: str) -> np.ndarray:
  return np.frombuffer(base64.b64decode(b64), "<f4")


def _template_pieces() -> list[str]:
  """The template's own text, as a rendered page must hold it: the HTML
  between its @@NAME@@ placeholders, the whole stylesheet and script."""
  template = (STATIC / "page.html").read_text()
  pieces = [p for p in re.split(r"@@\w+@@", template) if p.strip()]
  return pieces + [(STATIC / "page.css").read_text(),
                   (STATIC / "page.js").read_text()]


def test_installed_wheel_renders_the_explorer_and_the_notebook_views(
    venv, tmp_path):
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
  # As tests/conftest.py sets in this process: compiling unoptimised
  # programs halves the subprocess's compile time.
  env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
  _run([str(venv / "bin" / "python"), "-c", _RENDER, str(tmp_path)],
       cwd=tmp_path, env=env)
  where = json.loads((tmp_path / "where.json").read_text())
  installed = pathlib.Path(where["mha_jax"]).resolve()
  assert installed.is_relative_to(venv.resolve()), (
      f"mha_jax imported from {installed}, not from the wheel in {venv}")
  # Nor is the checkout on its path (a cwd or PYTHONPATH entry).
  assert not any(pathlib.Path(p).resolve() == ROOT
                 for p in where["sys_path"]), where["sys_path"]
  pieces = _template_pieces()
  for name in ("explorer", "heads", "tokens", "heads_bar"):
    page = (tmp_path / f"{name}.html").read_text()
    for piece in pieces:
      assert piece in page, (f"{name}.html lacks the template's "
                             f"{piece.strip()[:60]!r}")
    assert not re.search(r"@@\w+@@", page), f"{name}.html: a placeholder left"
  # And the pages hold the numbers they were given, bit for bit.
  pattern = np.load(tmp_path / "pattern.npy")  # [H, T, T]
  assert pattern.shape == (2, 6, 6)
  explorer_page = (tmp_path / "explorer.html").read_text()
  assert "<title>wheel explorer</title>" in explorer_page
  (kind,) = _page_data(explorer_page)["kinds"]
  assert kind["query_labels"] == ["BOS", "3", "4", "5", "3", "4"]
  assert (kind["num_layers"], kind["num_heads"]) == (1, 2)
  np.testing.assert_array_equal(_floats(kind["weights"]), pattern.ravel())
  (view,) = _page_data((tmp_path / "heads.html").read_text())["kinds"]
  np.testing.assert_array_equal(_floats(view["weights"]), pattern.ravel())
  # The notebook's frame embeds the saved page, escaped into srcdoc.
  frame = (tmp_path / "heads.frame").read_text()
  assert 'data-view="heads"' in frame and "wheel heads" in frame
  srcdoc = re.search(r'srcdoc="([^"]*)"', frame).group(1)
  assert html.unescape(srcdoc) == (tmp_path / "heads.html").read_text()
