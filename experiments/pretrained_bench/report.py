"""The benchmark's tables, from its results dict alone."""

from __future__ import annotations

from mha_jax.measure import report as report_lib


def table(results) -> str:
  """table.md: the run's line, the MiniLM part (when it ran), then one
  section per GGUF model."""
  parts = [run_line(results)] if "seconds" in results else []
  if results.get("load"):
    parts.append(load_table(results["load"]))
  if "speed" in results:
    parts.append(minilm_table(results))
  for r in results.get("gguf", {}).values():
    parts.append(gguf_section(r))
  return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def run_line(results) -> str:
  """When, how long, and how busy the machine was."""
  start, end = results["loadavg"]
  return (f"Run {results['date']}: "
          f"{report_lib.wall_time(results['seconds'], reused=False)} "
          f"({results['cores']} cores); load average over 1 minute "
          f"{start:.1f} at the start, {end:.1f} at the end.")


def load_table(loads) -> str:
  lines = ["| checkpoint | loader | size MB | load s | peak RSS - base MB "
           "| peak / size |", "|---|---|---|---|---|---|"]
  for name, by_loader in loads.items():
    for loader, r in by_loader.items():
      lines.append(f"| {name} | {loader} | {r['checkpoint_mb']:.0f} | "
                   f"{r['seconds']:.2f} | {r['peak_mb'] - r['base_mb']:.0f} "
                   f"| {r['peak_over_size']:.2f} |")
  return "\n".join(lines)


def minilm_table(results) -> str:
  s = results["speed"]
  lines = [f"MiniLM, batch {results['batch']} x {results['length']} "
           "tokens, seconds: median / minimum (minimum over torch's, 2 "
           "threads):", "", "| path | forward | loss + grad |",
           "|---|---|---|"]
  for path, r in s.items():
    cells = [f"{r[k][0]:.4f} / {r[k][1]:.4f} "
             f"({r[k][1] / s['torch'][k][1]:.2f}x)"
             for k in ("forward", "loss_grad")]
    lines.append(f"| {path} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)


def gguf_section(r) -> str:
  """One GGUF model: its loads, then prefill and decode against torch."""
  loads = report_lib.md_table(
      ["loader", "file MB", "float32 MB", "load s", "peak RSS - base MB",
       "peak / float32"],
      [[loader, f"{x['file_mb']:.0f}", f"{x['checkpoint_mb']:.0f}",
        f"{x['seconds']:.2f}", f"{x['peak_mb'] - x['base_mb']:.0f}",
        f"{x['peak_over_size']:.2f}"] for loader, x in r["load"].items()])
  return "\n".join([f"### {r['title']}", "", loads, "", speed_note(r["speed"]),
                    "", speed_table(r["speed"])])


def speed_note(s) -> str:
  return (f"One sequence, float32 weights, {s['repeats']} rounds after an "
          f"untimed first call. Prefill: {s['prefill']} tokens, logits at "
          f"every position, no cache. Decode: {s['new_tokens']} greedy "
          f"tokens after a {s['prompt']}-token prompt with the KV cache "
          "(tokens/s over the whole call). x torch: median over rounds of "
          "the time over torch's in the same round (at or below 1: as fast "
          f"as torch or faster). transformers' attention: "
          f"{s['attn_implementation']}. Same tokens: leading tokens equal "
          f"to those of {s['reference']}. Load average over 1 minute as the "
          f"rounds began: {min(s['loadavg']):.1f} to "
          f"{max(s['loadavg']):.1f}.")


def speed_table(s) -> str:
  torch_names = list(s["summary"]["prefill"])[::-1]  # most threads first
  n = s["new_tokens"]
  ratio_head = " / ".join(t.split()[1] for t in torch_names)
  rows = []
  for c in s["times"]["prefill"]:
    pre = [s["summary"]["prefill"][t][c] for t in torch_names]
    dec = [s["summary"]["decode"][t][c] for t in torch_names]
    rows.append([
        c, f"{pre[0]['median']:.3f} / {pre[0]['min']:.3f}",
        " / ".join(f"{x['ratio']:.2f}" for x in pre),
        f"{n / dec[0]['median']:.1f} / {n / dec[0]['min']:.1f}",
        " / ".join(f"{x['ratio']:.2f}" for x in dec),
        f"{s['first']['prefill'][c]:.1f} / {s['first']['decode'][c]:.1f}",
        f"{s['agree'][c]} / {n}"])
  return report_lib.md_table(
      ["path", "prefill s: median / min",
       f"x torch {ratio_head} threads", "decode tokens/s: median / best",
       f"x torch {ratio_head} threads", "first call s: prefill / decode",
       "same tokens"], rows)
