"""Attention sinks, the findings: sentences generated from the intervals
of results.json, no stronger than they are.

`text` gives the bullets of the report's "What the numbers show"; each
bullet's wording depends on where an interval lies, so it is written
here, and report.md.tmpl holds the rest of the prose.
"""

from __future__ import annotations

from mha_jax.measure import report as report_lib


def ms(x, digits=3) -> str:
  """`mean ± std` of a summary over seeds."""
  return report_lib.fmt(x["mean"], x["std"], digits)


def ci(x, digits=3) -> str:
  """`mean ± std [95% interval]` of a summary over seeds."""
  return f"{ms(x, digits)} {report_lib.interval(x['ci95'], digits)}"


def diff(d, digits=3) -> str:
  """A Welch difference, `+diff [lo, hi]`."""
  return report_lib.difference(d, digits, interval_spec=f".{digits}f",
                               missing="n/a")


def _side(interval) -> str:
  """'above 0' / 'below 0' / 'not resolved' for an interval."""
  if interval is None:
    return "not resolved (one seed)"
  if interval[0] > 0:
    return "above 0"
  if interval[1] < 0:
    return "below 0"
  return "not resolved from 0"


def _against(x, floor) -> str:
  """Where a t interval of a share lies against a floor."""
  interval = x["ci95"]
  if interval is None:
    return "(one seed: no interval)"
  if interval[0] > floor:
    return f"above uniform attention's {floor:.3f}"
  if interval[1] < floor:
    return f"below uniform attention's {floor:.3f}"
  return f"not resolved from uniform attention's {floor:.3f}"


def _share_finding(n, x, floors, nl) -> str:
  """Position 0's largest share against uniform, and the learned sink's."""
  out = (f"* {n}: the head with the most attention on position 0 gives "
         f"it {ci(x['key0_max'])}, "
         f"{_against(x['key0_max'], floors['uniform_key0_closed_form'])}; "
         f"on late queries {ci(x['key0_late_max'])}, "
         f"{_against(x['key0_late_max'], floors['uniform_key0_late'])}")
  if n.split("+")[0] == "sinks":
    out += (f". The learned sink takes {ms(x['sink_layer0_mean'])} of "
            f"a layer-0 head's attention on average and "
            f"{ms(x[f'sink_layer{nl - 1}_mean'])} of a last-layer head's "
            f"(largest head {ci(x['sink_max'])}; "
            f"{ms(x['init_sink_mean'])} at init, sink logit 0)")
  return out + "."


def _parker_finding(n, x, model_heads) -> str:
  """Where the top parking head sits and how much its removal costs."""
  layers = [int(v) for v in x["top_parker_layer"]["values"]]
  ranks = [int(v) for v in x["top_parker_ablation_rank"]["values"]]
  return (f"* {n}: the head that parks most on late queries sits in layer "
          f"{', '.join(map(str, layers))} (per seed); its zero-ablation "
          f"Δloss ranks {', '.join(map(str, ranks))} of {model_heads} (1 = "
          "the head whose removal costs most).")


def _difference_finding(pair, d, summary) -> str:
  """One Welch comparison, and whether the seeds' losses separate."""
  parts = [f"{k} {diff(d[k])} ({_side(d[k]['ci95'])})"
           for k in ("key0_late_max", "parked_late_max", "loss",
                     "ablation_mean")]
  a, b = (summary[n]["loss"]["values"] for n in pair.split(" - "))
  if min(a) > max(b) or max(a) < min(b):
    parts.append("every seed's loss is "
                 + ("above" if min(a) > max(b) else "below")
                 + " every seed's of the other setting")
  return f"* {pair}: " + "; ".join(parts) + "."


def text(saved) -> str:
  """The findings, one bullet each, as Markdown."""
  summary, m = saved["summary"], saved["config"]["model"]
  nl, model_heads = m["num_layers"], m["num_layers"] * m["num_heads"]
  out = [_share_finding(n, x, saved["floors"], nl)
         for n, x in summary.items()]
  out += [_parker_finding(n, x, model_heads) for n, x in summary.items()]
  out += [_difference_finding(pair, d, summary)
          for pair, d in saved["comparisons"].items()]
  out += [f"* {n}, last layer, idle minus target queries (position-0 share "
          f"over uniform's): {ci(d, 2)} ({_side(d['ci95'])})."
          for n, x in summary.items()
          if (d := x.get("key0_idle_minus_task_last_vs_uniform")) is not None]
  return "\n".join(out)
