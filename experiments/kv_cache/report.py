"""report.md and plots for experiments/kv_cache/, from its results dict.

Every number in the report is read from `results` (what `run.measure`
measured); the wording around a number changes with it, so a target that
is missed is reported as missed. `write` adds the "summary" (slopes,
speed-up, target verdicts) and writes the plots, report.md and
results.json.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from mha_jax.measure import plots as plots_lib
from mha_jax.measure import report as report_lib
from mha_jax.measure import timing

def summarise(cfg, results):
  """Slopes, the speed-up at the target context, and the target verdicts."""
  b, m = cfg.bench, cfg.model
  rows = results["timing"]
  n = [r["n"] for r in rows]
  upper = [r for r in rows if r["n"] >= np.median(n)]
  full = [r for r in rows if "nocache_s" in r]
  slope = timing.loglog_slope
  s = {"cached_slope": slope(n, [r["cached_s"] for r in rows]),
       "cached_slope_upper_half": slope([r["n"] for r in upper],
                                        [r["cached_s"] for r in upper]),
       "nocache_slope": slope([r["n"] for r in full],
                              [r["nocache_s"] for r in full])}
  at = [r for r in full if r["n"] == b.target_context]
  if at:
    s["speedup_at_target"] = at[0]["nocache_s"] / at[0]["cached_s"]
    s["xla_flop_ratio_at_target"] = (at[0]["nocache_xla_flops"]
                                     / at[0]["cached_xla_flops"])
  by_k = {r["num_kv_heads"]: r for r in results["cache_bytes"]}
  if m.num_heads in by_k and 1 in by_k:
    s["mqa_over_mha_bytes"] = (by_k[1]["bytes_per_sequence"]
                               / by_k[m.num_heads]["bytes_per_sequence"])
  s["targets"] = {
      f"speed-up at n={b.target_context} >= {b.target_speedup:g}x":
          s.get("speedup_at_target", 0.0) >= b.target_speedup,
      f"cached log-log slope <= {b.target_slope:g}":
          s["cached_slope"] <= b.target_slope,
      f"MQA cache == 1/{m.num_heads} of MHA":
          s.get("mqa_over_mha_bytes") == 1.0 / m.num_heads,
  }
  return s


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


def _behaviour_section(behaviour):
  if behaviour is None:
    return ("Not measured in this run. Trained MHA/GQA/MQA language models "
            "are compared by passing `--behaviour_results=<results.json>` "
            "from the training experiments (format in experiments/"
            "kv_cache.py).")
  runs = behaviour.get("runs", [])
  keys = list(dict.fromkeys(k for r in runs for k in r))
  text = [behaviour.get("description", ""),
          f"Command: {behaviour.get('command', '(not given)')}", "",
          report_lib.md_table(keys, [[r.get(k, "") for k in keys]
                                     for r in runs])]
  return "\n".join(text)


def report(cfg, results) -> str:
  """The text of report.md (the plots are `plots`)."""
  s, m, b = results["summary"], cfg.model, cfg.bench
  mach = results["machine"]
  timing_table = report_lib.md_table(
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
       for r in results["timing"]])
  cb = results["cache_bytes"]
  mem = report_lib.md_table(
      ["K (kv heads)", "bytes/token (.nbytes)", "formula 2*L*K*Dh*4",
       f"MiB per {cfg.heads.max_len}-token sequence", "fraction of K=H"],
      [[r["num_kv_heads"], f"{r['bytes_per_token']:.0f}",
        r["formula_bytes_per_token"],
        f"{r['bytes_per_sequence'] / 2**20:.2f}",
        f"{r['fraction_of_first']:.4f}"] for r in cb])
  it = results["intensity"]
  inten = report_lib.md_table(
      ["K", "B", "analytic FLOPs", "weights MiB", "cache read MiB",
       "FLOPs/byte (analytic)", "FLOPs/byte (XLA)", "step ms (min)"],
      [[r["num_kv_heads"], r["batch"], f"{r['analytic_flops']:.3g}",
        f"{r['weight_bytes'] / 2**20:.2f}",
        f"{r['cache_bytes_read'] / 2**20:.2f}",
        f"{r['analytic_intensity']:.2f}",
        f"{r['xla_flops'] / max(r['xla_bytes_accessed'], 1):.2f}",
        f"{1e3 * r['step_s']:.2f} ({1e3 * r['step_min_s']:.2f})"]
       for r in it])
  targets = "\n".join(f"- {name}: **{'met' if ok else 'NOT met'}**"
                      for name, ok in s["targets"].items())
  exact = ", ".join(f"K={k}: {v:.1e}"
                    for k, v in results["exactness_max_rel_err"].items())
  text = f"""# How a KV cache changes the cost of multi-head attention decoding

Command: {report_lib.command("experiments.kv_cache")} (sizes in
configs/kv_cache.py).
Machine: {mach['backend']} backend, {mach['cpu_count']} CPU cores visible,
jax {mach['jax']}. Model: `DecoderLM` (token embedding, L={m.num_layers}
pre-LayerNorm attention + MLP blocks, {m.positions} positions, final
LayerNorm, readout to V={m.vocab_size} logits), D={m.d_model}, H={m.num_heads},
Dh={m.d_model // m.num_heads}, F={m.mlp_dim}, K={m.num_kv_heads} for timing,
float32, batch {b.batch}, implementation `{m.implementation}`. Recomputing
runs the model over all n+1 tokens, logits at every position included.
Times are medians (minimum in brackets) of {b.repeats} (cached) /
{b.nocache_repeats} (recompute) calls after warm-up, each ended by
`block_until_ready`. Speed-ups and slopes use the medians.

## Targets
{targets}

## 1. Time and FLOPs per generated token
{timing_table}

Log-log slope of the cached step time over all contexts:
{s['cached_slope']:.2f} (over the upper half, n >= median:
{s['cached_slope_upper_half']:.2f}); of recomputing the prefix:
{s['nocache_slope']:.2f}. The cached step reads all S slots of its buffer
(S = n + {b.warmup + b.repeats} here), so its cost follows the buffer size.
Plots: decode_time.png, flops.png.

## 2. Cache memory
{mem}

Plot: cache_bytes.png. Each cache also holds a [B] int32 length per layer.

## 3. Arithmetic intensity of one decode step (n = {cfg.heads.context})
{inten}

Bytes moved = all weights (the whole embedding table included, though a
step gathers only B rows of it) + the k/v cache read once (analytic); XLA's
"bytes accessed" counts every operand touch, including the cache write.

## 4. Behaviour
{_behaviour_section(results['behaviour'])}

## 5. Exactness
Largest relative error of the logits of prefill + 8 decode steps against
the full causal forward, ragged prompts (5, 9, 2), float32: {exact}.

## 6. The answer
{answer(cfg, results)}
"""
  return text


def answer(cfg, results):
  """Plain-language answer; each sentence quotes a number measured above."""
  s, m, b = results["summary"], cfg.model, cfg.bench
  rows = {r["n"]: r for r in results["timing"]}
  parts = []
  at = rows.get(b.target_context)
  if at and "nocache_s" in at:
    parts.append(
        f"Cost per token. Without a cache, generating the token after "
        f"n={at['n']} reruns the model over n+1 tokens: "
        f"{at['nocache_xla_flops']:.3g} FLOPs (XLA) and "
        f"{1e3 * at['nocache_s']:.1f} ms. With the cache, only the new token "
        f"is projected and it reads the cached keys and values: "
        f"{at['cached_xla_flops']:.3g} FLOPs and {1e3 * at['cached_s']:.2f} "
        f"ms, {s['speedup_at_target']:.0f}x faster "
        f"({s['xla_flop_ratio_at_target']:.0f}x fewer FLOPs).")
  parts.append(
      f"Growth. Step time grows with slope {s['cached_slope']:.2f} in log-log "
      f"with the cache (the 4nd attention term over the cache; the "
      f"projections, MLP and readout are constant per token) and "
      f"{s['nocache_slope']:.2f} without it (the n^2 score matrix, diluted at "
      f"short contexts by the n d^2 projections and MLP and the n d V "
      f"readout). Summed over a "
      f"generation of n tokens, total time grows about as n^(1 + slope): "
      f"n^{1 + s['cached_slope']:.2f} with the cache against "
      f"n^{1 + s['nocache_slope']:.2f} without.")
  cb = results["cache_bytes"]
  mha = next((r for r in cb if r["num_kv_heads"] == m.num_heads), cb[0])
  mqa = next((r for r in cb if r["num_kv_heads"] == 1), cb[-1])
  parts.append(
      f"Memory. The price is a cache of {mha['bytes_per_token']:.0f} bytes "
      f"per token for multi-head attention (K={m.num_heads}), i.e. "
      f"{mha['bytes_per_sequence'] / 2**20:.2f} MiB per "
      f"{cfg.heads.max_len}-token sequence, growing linearly with context and "
      f"batch. Sharing key/value heads divides it by H/K: multi-query "
      f"attention stores {mqa['bytes_per_token']:.0f} bytes per token, "
      f"{mqa['fraction_of_first']:.4f} of multi-head's.")
  it = results["intensity"]
  if it:
    big = max(r["batch"] for r in it)
    sel = {r["num_kv_heads"]: r for r in it if r["batch"] == big}
    lo, hi = sel.get(m.num_heads), sel.get(1)
    if lo and hi:
      parts.append(
          f"Intensity. A decode step does little arithmetic per byte: at "
          f"batch {big} and n={cfg.heads.context}, "
          f"{lo['analytic_intensity']:.2f} FLOPs/byte with K={m.num_heads} "
          f"and {hi['analytic_intensity']:.2f} with K=1, because the cache "
          f"read shrinks from {lo['cache_bytes_read'] / 2**20:.1f} to "
          f"{hi['cache_bytes_read'] / 2**20:.1f} MiB while the FLOPs barely "
          f"change ({lo['analytic_flops']:.3g} vs {hi['analytic_flops']:.3g}). "
          f"Measured step time here: {1e3 * lo['step_s']:.2f} ms vs "
          f"{1e3 * hi['step_s']:.2f} ms.")
  parts.append(_caveats(cfg, results))
  ex = results["exactness_max_rel_err"]
  parts.append(
      f"Behaviour of the computation. Caching changes no output: the largest "
      f"relative error against the full forward was "
      f"{max(ex.values()):.1e} (float32). Whether sharing key/value heads "
      f"changes what a trained model learns is section 4"
      + (" (not measured in this run)." if results["behaviour"] is None
         else "."))
  trained = _behaviour_answer(results["behaviour"])
  if trained:
    parts.append(trained)
  return "\n\n".join(parts)


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


def _caveats(cfg, results):
  """Where the measured times depart from the FLOP and byte counts."""
  rows = results["timing"]
  jumps = [(b["cached_s"] / a["cached_s"], a, b)
           for a, b in zip(rows, rows[1:])]
  ratio, a, b = max(jumps, key=lambda j: j[0])
  upper = results["summary"]["cached_slope_upper_half"]
  verdict = (f"above the target {cfg.bench.target_slope:g}"
             if upper > cfg.bench.target_slope else "within the target")
  text = [
      f"Caveats. Over the longest contexts (n >= median) the cached slope is "
      f"{upper:.2f}, {verdict}: the biggest step was from n={a['n']} to "
      f"n={b['n']}, "
      f"{1e3 * a['cached_s']:.2f} -> {1e3 * b['cached_s']:.2f} ms "
      f"({ratio:.1f}x) while XLA's FLOPs grew "
      f"{b['cached_xla_flops'] / a['cached_xla_flops']:.2f}x and its bytes "
      f"accessed {b['cached_xla_bytes'] / a['cached_xla_bytes']:.2f}x. A "
      f"decode step is bound by memory traffic, so its CPU time depends on "
      f"where the cache fits in the memory hierarchy, not only on counts."]
  it = results["intensity"]
  big = max(r["batch"] for r in it)
  sel = {r["num_kv_heads"]: r for r in it if r["batch"] == big}
  lo, hi = sel.get(cfg.model.num_heads), sel.get(1)
  if lo and hi:
    text.append(
        f" At batch {big}, K=1 ran {lo['step_s'] / hi['step_s']:.1f}x faster "
        f"than K={cfg.model.num_heads} while XLA's bytes accessed fell "
        f"{lo['xla_bytes_accessed'] / hi['xla_bytes_accessed']:.1f}x; the "
        f"rest of the gap is not explained by these counts.")
  load = results["machine"].get("loadavg")
  if load:
    text.append(f" The machine was shared: 1-minute load average "
                f"{load[0]:.1f} at the start and {load[1]:.1f} at the end of "
                f"the run on {results['machine']['cpu_count']} cores, so "
                f"times are indicative.")
  return "".join(text)


def write(cfg, results, workdir) -> dict:
  """The summary, plots, report.md and results.json in `workdir`;
  returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  results = dict(results, summary=summarise(cfg, results))
  plots(results, workdir)
  return report_lib.write_outputs(workdir, results, report(cfg, results),
                                  config=cfg)
