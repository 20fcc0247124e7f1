// The Attention dashboard (TensorBoard's ATTENTION tab). TensorBoard loads
// this ES module in an iframe whose <base> is /data/plugin/attention/ and
// calls render(); every request goes to this plugin's own routes.

import { DIVERGENT, SEQUENTIAL, decode, scale } from "./draw.js";
import { el, grid, tooltip } from "./view.js";
import { exportHtml, exportPng } from "./export.js";

const PLAY_MS = 600;
// Run names of a comparison: <arm>-dk<key_dim>-seed<seed>[/<events dir>].
const COMPARE_RUN = /^(.+)-dk(\d+)-seed(\d+)(\/.*)?$/;

const state = {
  tags: {}, run: null, runB: null, tag: null, example: 0, steps: [],
  stepIndex: 0, compare: false, fixedScale: false, playing: null,
};
const cache = new Map();
let ui = null;
let drawn = 0;

async function json(route, params) {
  const response = await fetch(`./${route}?${new URLSearchParams(params)}`);
  if (!response.ok) throw new Error(`${route}: ${(await response.json()).error}`);
  return response.json();
}

async function weights(run, tag, step, example) {
  const key = JSON.stringify([run, tag, step, example]);
  if (!cache.has(key)) {
    cache.set(key, (async () => {
      const response = await fetch(`./weights?${new URLSearchParams({ run, tag, step, example })}`);
      if (!response.ok) throw new Error(`weights: ${(await response.json()).error}`);
      return decode(await response.arrayBuffer(), response.headers.get("X-Attention-Dtype"));
    })());
    // Keep the last few hundred maps (playing back and forth re-uses them).
    if (cache.size > 256) cache.delete(cache.keys().next().value);
  }
  return cache.get(key);
}

function sorted(keys) {
  return [...keys].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
}

function options(select, values, chosen, names = (v) => v) {
  select.replaceChildren(...values.map((v) => el("option", { value: v, textContent: names(v) })));
  if (values.includes(chosen)) select.value = chosen;
  return select.value;
}

// Steps logged for the tag in run (and in run B in compare mode).
function stepsOf() {
  const a = state.tags[state.run]?.[state.tag]?.steps ?? [];
  if (!state.compare) return a;
  const b = new Set(state.tags[state.runB]?.[state.tag]?.steps ?? []);
  return a.filter((s) => b.has(s));
}

// One-click comparisons: for each d_k and seed 0, "scaled vs unscaled"
// first, then scaled against every other arm.
function presets(runs) {
  const arms = new Map();
  for (const run of runs) {
    const m = COMPARE_RUN.exec(run);
    if (m) arms.set(`${m[1]}|${m[2]}|${m[3]}|${m[4] ?? ""}`, run);
  }
  const out = [];
  for (const [key, run] of arms) {
    const [arm, dk, seed, rest] = key.split("|");
    if (arm !== "scaled" || seed !== "0") continue;
    for (const other of ["unscaled", ...new Set([...arms.keys()].map((k) => k.split("|")[0]))]) {
      const runB = arms.get(`${other}|${dk}|${seed}|${rest}`);
      if (other === "scaled" || !runB || out.some((p) => p.runB === runB)) continue;
      out.push({ name: `scaled vs ${other}, d_k ${dk}, seed ${seed}`, run, runB, dk: +dk });
    }
  }
  return out.sort((a, b) => b.dk - a.dk);
}

function controls() {
  const c = {
    run: el("select", { id: "run" }),
    runB: el("select", { id: "run-b" }),
    layer: el("select", { id: "layer" }),
    example: el("select", { id: "example" }),
    slider: el("input", { id: "step", type: "range", min: "0", max: "0", step: "1", value: "0" }),
    stepLabel: el("span", { id: "step-label" }),
    play: el("button", { id: "play", textContent: "▶ play" }),
    compare: el("input", { id: "compare", type: "checkbox" }),
    fixed: el("input", { id: "fixed-scale", type: "checkbox" }),
    png: el("button", { id: "export-png", textContent: "PNG" }),
    html: el("button", { id: "export-html", textContent: "HTML" }),
    presets: el("div", { id: "presets" }),
  };
  c.run.addEventListener("change", () => { state.run = c.run.value; refresh(); });
  c.runB.addEventListener("change", () => { state.runB = c.runB.value; refresh(); });
  c.layer.addEventListener("change", () => { state.tag = c.layer.value; refresh(); });
  c.example.addEventListener("change", () => { state.example = +c.example.value; draw(); });
  c.slider.addEventListener("input", () => { state.stepIndex = +c.slider.value; draw(); });
  c.compare.addEventListener("change", () => { state.compare = c.compare.checked; refresh(); });
  c.fixed.addEventListener("change", () => { state.fixedScale = c.fixed.checked; draw(); });
  c.play.addEventListener("click", togglePlay);
  c.png.addEventListener("click", () => exportPng(ui.view, fileName("png")));
  c.html.addEventListener("click", () => exportHtml(ui.view, fileName("html")));
  const label = (text, input) => el("label", {}, text, input);
  c.bar = el("div", { class: "controls" },
    label("run ", c.run), el("label", { class: "b" }, "run B ", c.runB),
    label("layer ", c.layer), label("example ", c.example),
    el("span", { class: "stepbox" }, c.play, c.slider, c.stepLabel),
    label("compare ", c.compare), label("scale 0–1 ", c.fixed),
    el("span", { class: "exports" }, "export ", c.png, c.html));
  return c;
}

function fileName(ext) {
  const step = state.steps[state.stepIndex];
  const runs = state.compare ? `${state.run}_vs_${state.runB}` : state.run;
  return `attention_${runs}_${state.tag}_step${step}_ex${state.example}.${ext}`
    .replace(/[^A-Za-z0-9._-]+/g, "_");
}

function togglePlay() {
  if (state.playing) {
    clearInterval(state.playing);
    state.playing = null;
    ui.controls.play.textContent = "▶ play";
    return;
  }
  if (state.stepIndex >= state.steps.length - 1) state.stepIndex = 0;
  ui.controls.play.textContent = "❚❚ pause";
  state.playing = setInterval(() => {
    if (state.stepIndex >= state.steps.length - 1) return togglePlay();
    state.stepIndex += 1;
    ui.controls.slider.value = String(state.stepIndex);
    draw();
  }, PLAY_MS);
}

// Menus from the listing; keeps the choices that still exist.
function refresh() {
  const c = ui.controls;
  const runs = sorted(Object.keys(state.tags));
  state.run = options(c.run, runs, state.run);
  state.runB = options(c.runB, runs, state.runB ?? runs[1] ?? runs[0]);
  const layers = sorted(Object.keys(state.tags[state.run] ?? {}));
  state.tag = options(c.layer, layers, state.tag, (t) => state.tags[state.run][t].layer);
  c.compare.checked = state.compare;
  ui.root.classList.toggle("comparing", state.compare);
  const previous = state.steps[state.stepIndex];
  state.steps = stepsOf();
  const kept = state.steps.indexOf(previous);
  state.stepIndex = kept >= 0 ? kept : state.steps.length - 1;
  c.slider.max = String(Math.max(state.steps.length - 1, 0));
  c.slider.value = String(state.stepIndex);
  draw();
}

function statusLine(text, error = false) {
  ui.status.textContent = text;
  ui.status.classList.toggle("error", error);
}

async function draw() {
  const ticket = ++drawn;
  const c = ui.controls;
  if (!state.steps.length) {
    ui.view.replaceChildren();
    statusLine(state.compare ? "The two runs share no logged step of this layer." :
      "No attention maps logged yet: add keras_attention.AttentionMonitor to model.fit, or train with diagnostics on (keras-attention train).");
    return;
  }
  const step = state.steps[state.stepIndex];
  c.stepLabel.textContent = `step ${step} (${state.stepIndex + 1}/${state.steps.length})`;
  const runs = state.compare ? [state.run, state.runB] : [state.run];
  try {
    const metas = await Promise.all(runs.map((run) => json("meta", { run, tag: state.tag, step })));
    const examples = metas[0].shape[0];
    state.example = Math.min(state.example, examples - 1);
    options(c.example, [...Array(examples).keys()].map(String), String(state.example));
    const values = await Promise.all(runs.map((run) => weights(run, state.tag, step, state.example)));
    if (ticket !== drawn) return; // a newer draw is under way
    show(metas, values, step);
  } catch (error) {
    if (ticket === drawn) statusLine(String(error.message ?? error), true);
  }
}

function show(metas, values, step) {
  const [, H, T, S] = metas[0].shape;
  const e = state.example;
  const stats = metas.map((m) => Object.fromEntries(
    Object.entries(m.statistics).map(([k, v]) => [k, v[e]])));
  let top = 1e-6;
  for (const v of values) for (const x of v) top = Math.max(top, x);
  if (state.fixedScale) top = 1;
  const shared = scale(0, top, SEQUENTIAL);
  const names = state.compare ? [state.run, state.runB, "A − B"] : [state.run];
  const maps = metas.map((m, i) => ({
    role: i === 0 ? "a" : "b", title: names[i], values: values[i], stats: stats[i], scale: shared,
  }));
  if (state.compare) {
    const diff = values[0].map((v, i) => v - values[1][i]);
    let d = 1e-6;
    for (const v of diff) d = Math.max(d, Math.abs(v));
    maps.push({ role: "diff", title: names[2], values: diff, scale: scale(-d, d, DIVERGENT), signed: true });
  }
  const budget = state.compare ? 300 : (H > 1 ? 360 : 520);
  const data = {
    T, S, H, maps,
    queryLabels: metas[0].query_labels[e], keyLabels: metas[0].key_labels[e],
    cells: metas[0].target_cells[e],
  };
  const view = grid(data, budget, ui.tip);
  const same = !state.compare || JSON.stringify(metas[0].query_labels[e]) === JSON.stringify(metas[1].query_labels[e]);
  const heading = `${state.compare ? `${state.run} vs ${state.runB}` : state.run} · ` +
    `${state.tags[state.run][state.tag].layer} · step ${step} · example ${e} · ${H} head(s), ${T}×${S}`;
  ui.view.replaceChildren(el("div", { id: "view-title", class: "viewtitle", textContent: heading }), view);
  statusLine(same ? "" : "The two runs' probe examples differ: their inputs are not the same.", !same);
  ui.root.dataset.step = String(step);
  ui.root.dataset.ready = String(drawn);
}

export async function render() {
  document.head.append(el("link", { rel: "stylesheet", href: "./style.css" }));
  const tip = tooltip();
  const c = controls();
  ui = {
    controls: c, tip,
    title: el("h1", { id: "title", textContent: "Attention" }),
    status: el("div", { id: "status" }),
    view: el("div", { id: "view" }),
  };
  ui.root = el("div", { id: "root" }, ui.title, c.bar, c.presets, ui.status, ui.view, tip.node);
  document.body.append(ui.root);
  statusLine("Loading…");
  try {
    state.tags = await json("tags", {});
  } catch (error) {
    return statusLine(String(error.message ?? error), true);
  }
  const runs = sorted(Object.keys(state.tags));
  c.presets.replaceChildren(...presets(runs).map((p) => {
    const button = el("button", { class: "preset", textContent: p.name });
    button.addEventListener("click", () => {
      Object.assign(state, { run: p.run, runB: p.runB, compare: true });
      refresh();
    });
    return button;
  }));
  if (!runs.length) return statusLine("No attention maps in this logdir: add keras_attention.AttentionMonitor to model.fit, or train with diagnostics on (keras-attention train).");
  refresh();
}
