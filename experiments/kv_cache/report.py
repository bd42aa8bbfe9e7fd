"""report.md and plots for experiments/kv_cache/, from its results dict.

`write` turns what `run.measure` returned (its "summary" included: slopes,
speed-up, target verdicts) into the plots, report.md and results.json;
nothing here times or counts. The prose is report.md.tmpl beside this
file; `render` fills it from results.json alone, so a committed report
regenerates from its results.json. Every number in the report is read
from the results, and the wording around a number changes with it, so a
target that is missed is reported as missed.
"""

from __future__ import annotations

import os
import functools
import pathlib

from mha_jax.measure import plots as plots_lib
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
MIB = 2 ** 20
NOT_MEASURED = (
    "Not measured in this run. Trained MHA/GQA/MQA language models are "
    "compared by passing `--behaviour_results=<results.json>` from the "
    "training experiments (format in experiments/kv_cache.py).")


def write(cfg, results, workdir, command: str | None = None) -> dict:
  """The plots, report.md and results.json in `workdir`; returns what
  results.json holds."""
  workdir = pathlib.Path(workdir)
  plots(results, workdir)
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), config=cfg)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def plots(results, workdir):
  """decode_time.png, flops.png and cache_bytes.png into `workdir`."""
  rows = results["timing"]
  n = [r["n"] for r in rows]
  full = [r for r in rows if "nocache_s" in r]
  fig, ax = plots_lib.subplots(figsize=(5.0, 3.2))
  ax.loglog(n, [1e3 * r["cached_s"] for r in rows], "o-", label="with cache")
  ax.loglog([r["n"] for r in full], [1e3 * r["nocache_s"] for r in full],
            "s-", label="recompute prefix")
  ax.set(xlabel="context n (tokens)", ylabel="ms per generated token",
         title="Decode step time (median)")
  ax.legend(fontsize=7)
  plots_lib.save(fig, os.path.join(workdir, "decode_time.png"))
  fig, ax = plots_lib.subplots(figsize=(5.0, 3.2))
  for key, label, mark in (("cached_xla_flops", "cache: XLA", "o-"),
                           ("cached_analytic_flops", "cache: analytic", "x--")):
    ax.loglog(n, [r[key] for r in rows], mark, label=label)
  for key, label, mark in (("nocache_xla_flops", "recompute: XLA", "s-"),
                           ("nocache_analytic_flops", "recompute: analytic",
                            "+--")):
    ax.loglog([r["n"] for r in full], [r[key] for r in full], mark,
              label=label)
  ax.set(xlabel="context n (tokens)", ylabel="FLOPs per generated token",
         title="FLOPs per step")
  ax.legend(fontsize=7)
  plots_lib.save(fig, os.path.join(workdir, "flops.png"))
  cb = results["cache_bytes"]
  fig, ax = plots_lib.subplots(figsize=(5.0, 3.2))
  ax.bar([f"K={r['num_kv_heads']}" for r in cb],
         [r["bytes_per_token"] / 1024 for r in cb])
  ax.set(ylabel="KiB per token (all layers)", title="KV cache size")
  plots_lib.save(fig, os.path.join(workdir, "cache_bytes.png"))


def _timing_table(rows) -> str:
  """Time and FLOPs per token at every context, cached and recomputed."""
  return report_lib.md_table(
      ["n", "cached ms (min)", "recompute ms (min)", "speed-up",
       "cached FLOPs XLA", "cached matmul FLOPs (jaxpr)", "cached analytic",
       "recompute FLOPs XLA", "recompute analytic"],
      [[r["n"], f"{1e3 * r['cached_s']:.3f} ({1e3 * r['cached_min_s']:.3f})",
        f"{1e3 * r['nocache_s']:.1f} ({1e3 * r['nocache_min_s']:.1f})"
        if "nocache_s" in r else "-",
        f"{r['nocache_s'] / r['cached_s']:.0f}x" if "nocache_s" in r else "-",
        f"{r['cached_xla_flops']:.3g}", f"{r['cached_matmul_flops']:.4g}",
        f"{r['cached_analytic_flops']:.4g}",
        f"{r['nocache_xla_flops']:.3g}" if "nocache_s" in r else "-",
        f"{r['nocache_analytic_flops']:.4g}" if "nocache_s" in r else "-"]
       for r in rows])


def _memory_table(cb, max_len) -> str:
  """Cache bytes per token and per sequence for each K."""
  return report_lib.md_table(
      ["K (kv heads)", "bytes/token (.nbytes)", "formula 2*L*K*Dh*4",
       f"MiB per {max_len}-token sequence", "fraction of K=H"],
      [[r["num_kv_heads"], f"{r['bytes_per_token']:.0f}",
        r["formula_bytes_per_token"], f"{r['bytes_per_sequence'] / MIB:.2f}",
        f"{r['fraction_of_first']:.4f}"] for r in cb])


def _intensity_table(it) -> str:
  """FLOPs per byte and step time of one decode step, each K and B."""
  return report_lib.md_table(
      ["K", "B", "analytic FLOPs", "weights MiB", "cache read MiB",
       "FLOPs/byte (analytic)", "FLOPs/byte (XLA)", "step ms (min)"],
      [[r["num_kv_heads"], r["batch"], f"{r['analytic_flops']:.3g}",
        f"{r['weight_bytes'] / MIB:.2f}", f"{r['cache_bytes_read'] / MIB:.2f}",
        f"{r['analytic_intensity']:.2f}",
        f"{r['xla_flops'] / max(r['xla_bytes_accessed'], 1):.2f}",
        f"{1e3 * r['step_s']:.2f} ({1e3 * r['step_min_s']:.2f})"]
       for r in it])


def _behaviour_section(behaviour) -> str:
  """Section 4: the trained runs side by side, or that there were none."""
  if behaviour is None:
    return NOT_MEASURED
  runs = behaviour.get("runs", [])
  keys = list(dict.fromkeys(k for r in runs for k in r))
  text = [behaviour.get("description", ""),
          f"Command: {behaviour.get('command', '(not given)')}", "",
          report_lib.md_table(keys, [[r.get(k, "") for k in keys]
                                     for r in runs])]
  return "\n".join(text)


def _behaviour_answer(behaviour):
  """Trained MHA vs shared-K/V models, from the behaviour JSON's
  "variants" (written by experiments.kv_behaviour); None without them."""
  variants = (behaviour or {}).get("variants")
  if not variants:
    return None
  full = variants[0]  # experiments.kv_behaviour lists the reference first
  comparisons = {c["variant"]: c for c in behaviour.get("comparisons", [])
                 if c["reference"] == full.get("key")}

  def ms(stat):
    return report_lib.fmt(stat["mean"], stat.get("std"))

  text = [f"Behaviour of trained models. Trained alike ({full['seeds']} "
          f"seeds each), {full['name']} (K={full['num_kv_heads']}) reached "
          f"eval loss {ms(full['eval_loss'])} and cached-generation token "
          f"accuracy {ms(full['generation_token_accuracy'])} (mean ± sample "
          f"std)."]
  for v in variants[1:]:
    c = comparisons.get(v["key"], {}).get("eval_loss")
    if c is None or c.get("ci95") is None:
      verdict = "no interval (too few seeds)"
    else:
      verdict = (f"95% interval {report_lib.interval(c['ci95'], spec='+.3f')}, "
                 + ("which excludes 0" if c["excludes_0"] else
                    f"which contains 0 (the seeds would detect about "
                    f"{c['detectable']:.3f})"))
    d = v["eval_loss"]["mean"] - full["eval_loss"]["mean"]
    text.append(
        f" {v['name']} (K={v['num_kv_heads']}): loss "
        f"{ms(v['eval_loss'])}, token accuracy "
        f"{ms(v['generation_token_accuracy'])}; its mean loss is {d:+.3f} "
        f"from {full['name']}'s ({verdict}), with a cache of "
        f"{v['cache_bytes_per_token'] / full['cache_bytes_per_token']:.3f} "
        f"of {full['name']}'s per token and {v['params']} instead of "
        f"{full['params']} parameters.")
  return "".join(text)


def _setup(config, machine) -> dict:
  """The machine, the model's sizes and the timing runs' counts."""
  m, b = config["model"], config["bench"]
  return {"backend": machine["backend"], "cpu_count": machine["cpu_count"],
          "jax": machine["jax"], "head_dim": m["d_model"] // m["num_heads"],
          **{k: m[k] for k in ("num_layers", "positions", "vocab_size",
                               "d_model", "num_heads", "mlp_dim",
                               "num_kv_heads", "implementation")},
          **{k: b[k] for k in ("batch", "repeats", "nocache_repeats")},
          "extra_slots": b["warmup"] + b["repeats"]}


def _cost(rows, target) -> dict:
  """One decode step with and without the cache: at the target context,
  or at the longest context recomputed when the target was not."""
  full = [r for r in rows if "nocache_s" in r]
  at = next((r for r in full if r["n"] == target), full[-1])
  return {"cost_n": at["n"],
          "nocache_flops": f"{at['nocache_xla_flops']:.3g}",
          "nocache_ms": f"{1e3 * at['nocache_s']:.1f}",
          "cached_flops": f"{at['cached_xla_flops']:.3g}",
          "cached_ms": f"{1e3 * at['cached_s']:.2f}",
          "speedup": f"{at['nocache_s'] / at['cached_s']:.0f}",
          "flop_ratio":
              f"{at['nocache_xla_flops'] / at['cached_xla_flops']:.0f}"}


def _slopes(s, target_slope) -> dict:
  """The log-log slopes of step time, and whether the cached one over the
  longest contexts keeps to its target."""
  upper = s["cached_slope_upper_half"]
  return {"cached_slope": f"{s['cached_slope']:.2f}",
          "cached_slope_upper_half": f"{upper:.2f}",
          "nocache_slope": f"{s['nocache_slope']:.2f}",
          "cached_total": f"{1 + s['cached_slope']:.2f}",
          "nocache_total": f"{1 + s['nocache_slope']:.2f}",
          "slope_verdict": (f"above the target {target_slope:g}"
                            if upper > target_slope else "within the target")}


def _memory(cb, num_heads) -> dict:
  """The cache of multi-head attention (K = H) against multi-query (K =
  1); the first and last K measured where those are missing."""
  mha = next((r for r in cb if r["num_kv_heads"] == num_heads), cb[0])
  mqa = next((r for r in cb if r["num_kv_heads"] == 1), cb[-1])
  return {"mha_bytes": f"{mha['bytes_per_token']:.0f}",
          "mha_mib": f"{mha['bytes_per_sequence'] / MIB:.2f}",
          "mqa_bytes": f"{mqa['bytes_per_token']:.0f}",
          "mqa_fraction": f"{mqa['fraction_of_first']:.4f}"}


def _intensity(it, num_heads) -> dict:
  """One decode step at the largest batch with K = H against K = 1 (the
  first and last K measured where those are missing)."""
  big = max(r["batch"] for r in it)
  sel = {r["num_kv_heads"]: r for r in it if r["batch"] == big}
  many = sel.get(num_heads, next(iter(sel.values())))
  one = sel.get(1, list(sel.values())[-1])
  fall = many["xla_bytes_accessed"] / one["xla_bytes_accessed"]
  return {"big_batch": big, "many_k": many["num_kv_heads"],
          "one_k": one["num_kv_heads"],
          "many_intensity": f"{many['analytic_intensity']:.2f}",
          "one_intensity": f"{one['analytic_intensity']:.2f}",
          "many_cache_mib": f"{many['cache_bytes_read'] / MIB:.1f}",
          "one_cache_mib": f"{one['cache_bytes_read'] / MIB:.1f}",
          "many_flops": f"{many['analytic_flops']:.3g}",
          "one_flops": f"{one['analytic_flops']:.3g}",
          "many_ms": f"{1e3 * many['step_s']:.2f}",
          "one_ms": f"{1e3 * one['step_s']:.2f}",
          "one_speedup": f"{many['step_s'] / one['step_s']:.1f}",
          "one_bytes_fall": f"{fall:.1f}"}


def _jump(rows) -> dict:
  """The largest rise in cached step time between neighbouring contexts,
  beside the rise in XLA's FLOPs and bytes."""
  a, b = max(zip(rows, rows[1:]),
             key=lambda ab: ab[1]["cached_s"] / ab[0]["cached_s"])
  return {"jump_from": a["n"], "jump_to": b["n"],
          "jump_from_ms": f"{1e3 * a['cached_s']:.2f}",
          "jump_to_ms": f"{1e3 * b['cached_s']:.2f}",
          "jump_ratio": f"{b['cached_s'] / a['cached_s']:.1f}",
          "jump_flops": f"{b['cached_xla_flops'] / a['cached_xla_flops']:.2f}",
          "jump_bytes": f"{b['cached_xla_bytes'] / a['cached_xla_bytes']:.2f}"}


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, s, mach = saved["config"], saved["summary"], saved["machine"]
  num_heads, behaviour = config["model"]["num_heads"], saved["behaviour"]
  errors = saved["exactness_max_rel_err"]
  return {
      "command": report_lib.command("experiments.kv_cache", command),
      **_setup(config, mach),
      "targets": "\n".join(f"- {name}: **{'met' if ok else 'NOT met'}**"
                           for name, ok in s["targets"].items()),
      "timing_table": _timing_table(saved["timing"]),
      "memory_table": _memory_table(saved["cache_bytes"],
                                    config["heads"]["max_len"]),
      "max_len": config["heads"]["max_len"],
      "context": config["heads"]["context"],
      "intensity_table": _intensity_table(saved["intensity"]),
      "behaviour": _behaviour_section(behaviour),
      "exactness": ", ".join(f"K={k}: {v:.1e}" for k, v in errors.items()),
      **_cost(saved["timing"], config["bench"]["target_context"]),
      **_slopes(s, config["bench"]["target_slope"]),
      **_memory(saved["cache_bytes"], num_heads),
      **_intensity(saved["intensity"], num_heads),
      **_jump(saved["timing"]),
      "load_start": f"{mach['loadavg'][0]:.1f}",
      "load_end": f"{mach['loadavg'][1]:.1f}",
      "max_error": f"{max(errors.values()):.1e}",
      "behaviour_note": (" (not measured in this run)." if behaviour is None
                         else "."),
      "trained": _behaviour_answer(behaviour) or "",
  }
