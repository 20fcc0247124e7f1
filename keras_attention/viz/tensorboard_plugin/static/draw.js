// Colour maps, decoding the logged weights, and drawing one map on a canvas
// with max-pooling when it has more cells than pixels.

// Viridis, 9 stops (matplotlib's values); interpolated to a 256-entry table.
const VIRIDIS = [
  [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
];
// Diverging blue - white - red (ColorBrewer RdBu ends).
const DIVERGING = [[33, 102, 172], [247, 247, 247], [178, 24, 43]];

function table(stops) {
  const lut = new Uint8Array(256 * 3);
  for (let i = 0; i < 256; i++) {
    const x = (i / 255) * (stops.length - 1);
    const k = Math.min(Math.floor(x), stops.length - 2);
    const f = x - k;
    for (let c = 0; c < 3; c++) {
      lut[3 * i + c] = Math.round(stops[k][c] * (1 - f) + stops[k + 1][c] * f);
    }
  }
  return lut;
}

export const SEQUENTIAL = table(VIRIDIS);
export const DIVERGENT = table(DIVERGING);

// A colour scale: value -> 0..255 index into `lut`.
export function scale(lo, hi, lut) {
  const span = hi > lo ? hi - lo : 1;
  return {
    lo, hi, lut,
    index: (v) => Math.max(0, Math.min(255, Math.round(((v - lo) / span) * 255))),
  };
}

export function rgb(s, v) {
  const i = 3 * s.index(v);
  return `rgb(${s.lut[i]},${s.lut[i + 1]},${s.lut[i + 2]})`;
}

// The response bytes of /weights as a Float32Array.
export function decode(buffer, dtype) {
  if (dtype === "uint8") {
    const bytes = new Uint8Array(buffer);
    const out = new Float32Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) out[i] = bytes[i] / 255;
    return out;
  }
  if (typeof Float16Array !== "undefined") {
    return Float32Array.from(new Float16Array(buffer));
  }
  const halves = new Uint16Array(buffer);
  const out = new Float32Array(halves.length);
  for (let i = 0; i < halves.length; i++) out[i] = half(halves[i]);
  return out;
}

function half(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

// How a rows x cols map fits in `budget` pixels a side: `pool` positions a
// pixel (max-pooled), `cell` pixels a pooled cell, the canvas size, and
// `unit`, the pixels one position takes on screen.
export function layout(rows, cols, budget, minCell = 1, maxCell = 28) {
  const longest = Math.max(rows, cols);
  const pool = Math.max(1, Math.ceil(longest / budget));
  const cell = pool > 1 ? 1 : Math.max(minCell, Math.min(maxCell, Math.floor(budget / longest)));
  const height = Math.ceil(rows / pool) * cell;
  const width = Math.ceil(cols / pool) * cell;
  return { pool, cell, width, height, unit: cell / pool, rows, cols };
}

// Max-pools `values` (one rows x cols map, row-major at `offset`) to the
// layout's grid: a peaked weight stays visible however large the map is.
export function pooled(values, offset, fit, signed = false) {
  const { rows, cols, pool } = fit;
  const pr = Math.ceil(rows / pool);
  const pc = Math.ceil(cols / pool);
  const out = new Float32Array(pr * pc);
  if (pool === 1) {
    out.set(values.subarray(offset, offset + rows * cols));
    return out;
  }
  out.fill(signed ? 0 : -Infinity);
  for (let r = 0; r < rows; r++) {
    const base = offset + r * cols;
    const orow = Math.floor(r / pool) * pc;
    for (let c = 0; c < cols; c++) {
      const v = values[base + c];
      const o = orow + Math.floor(c / pool);
      // Signed maps (differences) keep the value of largest magnitude.
      if (signed ? Math.abs(v) > Math.abs(out[o]) : v > out[o]) out[o] = v;
    }
  }
  return out;
}

// Draws a pooled grid on `canvas` with colour scale `s`, then outlines the
// target cells (in positions).
export function paint(canvas, grid, fit, s, cells = []) {
  const pr = Math.ceil(fit.rows / fit.pool);
  const pc = Math.ceil(fit.cols / fit.pool);
  const image = new ImageData(pc, pr);
  for (let i = 0; i < grid.length; i++) {
    const k = 3 * s.index(grid[i]);
    image.data[4 * i] = s.lut[k];
    image.data[4 * i + 1] = s.lut[k + 1];
    image.data[4 * i + 2] = s.lut[k + 2];
    image.data[4 * i + 3] = 255;
  }
  const small = new OffscreenCanvas(pc, pr);
  small.getContext("2d").putImageData(image, 0, 0);
  canvas.width = fit.width;
  canvas.height = fit.height;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(small, 0, 0, fit.width, fit.height);
  outline(ctx, fit, cells);
}

function outline(ctx, fit, cells) {
  const size = Math.max(fit.unit, 5);
  for (const [row, col] of cells) {
    const x = (col + 0.5) * fit.unit - size / 2;
    const y = (row + 0.5) * fit.unit - size / 2;
    ctx.lineWidth = 2;
    ctx.strokeStyle = "#ff2d55";
    ctx.strokeRect(x + 1, y + 1, size - 2, size - 2);
  }
}

// A vertical colour bar with three ticks.
export function colorbar(canvas, s, height, signed = false) {
  canvas.width = 12;
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  for (let y = 0; y < height; y++) {
    const v = s.hi - ((s.hi - s.lo) * y) / Math.max(height - 1, 1);
    ctx.fillStyle = rgb(s, v);
    ctx.fillRect(0, y, 12, 1);
  }
  const mid = signed ? 0 : (s.lo + s.hi) / 2;
  return [s.hi, mid, s.lo];
}
