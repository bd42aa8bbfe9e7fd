"""The benchmark's tables, from its results dict alone."""

from __future__ import annotations


def table(results) -> str:
  lines = ["| checkpoint | loader | size MB | load s | peak RSS - base MB "
           "| peak / size |", "|---|---|---|---|---|---|"]
  for name, loads in results["load"].items():
    for loader, r in loads.items():
      lines.append(f"| {name} | {loader} | {r['checkpoint_mb']:.0f} | "
                   f"{r['seconds']:.2f} | {r['peak_mb'] - r['base_mb']:.0f} "
                   f"| {r['peak_over_size']:.2f} |")
  s = results["speed"]
  lines += ["", f"MiniLM, batch {results['batch']} x {results['length']} "
            "tokens, seconds: median / minimum (minimum over torch's, 2 "
            "threads):", "", "| path | forward | loss + grad |",
            "|---|---|---|"]
  for path, r in s.items():
    cells = [f"{r[k][0]:.4f} / {r[k][1]:.4f} "
             f"({r[k][1] / s['torch'][k][1]:.2f}x)"
             for k in ("forward", "loss_grad")]
    lines.append(f"| {path} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines) + "\n"
