// The attention explorer: linked views of one model's heads, in plain JS.
//
// Reads the JSON in <script id="data"> (written by mha_jax/explorer.py):
// per kind of attention, the token labels of both sides, the weights
// [L, H, Tq, Tk] as base64 little-endian float32, and the score table.
// State is one selection (kind, layer, head, query); every view redraws
// from it, so the grid, the heatmap, the text view and the table agree.
//
// The notebook views (mha_jax/interp/show.py) write the same page with
// only some of it: kinds (show.heads, maybe without a table and with a
// window of positions: q0, k0 and a note), "token_values" (show.tokens)
// or "head_values" (show.heads_bar); sections with no data stay hidden.
// Either page may carry "sae" (explorer_sae.sae_panel): an SAE's
// features, shown in their own panel, whose head names select the head.
// With "sae.head_features", the selected head of the SAE's layer lists
// the features it writes most (the notebook view, having no heads to
// select, lists every head's), each a button that opens its feature.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("data").textContent);
  const state = {kind: 0, layer: 0, head: 0, query: 0, sort: null,
                 feature: 0, context: 0};
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else if (k === "cls") e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children || []) e.appendChild(c);
    return e;
  }

  // Exact float32 values (base64 little-endian), decoded once.
  function floats(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }
  for (const k of DATA.kinds) k.w = floats(k.weights);
  const kind = () => DATA.kinds[state.kind];
  const weight = (k, l, h, q, j) =>
    k.w[((l * k.num_heads + h) * k.tq + q) * k.tk + j];
  const fmt = (x, digits) => (x === null || x === undefined ||
                              Number.isNaN(x)) ? "\u2013" : x.toFixed(digits);
  // TransformerLens-style names, 0-based as the API counts (blocks.0).
  // The table's rows and the bars carry their names from Python (tested
  // there); the grid and heatmap, drawn from the weights, name them here,
  // as do pages written before rows had names (scripts/refresh_pages.py
  // re-wraps their data in this script).
  const headName = (l, h) => `L${l}H${h}`;

  // A fixed scale 0..1 for every head, so thumbnails compare at a glance.
  const STOPS = [[247, 251, 255], [198, 219, 239], [107, 174, 214],
                 [33, 113, 181], [8, 48, 107]];
  function color(w) {
    const x = Math.min(Math.max(w, 0), 1) * (STOPS.length - 1);
    const i = Math.min(Math.floor(x), STOPS.length - 2);
    const f = x - i;
    return STOPS[i].map((a, c) => Math.round(a + f * (STOPS[i + 1][c] - a)));
  }
  // One hue per head in the text view (Tableau 10).
  const HUES = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

  function drawPattern(canvas, k, l, h) {
    canvas.width = k.tk;
    canvas.height = k.tq;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(k.tk, k.tq);
    for (let q = 0; q < k.tq; q++) {
      for (let j = 0; j < k.tk; j++) {
        const [r, g, b] = color(weight(k, l, h, q, j));
        const p = 4 * (q * k.tk + j);
        img.data[p] = r; img.data[p + 1] = g; img.data[p + 2] = b;
        img.data[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  // ------------------------------------------------------------ header
  function buildHeader() {
    for (const [name, value] of DATA.info) {
      $("info").appendChild(el("div", {}, [el("dt", {text: name}),
                                           el("dd", {text: value})]));
    }
    if (DATA.kinds.length < 2) return;
    DATA.kinds.forEach((k, i) => {
      const b = el("button", {text: k.title, "data-kind": i});
      b.addEventListener("click", () => selectKind(i));
      $("kinds").appendChild(b);
    });
  }

  // -------------------------------------------------------------- grid
  function buildGrid() {
    const k = kind();
    const grid = $("grid");
    grid.replaceChildren();
    for (let l = 0; l < k.num_layers; l++) {
      const row = el("div", {cls: "grid-row"},
                     [el("span", {cls: "layer-label", text: `L${l}`})]);
      for (let h = 0; h < k.num_heads; h++) {
        const canvas = el("canvas");
        drawPattern(canvas, k, l, h);
        const b = el("button", {cls: "thumb", "data-layer": l, "data-head": h,
                                title: headName(l, h)},
                     [canvas, el("span", {text: `H${h}`})]);
        b.addEventListener("click", () => selectHead(l, h));
        row.appendChild(b);
      }
      grid.appendChild(row);
    }
  }

  // ----------------------------------------------------------- heatmap
  function cellSize(k) {
    return Math.max(8, Math.min(22, Math.floor(460 / Math.max(k.tq, k.tk))));
  }

  function buildHeatmapLabels() {
    const k = kind();
    const cell = cellSize(k);
    const font = `${Math.max(7, Math.min(12, cell - 3))}px`;
    const make = (labels, box, sizeProp) => {
      box.replaceChildren();
      labels.forEach((text, i) => {
        const d = el("div", {text, title: `${i}: ${text}`, "data-index": i});
        d.style[sizeProp] = `${cell}px`;
        d.style.lineHeight = `${cell}px`;
        d.style.fontSize = font;
        box.appendChild(d);
      });
    };
    make(k.key_labels, $("key-labels"), "width");
    make(k.query_labels, $("query-labels"), "height");
    const canvas = $("heatmap");
    canvas.style.width = `${k.tk * cell}px`;
    canvas.style.height = `${k.tq * cell}px`;
    // A window of a long pattern says which positions it holds.
    $("window-note").hidden = !k.note;
    $("window-note").textContent = k.note || "";
  }

  function drawHeatmap() {
    const k = kind();
    drawPattern($("heatmap"), k, state.layer, state.head);
    $("heatmap").dataset.layer = state.layer;
    $("heatmap").dataset.head = state.head;
    $("heatmap-title").textContent =
        `Layer ${state.layer}, head ${state.head}: ${k.title}`;
    const cell = cellSize(k);
    const marker = $("row-marker");
    marker.hidden = false;
    marker.style.top = `${state.query * cell}px`;
    marker.style.height = `${cell + 2}px`;
    marker.style.width = `${k.tk * cell + 2}px`;
    for (const d of $("query-labels").children) {
      d.classList.toggle("picked", Number(d.dataset.index) === state.query);
    }
  }

  // The cell under a pointer event, from where the canvas is drawn.
  function cellAt(event) {
    const k = kind();
    const r = $("heatmap").getBoundingClientRect();
    const q = Math.floor((event.clientY - r.top) / r.height * k.tq);
    const j = Math.floor((event.clientX - r.left) / r.width * k.tk);
    return (q >= 0 && q < k.tq && j >= 0 && j < k.tk) ? [q, j] : null;
  }

  function showValue(q, j) {
    const k = kind();
    const w = weight(k, state.layer, state.head, q, j);
    const out = $("readout");
    // Positions in the whole sequence: a window starts at q0, k0.
    const qa = q + (k.q0 || 0), ja = j + (k.k0 || 0);
    out.replaceChildren(
        document.createTextNode(
            `query ${qa} \u201c${k.query_labels[q]}\u201d \u2192 key ${ja} ` +
            `\u201c${k.key_labels[j]}\u201d: `),
        el("span", {id: "readout-value", text: fmt(w, 3)}));
    out.dataset.query = qa;
    out.dataset.key = ja;
    const cell = cellSize(k);
    const m = $("cell-marker");
    m.hidden = false;
    Object.assign(m.style, {left: `${j * cell}px`, top: `${q * cell}px`,
                            width: `${cell + 2}px`, height: `${cell + 2}px`});
  }

  function bindHeatmap() {
    const canvas = $("heatmap");
    canvas.addEventListener("mousemove", (e) => {
      const c = cellAt(e);
      if (c) showValue(...c);
    });
    canvas.addEventListener("mouseleave", () => {
      $("cell-marker").hidden = true;
    });
    canvas.addEventListener("click", (e) => {
      const c = cellAt(e);
      if (c) selectQuery(c[0]);
    });
  }

  // --------------------------------------------------------- text view
  function drawHeadview() {
    const k = kind();
    const view = $("headview");
    view.replaceChildren();
    const queries = el("div", {cls: "toks", id: "query-tokens"});
    k.query_labels.forEach((text, i) => {
      const b = el("button", {cls: "tok", text, "data-index": i,
                              "aria-pressed": i === state.query,
                              title: `query ${i}`});
      b.addEventListener("click", () => selectQuery(i));
      queries.appendChild(b);
    });
    view.append(el("span", {cls: "hv-label", text: "query"}), queries);
    const sameSide = k.query_labels === k.key_labels ||
                     k.key_labels.length === k.query_labels.length &&
                     k.key_labels.every((t, i) => t === k.query_labels[i]);
    // Where the query sits among the keys (bottom-right, as the core masks).
    const qpos = state.query + k.tk - k.tq;
    for (let h = 0; h < k.num_heads; h++) {
      const label = el("button", {
          cls: "hv-label" + (h === state.head ? " current" : ""),
          text: `H${h}`, title: `show ${headName(state.layer, h)}`});
      label.addEventListener("click", () => selectHead(state.layer, h));
      const row = el("div", {cls: "toks hv-row" +
                                  (h === state.head ? " current" : ""),
                             "data-head": h});
      let top = 0;
      for (let j = 1; j < k.tk; j++) {
        if (weight(k, state.layer, h, state.query, j) >
            weight(k, state.layer, h, state.query, top)) top = j;
      }
      k.key_labels.forEach((text, j) => {
        const w = weight(k, state.layer, h, state.query, j);
        const bg = el("span", {cls: "bg"});
        bg.style.background = HUES[h % HUES.length];
        bg.style.opacity = w;
        let cls = "tok key";
        if (j === top && w > 0) cls += " top";
        if (sameSide && j === qpos) cls += " self";
        if (k.causal && j > qpos) cls += " future";
        row.appendChild(el("span", {cls, "data-index": j,
                                    "data-weight": fmt(w, 3),
                                    title: `key ${j}: ${fmt(w, 3)}`},
                           [bg, el("span", {text})]));
      });
      view.append(label, row);
    }
  }

  // ------------------------------------------------------------- table
  function buildTable() {
    const k = kind();
    const t = k.table;
    const table = $("scores");
    table.replaceChildren();
    // show.heads without scores: no table at all.
    $("table-section").hidden = t.columns.length === 0;
    if (t.hint) $("table-hint").textContent = t.hint;
    const head = el("tr", {}, [el("th", {text: "head"})]);
    t.columns.forEach((c, i) => {
      const b = el("button", {text: c.label, title: c.help});
      b.addEventListener("click", () => sortBy(i));
      const th = el("th", {"data-col": c.key, cls: c.circuit ? "circuit" : ""},
                    [b]);
      if (state.sort && state.sort.col === i) {
        th.setAttribute("aria-sort",
                        state.sort.dir > 0 ? "ascending" : "descending");
      }
      head.appendChild(th);
    });
    table.appendChild(el("thead", {}, [head]));
    const rows = t.rows.slice();
    if (state.sort) {
      const {col, dir} = state.sort;
      rows.sort((a, b) => dir * (a.values[col] - b.values[col]));
    }
    const body = el("tbody");
    for (const r of rows) {
      const tr = el("tr", {"data-layer": r.layer, "data-head": r.head},
                    [el("td", {text: r.name ?? headName(r.layer, r.head)})]);
      r.values.forEach((v, i) => tr.appendChild(
          el("td", {text: fmt(v, t.columns[i].digits)})));
      tr.addEventListener("click", () => selectHead(r.layer, r.head));
      body.appendChild(tr);
    }
    table.appendChild(body);
    const foot = el("tfoot");
    for (const f of t.floors) {
      const tr = el("tr", {}, [el("td", {text: f.name})]);
      f.values.forEach((v, i) => tr.appendChild(
          el("td", {text: fmt(v, t.columns[i].digits)})));
      foot.appendChild(tr);
    }
    table.appendChild(foot);
    markTableRow();
    const circuit = t.columns.find((c) => c.circuit);
    $("circuit-note").hidden = !circuit;
    if (circuit) {
      $("circuit-note").textContent = "Shaded columns: each head's " +
          "patching effect (share of the clean-minus-corrupted metric) " +
          circuit.help + ".";
    }
  }

  function markTableRow() {
    for (const tr of $("scores").querySelectorAll("tbody tr")) {
      tr.classList.toggle("current",
                          Number(tr.dataset.layer) === state.layer &&
                          Number(tr.dataset.head) === state.head);
    }
  }

  function sortBy(col) {
    // First click: largest first; clicking again flips the order.
    const dir = state.sort && state.sort.col === col ? -state.sort.dir : -1;
    state.sort = {col, dir};
    buildTable();
  }

  // --------------------------------------------------------- selection
  function markGrid() {
    for (const b of document.querySelectorAll(".thumb")) {
      b.setAttribute("aria-pressed",
                     Number(b.dataset.layer) === state.layer &&
                     Number(b.dataset.head) === state.head);
    }
  }

  function selectHead(l, h) {
    state.layer = l;
    state.head = h;
    markGrid();
    drawHeatmap();
    drawHeadview();
    markTableRow();
    drawHeadFeatures();
  }

  function selectQuery(q) {
    state.query = q;
    drawHeatmap();
    drawHeadview();
  }

  function selectKind(i) {
    state.kind = i;
    const k = kind();
    state.layer = Math.min(state.layer, k.num_layers - 1);
    state.head = Math.min(state.head, k.num_heads - 1);
    state.query = k.tq - 1;
    state.sort = null;
    for (const b of $("kinds").children) {
      b.setAttribute("aria-pressed", Number(b.dataset.kind) === i);
    }
    for (const r of document.querySelectorAll(".raw")) {
      r.hidden = Number(r.dataset.kind) !== i;
    }
    buildGrid();
    buildHeatmapLabels();
    buildTable();
    $("cell-marker").hidden = true;
    selectHead(state.layer, state.head);
  }

  function drawColorbar() {
    const ctx = $("colorbar-canvas").getContext("2d");
    const img = ctx.createImageData(256, 1);
    for (let x = 0; x < 256; x++) {
      const [r, g, b] = color(x / 255);
      img.data.set([r, g, b, 255], 4 * x);
    }
    ctx.putImageData(img, 0, 0);
  }

  // ------------------------------------------- notebook-only views
  // Values with both signs (or all below 0) on a diverging scale centred
  // on 0; non-negative values on the heatmap's scale from 0 to their max.
  function scaleOf(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const signed = lo < 0;
    const top = signed ? Math.max(-lo, hi) : hi;
    return {lo, hi, signed, top: top > 0 ? top : 1};
  }
  const RED = [178, 24, 43], BLUE = [33, 102, 172];
  function valueColor(v, s) {
    if (!s.signed) return color(v / s.top);
    const x = Math.min(Math.abs(v) / s.top, 1);
    const end = v < 0 ? RED : BLUE;
    return end.map((c) => Math.round(255 + x * (c - 255)));
  }
  const css = ([r, g, b]) => `rgb(${r}, ${g}, ${b})`;
  // Dark text on light shades, white on dark ones.
  const ink = ([r, g, b]) => (0.3 * r + 0.59 * g + 0.11 * b < 140 ?
                              "white" : "black");

  function drawScale(box, s) {
    const canvas = el("canvas", {width: 256, height: 1});
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(256, 1);
    for (let x = 0; x < 256; x++) {
      const v = s.signed ? (x / 255 * 2 - 1) * s.top : x / 255 * s.top;
      img.data.set([...valueColor(v, s), 255], 4 * x);
    }
    ctx.putImageData(img, 0, 0);
    box.replaceChildren(
        el("span", {text: fmt(s.signed ? -s.top : 0, 3)}), canvas,
        el("span", {text: fmt(s.top, 3)}));
  }

  // The one element of `box` under the pointer is outlined.
  function pick(box, elem) {
    for (const o of box.querySelectorAll(".picked")) {
      o.classList.remove("picked");
    }
    elem.classList.add("picked");
  }

  function readout(box, text, value) {
    box.replaceChildren(document.createTextNode(text),
                        el("span", {cls: "value", text: fmt(value, 3)}));
  }

  function buildTokenValues() {
    const tv = DATA.token_values;
    const values = floats(tv.values);
    const s = scaleOf(values);
    const box = $("token-values");
    $("tokens-heading").textContent = tv.name;
    tv.labels.forEach((text, i) => {
      const c = valueColor(values[i], s);
      const t = el("span", {cls: "tok tv", text, "data-index": i,
                            "data-value": fmt(values[i], 3),
                            title: `${i}: ${fmt(values[i], 3)}`});
      t.style.background = css(c);
      t.style.color = ink(c);
      t.addEventListener("mouseenter", () => {
        pick(box, t);
        const out = $("token-readout");
        readout(out, `token ${i} \u201c${text}\u201d: `, values[i]);
        out.dataset.index = i;
      });
      box.appendChild(t);
    });
    drawScale($("token-scale"), s);
  }

  function buildHeadBars() {
    const hv = DATA.head_values;
    const values = floats(hv.values);
    const s = scaleOf(values);
    const box = $("head-bars");
    $("bars-heading").textContent = hv.name;
    // Bars grow from a zero line: the middle with signed values, else
    // the bottom. Heights are relative to the largest |value|.
    const zero = s.signed ? 0.5 : 1;
    for (let l = 0; l < hv.num_layers; l++) {
      const row = el("div", {cls: "bar-row"},
                     [el("span", {cls: "layer-label", text: `L${l}`})]);
      for (let h = 0; h < hv.num_heads; h++) {
        const v = values[l * hv.num_heads + h];
        const name = hv.names ? hv.names[l * hv.num_heads + h]
                              : headName(l, h);
        const size = Math.min(Math.abs(v) / s.top, 1) * (s.signed ? 0.5 : 1);
        const fill = el("div", {cls: "fill"});
        Object.assign(fill.style, {
            background: css(valueColor(s.signed ? v : s.top, s)),
            top: `${100 * (v < 0 ? zero : zero - size)}%`,
            height: `${100 * size}%`});
        const line = el("div", {cls: "zero"});
        line.style.top = `${100 * zero}%`;
        const bar = el("div", {cls: "bar", "data-layer": l, "data-head": h,
                               "data-value": fmt(v, 3),
                               title: `${name}: ${fmt(v, 3)}`},
                       [line, fill]);
        bar.addEventListener("mouseenter", () => {
          pick(box, bar);
          const out = $("bar-readout");
          readout(out, `${name} (layer ${l}, head ${h}): `, v);
          out.dataset.layer = l;
          out.dataset.head = h;
        });
        row.appendChild(bar);
      }
      box.appendChild(row);
    }
    const heads = el("div", {cls: "bar-heads"});
    for (let h = 0; h < hv.num_heads; h++) {
      heads.appendChild(el("span", {text: `H${h}`}));
    }
    box.appendChild(heads);
  }

  // ------------------------------------------------------ SAE features
  // The feature list, the chosen feature's decoder share by head and top
  // contexts (shaded by activation on one scale per feature), and for the
  // chosen context its top token's DFA by source token and by head.

  // The kind whose heads an SAE reads: self-attention (-1: none here).
  const selfKind = () => DATA.kinds.findIndex((k) => k.key === "self");

  function showHead(h) {
    const i = selfKind();
    if (state.kind !== i) selectKind(i);
    selectHead(DATA.sae.layer, h);
    $("heads-views").scrollIntoView({block: "nearest"});
  }

  // One row per (head, value): the name (a link to the head when the
  // page has its grid), the value, and a bar whose length is its share
  // of the largest |value| (red below 0).
  function headBars(box, rows) {
    box.replaceChildren();
    let top = 0;
    for (const r of rows) top = Math.max(top, Math.abs(r.value));
    const i = selfKind();
    const linkable = i >= 0 && DATA.sae.layer !== null &&
                     DATA.sae.layer < DATA.kinds[i].num_layers;
    for (const r of rows) {
      const name = linkable && r.head !== null && r.head <
                   DATA.kinds[i].num_heads ?
          el("button", {cls: "head-link", text: r.name,
                        title: `show ${r.name} above`}) :
          el("span", {text: r.name});
      if (name.tagName === "BUTTON") {
        name.addEventListener("click", () => showHead(r.head));
      }
      const fill = el("div", {cls: "fill" + (r.value < 0 ? " neg" : "")});
      fill.style.width = `${(top > 0 ? 100 * Math.abs(r.value) / top
                                     : 0).toFixed(1)}%`;
      box.appendChild(el("div", {cls: "hrow", "data-name": r.name,
                                 "data-value": fmt(r.value, 3)},
                         [name, el("span", {cls: "num",
                                            text: fmt(r.value, 3)}),
                          el("div", {cls: "track"}, [fill])]));
    }
  }

  // A context's tokens, each shaded by `shade(value)`; the top one
  // outlined; pointing at one reads its value.
  function saeTokens(box, c, values, what, shade) {
    box.replaceChildren();
    c.tokens.forEach((text, i) => {
      const t = el("span", {cls: "tok" + (i === c.at ? " at" : ""), text,
                            "data-index": i,
                            "data-value": fmt(values[i], 3),
                            title: `${i}: ${fmt(values[i], 3)}`});
      const [bg, fg] = shade(values[i]);
      t.style.background = bg;
      if (fg) t.style.color = fg;
      t.addEventListener("mouseenter", () => readout(
          $("sae-readout"), `token ${i} \u201c${text}\u201d, ${what}: `,
          values[i]));
      box.appendChild(t);
    });
  }

  function drawSaeContext() {
    const f = DATA.sae.features[state.feature];
    const c = f.contexts[state.context];
    for (const row of $("sae-contexts").children) {
      row.setAttribute("aria-pressed",
                       Number(row.dataset.context) === state.context);
    }
    if (!c) {
      $("sae-source").replaceChildren();
      $("sae-dfa-heads").replaceChildren();
      return;
    }
    // Signed, centred on 0: red below, blue above.
    let top = 0;
    for (const v of c.source) top = Math.max(top, Math.abs(v));
    const s = {signed: true, top: top > 0 ? top : 1};
    saeTokens($("sae-source"), c, c.source, "DFA", (v) => {
      const rgb = valueColor(v, s);
      return [css(rgb), ink(rgb)];
    });
    headBars($("sae-dfa-heads"), c.by_head);
  }

  function selectFeature(i) {
    state.feature = i;
    state.context = 0;
    const f = DATA.sae.features[i];
    for (const b of $("sae-list").children) {
      b.setAttribute("aria-pressed", Number(b.dataset.feature) === i);
    }
    markFeatureButtons();
    $("sae-title").textContent =
        `Feature ${f.id}` + (f.title ? `: ${f.title}` : "");
    headBars($("sae-heads"), f.heads);
    // One scale per feature, so that its contexts compare.
    let top = 0;
    for (const c of f.contexts) for (const v of c.acts) top = Math.max(top, v);
    const box = $("sae-contexts");
    box.replaceChildren();
    if (!f.contexts.length) {
      box.appendChild(el("p", {cls: "note", text: "No context: the " +
                               "feature never fires on the inputs searched."}));
    }
    f.contexts.forEach((c, j) => {
      const row = el("div", {cls: "ctx", "data-context": j, role: "button",
                             tabindex: 0});
      saeTokens(row, c, c.acts, "activation", (v) => [
          `rgba(255, 140, 0, ${(top > 0 ? Math.min(Math.max(v / top, 0), 1)
                                        : 0).toFixed(3)})`, null]);
      const choose = () => { state.context = j; drawSaeContext(); };
      row.addEventListener("click", choose);
      row.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          choose();
        }
      });
      box.appendChild(row);
    });
    drawSaeContext();
  }

  // ---------------------------------------- the features a head writes
  // One button per listed feature: its id and decoder share; it opens the
  // feature in the panel below, as the feature list does. Every listed
  // feature is in the panel (sae_panel refuses one that is not), and
  // `feature` is its index there.
  function featureButtons(list, row) {
    list.replaceChildren();
    for (const t of row.features) {
      const b = el("button", {"data-feature": t.feature, "data-id": t.id,
                              title: `open feature ${t.id} below`},
                   [el("b", {text: `feature ${t.id}`}), el("span", {
                       cls: "num", text: ` ${fmt(t.share, 3)}`})]);
      b.addEventListener("click", () => {
        selectFeature(t.feature);
        $("sae-feature").scrollIntoView({block: "nearest"});
      });
      list.appendChild(el("li", {}, [b]));
    }
    markFeatureButtons();
  }

  function markFeatureButtons() {
    for (const b of document.querySelectorAll(".feature-buttons button")) {
      b.setAttribute("aria-pressed",
                     Number(b.dataset.feature) === state.feature);
    }
  }

  // The head panel's list for the selected head: only heads of the
  // SAE's layer write into its z; any other head says so in one line.
  function drawHeadFeatures() {
    const box = $("head-features");
    const tops = DATA.sae && DATA.sae.head_features;
    box.hidden = !tops || state.kind !== selfKind();
    if (box.hidden) return;
    const list = $("head-features-list");
    const name = headName(state.layer, state.head);
    const row = state.layer === DATA.sae.layer ?
        tops.find((r) => r.head === state.head) : null;
    $("head-features-title").textContent =
        `SAE features ${row ? row.name : name} writes most`;
    if (state.layer !== DATA.sae.layer) {
      list.replaceChildren();
      $("head-features-note").textContent = `The SAE reads layer ` +
          `${DATA.sae.layer}'s z; this head is in layer ${state.layer}.`;
    } else if (!row) {
      list.replaceChildren();
      $("head-features-note").textContent = "None given for this head.";
    } else {
      $("head-features-note").textContent = "Decoder share: how much of " +
          "the feature's decoder direction this head's part of z holds; " +
          "largest first. Choose one to open it below.";
      featureButtons(list, row);
    }
  }

  // A notebook view has no head to select: every head's list, in a row.
  function buildHeadTops() {
    $("sae-head-tops").hidden = false;
    const box = $("sae-head-tops-rows");
    for (const row of DATA.sae.head_features) {
      const list = el("ol", {cls: "feature-buttons"});
      featureButtons(list, row);
      box.appendChild(el("div", {cls: "head-tops-row", "data-name": row.name},
                         [el("span", {text: row.name}), list]));
    }
  }

  function buildSae() {
    $("sae-section").hidden = false;
    if (DATA.sae.layer !== null) {
      $("sae-heading").textContent =
          `SAE features of layer ${DATA.sae.layer}'s z`;
    }
    if (!DATA.kinds.length) {  // a notebook view: no grid to link to
      $("sae-hint").textContent = "Features of a sparse autoencoder on " +
          "an attention layer's z. Choose a feature, then one of its top " +
          "contexts.";
    }
    if (DATA.sae.head_features && !DATA.kinds.length) buildHeadTops();
    const list = $("sae-list");
    DATA.sae.features.forEach((f, i) => {
      const b = el("button", {"data-feature": i, title: f.title},
                   [el("b", {text: `feature ${f.id}`}),
                    document.createTextNode(f.title ? ` ${f.title}` : "")]);
      b.addEventListener("click", () => selectFeature(i));
      list.appendChild(b);
    });
    if (DATA.sae.features.length) {
      selectFeature(0);
    } else {
      $("sae-feature").hidden = true;
      list.appendChild(el("p", {cls: "note", text: "No features given."}));
    }
  }

  buildHeader();
  $("title").hidden = Boolean(DATA.hide_title);
  if (DATA.kinds.length) {
    drawColorbar();
    bindHeatmap();
    selectKind(0);
  } else {
    for (const id of ["heads-views", "text-section", "table-section"]) {
      $(id).hidden = true;
    }
  }
  // The Treescope panel exists only on the explorer's pages.
  $("raw-section").hidden = !document.querySelector(".raw");
  // Treescope draws an array once its box is in view, judged by an
  // intersection ratio above 0. A panel opened at the page's end lands just
  // below the window's edge: "intersecting" at ratio 0, which it does not
  // count, and no later notice comes unless the reader scrolls away and
  // back (at the page's end, none can). So the panel opens in full view.
  $("raw-details").addEventListener("toggle", () => {
    const shown = document.querySelector(".raw:not([hidden])");
    if ($("raw-details").open && shown) {
      shown.scrollIntoView({block: "nearest"});
    }
  });
  if (DATA.token_values) {
    $("tokens-section").hidden = false;
    buildTokenValues();
  }
  if (DATA.head_values) {
    $("bars-section").hidden = false;
    buildHeadBars();
  }
  if (DATA.sae) buildSae();
  document.body.dataset.ready = "true";
})();
