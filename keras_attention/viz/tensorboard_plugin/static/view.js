// The grid of heads: per head one panel per map (one in single mode; run A,
// run B and A - B in compare mode), each with its query labels down the
// side, key labels along the top, a colour bar, the target cells outlined
// and the head's statistics beside it.

import { colorbar, layout, paint, pooled } from "./draw.js";

const LABEL_PX = 12; // the height of a label line
const STATS = [
  ["entropy_normalized", "entropy (norm.)", (v) => v.toFixed(3)],
  ["max_weight", "max weight", (v) => v.toFixed(3)],
  ["saturated_fraction", "saturated", (v) => (100 * v).toFixed(1) + "%"],
  ["score_std", "score std", (v) => v.toFixed(3)],
];

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

export function format(v) {
  return Math.abs(v) >= 0.001 || v === 0 ? v.toFixed(4) : v.toExponential(2);
}

// Every `step`-th label fits one line of text.
function thinning(unit) {
  return Math.max(1, Math.ceil(LABEL_PX / unit));
}

function labelWidth(labels) {
  const longest = labels.reduce((n, s) => Math.max(n, s.length), 1);
  return Math.min(120, 7 * longest + 8);
}

function axisLabels(labels, fit, vertical) {
  const every = thinning(fit.unit);
  const box = el("div", { class: vertical ? "klabels" : "qlabels" });
  const extent = labels.length * fit.unit;
  let last = -Infinity;
  for (let i = 0; i < labels.length; i += every) {
    // Centred on its cell, kept inside the axis at the ends, never on top
    // of the previous label.
    const at = Math.max(0, Math.min(extent - LABEL_PX, (i + 0.5) * fit.unit - LABEL_PX / 2));
    if (at < last + LABEL_PX) continue;
    last = at;
    box.append(el("span", {
      class: "label",
      title: `${i}: ${labels[i]}`,
      "data-index": String(i),
      style: vertical ? `left:${at}px` : `top:${at}px`,
      textContent: labels[i],
    }));
  }
  return box;
}

function statsTable(stats, head) {
  const body = el("tbody");
  for (const [key, name, show] of STATS) {
    if (!stats || !(key in stats)) continue;
    body.append(el("tr", { "data-stat": key },
      el("th", { textContent: name }),
      el("td", { textContent: show(stats[key][head]) })));
  }
  return el("table", { class: "stats" }, body);
}

function bar(s, height, signed) {
  const canvas = el("canvas", { class: "colorbar" });
  const ticks = colorbar(canvas, s, height, signed);
  const labels = el("div", { class: "ticks", style: `height:${height}px` },
    ...ticks.map((v) => el("span", { textContent: format(v) })));
  return el("div", { class: "bar" }, canvas, labels);
}

// One map panel. `panel`: {role, title, values, head, stats, scale, signed,
// cells}; `data`: {T, S, queryLabels, keyLabels}; `fit` from layout().
function mapPanel(panel, data, fit, tip) {
  const canvas = el("canvas", {
    class: "heat",
    "data-role": panel.role,
    "data-head": String(panel.head),
    "data-rows": String(data.T),
    "data-cols": String(data.S),
    "data-unit": String(fit.unit),
    "data-pool": String(fit.pool),
  });
  const offset = panel.head * data.T * data.S;
  paint(canvas, pooled(panel.values, offset, fit, panel.signed), fit, panel.scale, panel.cells);
  const qWidth = labelWidth(data.queryLabels);
  const kHeight = labelWidth(data.keyLabels);
  const map = el("div", {
    class: "map",
    style: `grid-template-columns:${qWidth}px ${fit.width}px;` +
      `grid-template-rows:${kHeight}px ${fit.height}px`,
  },
  el("div", { class: "corner" }),
  axisLabels(data.keyLabels, fit, true),
  axisLabels(data.queryLabels, fit, false),
  canvas);
  canvas.addEventListener("mousemove", (event) => {
    const rect = canvas.getBoundingClientRect();
    const row = Math.floor((event.clientY - rect.top) / fit.unit);
    const col = Math.floor((event.clientX - rect.left) / fit.unit);
    if (row < 0 || col < 0 || row >= data.T || col >= data.S) return tip.hide();
    tip.show(event, panel, data, row, col, panel.values[offset + row * data.S + col]);
  });
  canvas.addEventListener("mouseleave", () => tip.hide());
  return el("div", { class: "panel", "data-role": panel.role, "data-head": String(panel.head) },
    el("div", { class: "ptitle", textContent: `${panel.title} · head ${panel.head}` }),
    el("div", { class: "pbody" }, map, bar(panel.scale, fit.height, panel.signed),
      statsTable(panel.stats, panel.head)));
}

// The whole grid. `data`: {T, S, H, queryLabels, keyLabels, cells, maps:
// [{role, title, values, stats, scale, signed}]}, one entry per column.
export function grid(data, budget, tip) {
  const fit = layout(data.T, data.S, budget);
  const rows = [];
  for (let head = 0; head < data.H; head++) {
    const row = el("div", { class: "headrow", "data-head": String(head) });
    for (const map of data.maps) {
      row.append(mapPanel({ ...map, head, cells: data.cells }, data, fit, tip));
    }
    rows.push(row);
  }
  return el("div", {
    class: data.maps.length > 1 ? "grid compare" : "grid",
    "data-pool": String(fit.pool),
  }, ...rows);
}

// The hover tooltip: query label, key label and weight of one cell.
export function tooltip() {
  const node = el("div", { id: "tip", class: "tip" });
  node.hidden = true;
  return {
    node,
    show(event, panel, data, row, col, value) {
      const lines = [
        `${panel.title} · head ${panel.head}`,
        `query ${row}: ${data.queryLabels[row]}`,
        `key ${col}: ${data.keyLabels[col]}`,
        panel.signed ? `difference ${format(value)}` : `weight ${format(value)}`,
      ];
      node.textContent = lines.join("\n");
      node.dataset.value = String(value);
      node.dataset.row = String(row);
      node.dataset.col = String(col);
      node.hidden = false;
      const x = Math.min(event.clientX + 14, window.innerWidth - 260);
      node.style.left = `${x}px`;
      node.style.top = `${event.clientY + 14}px`;
    },
    hide() {
      node.hidden = true;
    },
  };
}
