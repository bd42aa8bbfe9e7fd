"""`make mutation`'s targets name functions and tests that exist: a
function renamed or moved to another file would stop the whole run
(scripts/mutate.py exits on a target it cannot find), so this reads the
targets and the modules (with `ast`, no cosmic-ray needed) and checks."""

import ast
import pathlib
import shlex

ROOT = pathlib.Path(__file__).resolve().parents[1]


# The module constants the planted bugs' entries are written with.
_PREFIXES = ("_PALLAS_GPU", "_EAP", "_PATCHING", "_POSITIONS",
             "_IOI_CIRCUIT", "_IOI_HEADS", "_IOI_CLASSES", "_SAE")


def _constants() -> dict:
  tree = ast.parse((ROOT / "scripts" / "mutate.py").read_text())
  env = {}
  for node in tree.body:  # the module's constant assignments, in order
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and (node.targets[0].id in ("_FLASH_K", "_FLASH_TESTS", "TARGETS",
                                    "PLANTED")
             or node.targets[0].id.startswith(_PREFIXES))):
      env[node.targets[0].id] = eval(compile(ast.Expression(node.value),  # pylint: disable=eval-used
                                             "mutate.py", "eval"), {}, env)
  return env


def _targets() -> dict:
  return _constants()["TARGETS"]


def test_every_target_names_existing_functions_and_tests():
  targets = _targets()
  assert len(targets) > 10
  for name, (module, functions, _, tests, _) in targets.items():
    tree = ast.parse((ROOT / module).read_text())
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    missing = sorted(set(functions) - defined)
    assert not missing, f"target {name!r}: {module} has no {missing}"
    for word in shlex.split(tests):
      if word.startswith("tests/"):
        assert (ROOT / word).exists(), f"target {name!r}: no {word}"


def test_every_planted_bug_finds_its_text_once():
  # `mutate.py --planted` replaces an exact piece of text: if an edit of
  # the module changed it, the bug would no longer be planted.
  planted = _constants()["PLANTED"]
  assert len(planted) >= 5
  for name, (module, old, new, tests) in planted.items():
    text = (ROOT / module).read_text()
    assert text.count(old) == 1, f"planted bug {name!r}: {module}"
    assert old != new
    for word in shlex.split(tests):
      assert (ROOT / word).exists(), f"planted bug {name!r}: no {word}"
