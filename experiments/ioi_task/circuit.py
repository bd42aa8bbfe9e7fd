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


# The held-out circuit's classes: (results file, key, label). Output
# heads come from ioi_output_heads' groups (name movers and S suppressors
# both act on the direct path; negative heads apart), the upstream
# classes from ioi_classes' path-patching rounds.
HELD_OUT = (("output", "name_movers", "output heads"),
            ("output", "s_suppressors", "output heads"),
            ("output", "negative", "negative output heads"),
            ("classes", "s_inhibition", "S-inhibition"),
            ("classes", "induction_duplicate", "induction / duplicate-token"),
            ("classes", "previous_token", "previous-token"))


def held_out_classes(output: dict, upstream: dict, model: str) -> dict:
  """`{label: [[layer, head], ...]}`: the classes of `model` that were
  chosen on one half of 128 prompts and confirmed on the other, read from
  the ioi_output_heads (`output`) and ioi_classes (`upstream`) results
  (each results.json, loaded). A group or round not confirmed is left
  out, so is an empty one."""
  sources = {"output": (output, "groups"), "classes": (upstream, "rounds")}
  for source, (saved, _) in sources.items():
    if model not in saved.get("models", {}):
      raise ValueError(f"held_out_classes: the {source} results hold "
                       f"{sorted(saved.get('models', {}))}, not {model!r}")
  out = {}
  for source, key, label in HELD_OUT:
    saved, field = sources[source]
    entry = saved["models"][model][field].get(key, {})
    if entry.get("confirmed") and entry.get("heads"):
      out.setdefault(label, []).extend(
          [int(l), int(h)] for l, h in entry["heads"])
  return out
