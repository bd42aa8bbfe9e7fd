"""The worked-example command prints FORMULAS.md's numbers for "cat"."""

from experiments import toy_example


def test_toy_example_prints_the_formulas_numbers(capsys):
  toy_example.main([])
  printed = capsys.readouterr().out
  lines = [ln.strip() for ln in printed.splitlines() if ln.endswith("<- cat")]
  # Per-head weights and outputs, then the concatenation and W^O = I output.
  assert "cat [  0.198   0.401   0.401 ]  <- cat" in lines
  assert "cat [  0.178   0.734   0.088 ]  <- cat" in lines
  assert "cat [  1.000   1.203 ]  <- cat" in lines
  assert "cat [  0.822   0.266 ]  <- cat" in lines
  assert lines.count("cat [  1.000   1.203   0.822   0.266 ]  <- cat") == 2
  assert "equals the staged trace: True" in printed
