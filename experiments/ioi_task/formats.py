"""How the IOI reports write their numbers and names: the models' labels,
heads as L{layer}H{head}, a mean with its interval over prompts and over
templates. Shared so that every IOI report reads alike."""

from __future__ import annotations

from experiments.ioi_task import prompts
from mha_jax.measure import report as report_lib

LABELS = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma 3 270M",
          "tiny_llama": "tiny random Llama", "tiny_gemma3":
          "tiny random Gemma 3"}


def ci(mean, interval, digits=2) -> str:
  """`+0.12 [+0.05, +0.20]`."""
  spec = f"+.{digits}f"
  return f"{mean:{spec}} {report_lib.interval(interval, spec=spec)}"


def summ(s, digits=2) -> str:
  """A summary dict's mean and interval over prompts."""
  return ci(s["mean"], s["ci95"], digits)


def both(s, digits=2, sign="+") -> str:
  """Mean, interval over prompts, then over templates (`sign` "": a
  share, written without a sign)."""
  spec = f"{sign}.{digits}f"
  return (f"{s['mean']:{spec}} {report_lib.interval(s['ci95'], spec=spec)}"
          f"; templates {report_lib.interval(s['ci95_templates'], spec=spec)}")


def triple(x, digits=2) -> str:
  """`[mean, low, high]` as `ci` writes it."""
  return ci(x[0], x[1:], digits)


def head(h) -> str:
  return report_lib.head_name(h[0], h[1])


def heads(hs) -> str:
  return ", ".join(head(h) for h in hs) if hs else "none"


def model(name) -> str:
  return LABELS.get(name, name)


def split_values(saved: dict, module: str, command: str | None) -> dict:
  """The report fields of a run that chooses heads on a selection half
  and tests groups against random groups on the held-out half (the
  ioi_output_heads and ioi_classes runs): its command, time and the
  config's split and group-rule settings."""
  e = saved["config"]["experiment"]
  return {
      "command": report_lib.command(module, command),
      "wall": f"{saved['wall_s'] / 60:.1f} min wall, "
              f"{saved['cpu_s'] / 60:.1f} CPU-min",
      "backend": saved["backend"],
      "per_template_order": str(e["per_template_order"]),
      "num_templates": str(len(prompts.TEMPLATES)),
      "selection_share": f"{e['selection_share']:.0%}",
      "relative_floor": f"{e['relative_floor']:.2f}",
      "max_group": str(e["max_group"]),
      "random_groups": str(e["random_groups"]),
      "max_p": f"{e['max_p']:.2f}",
      "resamples": str(e["resamples"]),
  }
