// The compare page: both verdicts side by side, the settings that changed, both memory curves
// on one x axis, and the call sites and categories that changed most.

import { bytes } from "./data/format.js";
import { decodeCurves, stepsOfAxis } from "./data/curves.js";
import { drawCurves } from "./draw/curves.js";

const main = document.getElementById("compare");
const { a, b } = main.dataset;
const out = document.getElementById("devices");
const canvas = document.getElementById("overlay");
const COLORS = ["#4a7fd6", "#d6864a"];
const words = { fragmentation: "out of memory: fragmentation", capacity: "out of memory: capacity", no_oom: "no OOM" };

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text != null) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function signed(delta) {
  return `${delta < 0 ? "−" : "+"}${bytes(Math.abs(delta))}`;
}

function row(label, pair) {
  const tr = el("tr");
  tr.append(el("td", label), el("td", bytes(pair.a)), el("td", bytes(pair.b)),
    el("td", signed(pair.delta), pair.delta > 0 ? "up" : pair.delta < 0 ? "down" : ""));
  return tr;
}

function table(head, rows) {
  const t = el("table", null, "changes");
  const h = el("tr");
  head.forEach((x) => h.append(el("th", x)));
  const thead = el("thead");
  thead.append(h);
  const body = el("tbody");
  body.append(...rows);
  t.append(thead, body);
  return t;
}

function device(d) {
  const s = el("section", null, "device");
  const title = d.b_device != null ? `cuda:${d.device} vs cuda:${d.b_device}` : `cuda:${d.device}`;
  s.append(el("h2", title));
  const sides = el("div", null, "sides");
  for (const side of ["a", "b"]) {
    const v = el("div", null, `verdict ${d.oom[side] ? "bad" : ""}`);
    const tag = el("span", side, `side-${side}`);
    const h = el("h3");
    h.append(tag, ` ${words[d.verdict[side]] || d.verdict[side]}`);
    const steps = d.steps && d.steps[side] ? `, ${d.steps[side]} steps` : "";
    v.append(h, el("p", `peak reserved ${bytes(d.peak_reserved_bytes[side])}${steps}`));
    sides.append(v);
  }
  s.append(sides);
  // Runs of different lengths: said beside the totals, and their step peaks compared where
  // both ran.
  if (d.steps_note) s.append(el("p", d.steps_note[0].toUpperCase() + d.steps_note.slice(1) + ".", "hint steps-note"));
  const heading = (text) => {
    const tr = el("tr", null, "heading");
    const th = el("th", text);
    th.colSpan = 4;
    tr.append(th);
    return tr;
  };
  const shared = d.shared_steps_peak_allocated_bytes;
  const numbers = [
    heading("Totals"),
    row("peak reserved", d.peak_reserved_bytes), row("peak allocated", d.peak_allocated_bytes),
    ...(shared && d.steps_note ? [row(`highest step peak, first ${Math.min(d.steps.a, d.steps.b)} steps`, shared)] : []),
    row("final reserved", d.final_reserved_bytes), row("pinned free", d.pinned_free_bytes),
    heading("What fills memory, by category (at the OOM, else the peak)"),
    ...Object.entries(d.categories).map(([k, p]) => row(k.replace("_", " "), p)),
  ];
  s.append(table(["", "a", "b", "change"], numbers));
  const sites = d.call_sites.filter((c) => c.delta !== 0).slice(0, 10)
    .map((c) => row(c.call_site, { a: c.a_bytes, b: c.b_bytes, delta: c.delta }));
  if (sites.length) {
    s.append(el("h3", "Call sites that changed most (at each peak)"), table(["call site", "a", "b", "change"], sites));
  }
  return s;
}

function settings(st) {
  const s = el("section", null, "settings");
  s.append(el("h2", "Allocator settings"));
  if (!st.changed.length) {
    s.append(el("p", st.a || st.b ? "The same in both." : "Neither snapshot records its settings.", "hint"));
    return s;
  }
  const show = (v) => (v === undefined ? "(not set)" : JSON.stringify(v));
  const rows = st.changed.map((k) => {
    const tr = el("tr");
    tr.append(el("td", k), el("td", show((st.a || {})[k])), el("td", show((st.b || {})[k])));
    return tr;
  });
  s.append(table(["setting", "a", "b"], rows));
  return s;
}

async function load() {
  const res = await fetch(`/api/v1/compare?a=${a}&b=${b}`);
  const c = await res.json();
  if (!res.ok) {
    out.replaceChildren(el("p", c.detail || `The comparison failed (${res.status}).`, "error"));
    return;
  }
  out.replaceChildren(settings(c.settings), ...c.devices.map(device));
  // By step where both have steps: a run that died in step 2 is not stretched over one that ran 16.
  const curves = await fetch(`/api/v1/curves?ids=${a},${b}&points=400&x=step`);
  if (curves.ok) {
    const steps = stepsOfAxis(curves.headers.get("x-fragscope-axis"));
    document.getElementById("overlay-hint").textContent = steps
      ? "x: steps, the same step of both above each other; a run that stopped sooner ends there. Solid: reserved; thin: allocated."
      : "x: the share of each snapshot's events gone by (not both have steps). Solid: reserved; thin: allocated.";
    main.dataset.axis = steps ? `steps=${steps}` : "share";
    const decoded = decodeCurves(await curves.arrayBuffer());
    const draw = () => drawCurves(canvas, decoded, (i) => COLORS[i], (i) => "ab"[i], true, steps);
    draw();
    window.addEventListener("resize", () => requestAnimationFrame(draw));
  }
  main.dataset.ready = "true";
}

load();
