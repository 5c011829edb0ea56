// The run page: one row per rank (peaks as bars to one scale, the verdict, what fills memory),
// sortable, each opening its rank's page; the ranks' curves overlaid, or small multiples.

import { bytes } from "./data/format.js";
import { curveAt, decodeCurves, rankColor, sortRanks, stepsOfAxis } from "./data/curves.js";
import { categoryColor } from "./data/colors.js";
import { drawCurves } from "./draw/curves.js";

const main = document.getElementById("run");
const id = main.dataset.id;
const body = document.getElementById("ranks");
const summary = document.getElementById("run-summary");
const canvas = document.getElementById("curves");
let run = null;
let curves = null;
let curvesFor = "";
let curvesSteps = null;

const words = { fragmentation: "OOM: fragmentation", capacity: "OOM: capacity", no_oom: "no OOM" };
// The headline already says "ran out of memory": only the kind.
const kinds = { fragmentation: "fragmentation", capacity: "capacity" };

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function bar(value, max, cls) {
  const b = document.createElement("div");
  b.className = `bar ${cls}`;
  b.style.width = `${max > 0 && value != null ? (100 * value) / max : 0}%`;
  return b;
}

/** What fills memory when it mattered: a stacked bar of the categories, and the largest named. */
function fills(r) {
  const td = cell("", "fills");
  const entries = Object.entries(r.categories || {});
  const total = entries.reduce((s, [, v]) => s + v, 0);
  if (total > 0) {
    const stack = document.createElement("div");
    stack.className = "stack";
    for (const [name, v] of entries) {
      const part = document.createElement("span");
      part.style.width = `${(100 * v) / total}%`;
      part.style.background = categoryColor(name);
      part.title = `${name.replace("_", " ")}: ${bytes(v)}`;
      stack.append(part);
    }
    td.append(stack);
  }
  const label = document.createElement("div");
  label.className = "hint";
  label.textContent = r.largest_category ? `mostly ${r.largest_category.replace("_", " ")}` : "";
  td.append(label);
  return td;
}

function renderSummary() {
  const s = run.summary;
  const parts = [`${s.ranks} ranks, ${s.ready} analysed.`];
  if (s.oom_ranks.length) parts.push(`Out of memory: rank ${s.oom_ranks.join(", rank ")}.`);
  else if (s.ready) parts.push("No rank ran out of memory.");
  if (s.imbalance != null) {
    parts.push(`Peak reserved from ${bytes(s.peak_reserved_bytes.min)} to ${bytes(s.peak_reserved_bytes.max)}`
      + ` (rank ${s.peak_reserved_bytes.rank_of_max}; ${s.imbalance.toFixed(2)}x the lowest).`);
  }
  const first = run.ranks.find((r) => r.oom);
  const p = document.createElement("p");
  p.textContent = parts.join(" ");
  const h = document.createElement("h2");
  h.textContent = first ? `Rank ${first.rank} ran out of memory: ${kinds[first.verdict] || first.verdict}` : "No OOM";
  summary.className = `verdict ${s.oom_ranks.length ? "bad" : ""}`;
  summary.replaceChildren(h, p);
  if (first) {
    const a = document.createElement("a");
    a.href = first.page_url;
    a.textContent = `Open rank ${first.rank}'s diagnosis`;
    summary.append(a);
  }
  renderWhy(s.divergence);
}

/** Why this rank: what it held more than the median rank, by category and call site. */
function renderWhy(d) {
  const box = document.getElementById("why");
  box.hidden = !d;
  if (!d) return;
  const h = document.createElement("h2");
  h.textContent = `Why rank ${d.rank}`;
  const p = document.createElement("p");
  p.textContent = d.sentence;
  const table = document.createElement("table");
  table.className = "why";
  const head = document.createElement("tr");
  for (const t of ["", `rank ${d.rank}`, `median (rank ${d.median_rank})`, "more"]) {
    const th = document.createElement("th");
    th.textContent = t;
    head.append(th);
  }
  const rows = [
    ...d.categories.filter((c) => c.delta > 0).slice(0, 3).map((c) => [c.category.replace("_", " "), c, ""]),
    ...d.call_sites.slice(0, 3).map((c) => [c.call_site, c, "site"]),
  ].map(([name, c, cls]) => {
    const tr = document.createElement("tr");
    tr.append(cell(name, cls), cell(bytes(c.rank_bytes), "num"), cell(bytes(c.median_bytes), "num"), cell(`+${bytes(c.delta)}`, "num"));
    return tr;
  });
  table.append(head, ...rows);
  const a = document.createElement("a");
  a.href = d.compare_url;
  a.textContent = `Compare rank ${d.rank} with the median rank`;
  box.replaceChildren(h, p, table, a);
}

function renderRows() {
  const by = document.querySelector("input[name=sort]:checked").value;
  const max = Math.max(0, ...run.ranks.map((r) => r.peak_reserved_bytes || 0));
  const rows = sortRanks(run.ranks, by).map((r) => {
    const tr = document.createElement("tr");
    tr.className = `rank${r.oom ? " oom" : ""}`;
    tr.dataset.rank = r.rank;
    tr.addEventListener("click", (ev) => {
      if (ev.target.tagName !== "A") location.href = r.page_url;
    });
    const link = document.createElement("a");
    link.href = r.page_url;
    link.textContent = r.name;
    const name = cell("");
    name.append(link);
    const bars = cell("", "barcol");
    bars.append(bar(r.peak_reserved_bytes, max, "reserved"), bar(r.peak_allocated_bytes, max, "allocated"));
    const figures = document.createElement("div");
    figures.className = "hint";
    figures.textContent = r.peak_reserved_bytes == null ? r.status
      : `${bytes(r.peak_reserved_bytes)} reserved, ${bytes(r.peak_allocated_bytes)} allocated`;
    bars.append(figures);
    const verdict = r.status === "ready" ? (words[r.verdict] || r.verdict) : (r.error || r.status);
    tr.append(cell(String(r.rank)), name, bars, cell(verdict, `verdict-${(r.verdict || r.status).replace("_", "-")}`),
      fills(r), cell(r.pinned_free_bytes == null ? "" : bytes(r.pinned_free_bytes)));
    return tr;
  });
  body.replaceChildren(...rows);
}

/** Uploads that named a rank already held: listed with a link, never counted. */
function renderLater() {
  const later = document.getElementById("later");
  const items = run.later_uploads || [];
  later.hidden = !items.length;
  if (!items.length) return;
  const parts = [document.createTextNode("Uploaded again for a rank already here, not counted (the first upload of a rank keeps it until deleted): ")];
  items.forEach((r, i) => {
    if (i) parts.push(document.createTextNode(", "));
    const a = document.createElement("a");
    a.href = r.page_url;
    a.textContent = `rank ${r.rank}: ${r.name}`;
    parts.push(a);
  });
  later.replaceChildren(...parts);
}

async function drawAll() {
  const ready = run.ranks.filter((r) => r.status === "ready");
  if (!ready.length) return;
  const key = ready.map((r) => r.snapshot_id).join(",");
  if (key !== curvesFor) {
    const ids = run.ranks.map((r) => r.snapshot_id).join(",");
    // By step where every rank has steps: a rank that died in step 4 ends there.
    const res = await fetch(`/api/v1/curves?ids=${ids}&points=300&x=step`);
    if (!res.ok) return;
    curvesSteps = stepsOfAxis(res.headers.get("x-fragscope-axis"));
    curves = decodeCurves(await res.arrayBuffer());
    curvesFor = key;
    main.dataset.axis = curvesSteps ? `steps=${curvesSteps}` : "share";
    document.getElementById("curves-hint").textContent = (curvesSteps
      ? "x: steps, the same step of every rank above each other; a rank that stopped sooner ends there"
      : "x: the share of each rank's events gone by") + "; OOM ranks in red; hover a curve for its rank.";
  }
  const style = (i) => rankColor(i, run.ranks[i].oom);
  curvesLayout = drawCurves(canvas, curves, style, (i) => `rank ${run.ranks[i].rank}`, false, curvesSteps);
  // Overlaid curves get a legend naming each rank (small multiples carry their own labels).
  const legend = document.getElementById("curves-legend");
  legend.replaceChildren(
    ...(curvesLayout.overlay ? run.ranks : []).map((r, i) => {
      const item = document.createElement("span");
      const key = document.createElement("i");
      key.style.background = style(i);
      item.append(key, `rank ${r.rank}${r.oom ? " (OOM)" : ""}`);
      return item;
    }),
  );
}

// Hover names the rank under the pointer and its reserved bytes there.
let curvesLayout = null;
canvas.addEventListener("mousemove", (ev) => {
  if (!curves || !curvesLayout) return;
  const box = canvas.getBoundingClientRect();
  const hit = curveAt(curves, curvesLayout, box.width, box.height, ev.clientX - box.left, ev.clientY - box.top);
  const r = hit && run.ranks[hit.index];
  canvas.title = r ? `rank ${r.rank}${r.oom ? " (OOM)" : ""}: ${hit.value == null ? "not analysed" : bytes(hit.value) + " reserved"}` : "";
});

async function refresh() {
  const res = await fetch(`/api/v1/runs/${id}`);
  if (!res.ok) {
    summary.textContent = `The run could not be loaded (${res.status}).`;
    return;
  }
  run = await res.json();
  renderSummary();
  renderRows();
  renderLater();
  await drawAll();
  main.dataset.ready = String(run.summary.ready === run.summary.ranks);
  if (run.summary.ready < run.summary.ranks && !run.ranks.some((r) => r.status === "failed")) setTimeout(refresh, 1000);
}

document.querySelectorAll("input[name=sort]").forEach((el) => el.addEventListener("change", renderRows));
let resize = 0;
window.addEventListener("resize", () => {
  cancelAnimationFrame(resize);
  resize = requestAnimationFrame(() => curves && drawAll());
});
refresh();
