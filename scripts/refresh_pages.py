"""Re-wrap written explorer pages in the current page code, keeping their data.

    .venv/bin/python scripts/refresh_pages.py docs/results/*/explorer.html

A page is `explorer.page_html(payload, title=..., raw=...)`: the template in
`mha_jax/interp/explorer_static/` around the page's JSON and its Treescope
panels. When only the template changes (a fix to the page's script or
style), the committed pages get it without rerunning the experiments that
measured them: this reads each page's title, JSON and panels back, wraps
them in the current template, and checks that the new page holds the same
title, JSON text and panels byte for byte before writing it.
"""

from __future__ import annotations

import html
import json
import pathlib
import re
import sys

from mha_jax.interp import explorer

# Where a page keeps what it shows, in every version of the template.
_PARTS = {
    "title": r"<title>(.*?)</title>",
    "data": r'<script type="application/json" id="data">(.*?)</script>',
    "raw": r'<details id="raw-details">\s*<summary>.*?</summary>\s*(.*?)'
           r"\s*</details>",
}


def read_page(text: str) -> dict:
  """`title`, `payload` and `raw` (the Treescope panels' HTML) of a page
  written by `explorer.page_html`, with `data`, its JSON as written."""
  found = {}
  for name, pattern in _PARTS.items():
    m = re.search(pattern, text, re.DOTALL)
    if m is None:
      raise ValueError(f"page: expected a page written by "
                       f"explorer.page_html, with its {name} in "
                       f"{pattern!r}; found none")
    found[name] = m.group(1)
  return {"title": html.unescape(found["title"]), "data": found["data"],
          "payload": json.loads(found["data"].replace("<\\/", "</")),
          "raw": found["raw"]}


def refresh(path: pathlib.Path) -> bool:
  """Rewrite `path` in the current template; True if it changed."""
  text = path.read_text()
  parts = read_page(text)
  again = explorer.page_html(parts["payload"], title=parts["title"],
                             raw=parts["raw"])
  # Nothing is lost: the new page holds the same title, JSON text and
  # panels, byte for byte.
  back = read_page(again)
  if any(back[k] != parts[k] for k in ("title", "data", "raw")):
    raise ValueError(f"{path}: the page written again does not hold the "
                     "same title, data and panels; left unchanged")
  if again == text:
    return False
  path.write_text(again)
  return True


def main(argv):
  if not argv:
    sys.exit(__doc__)
  for name in argv:
    changed = refresh(pathlib.Path(name))
    print(f"{name}: {'rewritten' if changed else 'already current'}")


if __name__ == "__main__":
  main(sys.argv[1:])
