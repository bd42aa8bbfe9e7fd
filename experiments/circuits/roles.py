"""Experiment 6's role claims: a named head against the best other one.

"The current-token head feeds the values" says more than "a layer-0 head
feeds the values": it says that head, not another, does. The evidence for
that is paired within each seed (the same model, the same examples): the
role head's path minus the strongest OTHER layer-0 head's path on the same
route, with a t interval over seeds (`run._lead`). This module writes the
per-seed table behind that interval and the verdict it supports; it reads
results.json alone.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import report as report_lib

# The role claims: (HEADLINES key, route as the table names it, role).
ROLE_CLAIMS = (("key_prev_k_noise", "keys", "previous-token"),
               ("val_cur_v_noise", "values", "current-token"),
               ("sc_cur_q_noise", "queries", "current-token"))
KINDS = {"key": "key", "val": "value", "sc": "second_copy"}


def _head(name: str) -> str:
  """'h3:v' -> 'L0H3'."""
  return f"L0{name.split(':')[0].replace('h', 'H')}"


def _best_other(run, key, role_set) -> tuple[str, float]:
  """The strongest layer-0 head other than the role head on the claim's
  route, under the claim's corruption and direction, in one seed."""
  c = run["corruptions"][KINDS[key.split("_")[0]]]
  d = key.rsplit("_", 1)[1]
  route = role_set.split(":")[1]
  others = [(n, v) for n, v in zip(c["names"], c[d]["fraction"])
            if n.startswith("h") and n.endswith(f":{route}")
            and n != role_set]
  return max(others, key=lambda nv: nv[1])


def verdict(claim, route, role) -> str:
  """What the paired lead's interval lets the report say of the role, and
  in how many seeds the role head is ahead."""
  # One seed has no interval: nothing is separated.
  lo, hi = claim["lead"]["ci95"] or (-np.inf, np.inf)
  if lo > 0:
    said = (f"the {role} head feeds the {route}, separated from the best "
            "other layer-0 head (paired lead above 0 in the interval)")
  elif hi < 0:
    said = (f"another layer-0 head feeds the {route} more than the {role} "
            "head (paired lead below 0 in the interval)")
  else:
    said = (f"a layer-0 head feeds the {route}, but the {role} head is one "
            "of the layer-0 heads, NOT separated from the best other one "
            "(paired lead interval spans 0)")
  leads = claim["lead"]["values"]
  return f"{said}; ahead in {sum(v > 0 for v in leads)} of {len(leads)} seeds"


def values(saved: dict) -> dict:
  """The per-seed table of the role claims and a verdict for each."""
  claims, runs = saved["claims"], saved["runs"]
  seeds = saved["config"]["experiment"]["seeds"]
  rows = []
  for i, s in enumerate(seeds):
    row = [s]
    for key, _, _ in ROLE_CLAIMS:
      c = claims[key]
      other, floor = _best_other(runs[f"seed{s}"], key, c["sets"][i])
      row += [f"{_head(c['sets'][i])} {c['values'][i]:.2f}",
              f"{_head(other)} {floor:.2f}",
              f"{c['values'][i] - floor:+.2f}"]
    rows.append(row)
  for label, field in (("lead over seeds", "lead"),
                       ("lead vs chance", "lead_vs_chance")):
    row = [label]
    for key, _, _ in ROLE_CLAIMS:
      row += ["", "", report_lib.summary(claims[key][field], 2)]
    rows.append(row)
  headers = ["seed"]
  for _, route, role in ROLE_CLAIMS:
    headers += [f"{route}: {role} head", "best other", "lead"]
  out = {"role_table": report_lib.md_table(headers, rows)}
  for key, route, role in ROLE_CLAIMS:
    out[f"{key}_lead"] = report_lib.summary(claims[key]["lead"], 2)
    out[f"{key}_lead_vs_chance"] = report_lib.summary(
        claims[key]["lead_vs_chance"], 2)
    out[f"{key}_role_verdict"] = verdict(claims[key], route, role)
  return out
