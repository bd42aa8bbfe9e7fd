"""The heads the ioi experiment's circuit names, read from its
results.json: the classes each experiment that tests that circuit
starts from.

One model's entry of results.json "circuits" holds the two direct-path
classes at its top level and each path-patching round under "paths"; a
round that found no receivers has no "heads".
"""

from __future__ import annotations

# (where, key, label) in the order reported; "where" None: a top-level
# class, else a path patching round under it.
CLASSES = ((None, "name_movers", "output heads"),
           (None, "negative_movers", "negative output heads"),
           ("paths", "s_inhibition", "S-inhibition"),
           ("paths", "duplicate_induction", "induction / duplicate-token"),
           ("paths", "previous_token", "previous-token"),
           ("paths", "output_kv", "into the output heads' keys and values"))


def classes(entry: dict) -> dict:
  """`{label: [[layer, head], ...]}`: the non-empty classes of one
  model's circuit `entry`."""
  out = {}
  for where, key, label in CLASSES:
    heads = (entry if where is None else entry.get(where, {})).get(
        key, {}).get("heads", [])
    if heads:
      out[label] = [[int(l), int(h)] for l, h in heads]
  return out


def union(by_class: dict) -> list:
  """The circuit: every head of any class, sorted, each once."""
  return sorted({(l, h) for heads in by_class.values() for l, h in heads})
