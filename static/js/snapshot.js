// The snapshot page: fetches from the API, keeps the view's state in the URL fragment, and
// hands data to the drawings. Data code lives in data/, canvas code in draw/, the page's
// forms and tables in page/.

// First: the bundle evaluates modules in import order, and this one starts the first requests.
import { take, pageDevices } from "./page/early.js";
import { decodeTimeline } from "./data/columns.js";
import { format } from "./data/fragment.js";
import { bytes, eventLabel } from "./data/format.js";
import { assignSiteColors, siteKey, sitesByBytes } from "./data/colors.js";
import { SegMap } from "./draw/segmap.js";
import { pending } from "./page/pending.js";
import { bindWhatIf, bindCopy, bindDelete, bindCompare } from "./page/controls.js";
import { renderPinners } from "./page/pinners.js";
import { Timeline } from "./draw/timeline.js";
import { drawActive } from "./draw/active.js";
import { FlameView } from "./draw/flame.js";
import { firstView, inRange, stateUrl, flameUrl, pinnersUrl, timelineUrl, activeUrl, activeBy } from "./data/requests.js";

const app = document.getElementById("app");
const id = app.dataset.id;
const api = `/api/v1/snapshots/${id}`;
bindDelete(api);
bindCompare(id);

if (app.dataset.status !== "ready") pending(api);
else ready();

function ready() {
  const { sections, devices } = pageDevices();
  const state = firstView(location.hash, devices);
  const section = () => sections.find((s) => Number(s.dataset.device) === state.device);
  const events = () => Number(section().dataset.events);

  const label = document.getElementById("event-label");
  const sortSel = document.getElementById("sort");
  const pinnersBody = document.querySelector("#pinners tbody");
  const pinnersAt = document.getElementById("pinners-at");
  const map = new SegMap(document.getElementById("segmap"), document.getElementById("tooltip"), document.getElementById("details"), {
    onSelect: (address) => {
      state.sel = address;
      save();
    },
  });
  const timeline = new Timeline(document.getElementById("timeline"), {
    onCursor: (e) => setEvent(e),
    onRange: (range) => {
      state.range = range;
      const before = state.event;
      inRange(state);
      save();
      if (state.event !== before) setEvent(state.event);
      loadTimeline();
      loadActive();
    },
  });
  // Asked for at once, beside the map, timeline and chart: the timeline's marks and the
  // sites' colours need it.
  let analysis = null;
  const analysisLoaded = fetch(`${api}/analysis`)
    .then((r) => (r.ok ? r.json() : { devices: [] }))
    .catch(() => ({ devices: [] }))
    .then((a) => {
      analysis = a;
      colourSites();
      return a;
    });
  let mapRequest = null;
  const maps = new Map();
  let siteKeys = [];

  const save = () => history.replaceState(null, "", format(state));

  const colourSel = document.getElementById("colour");
  const categoryLegend = document.getElementById("category-legend");
  const setColour = (by) => {
    map.setColourBy(by);
    colourSel.value = by;
    categoryLegend.hidden = by !== "category";
  };
  setColour(state.colour || "site");
  colourSel.addEventListener("change", () => {
    state.colour = colourSel.value === "category" ? "category" : undefined;
    setColour(colourSel.value);
    save();
    loadActive();
  });
  sortSel.value = state.sort;
  map.setSort(state.sort);
  sortSel.addEventListener("change", () => {
    state.sort = sortSel.value;
    map.setSort(state.sort);
    save();
  });
  document.getElementById("reset-zoom").addEventListener("click", () => {
    map.resetView();
    map.draw();
  });
  const deviceSel = document.getElementById("device");
  if (deviceSel) {
    deviceSel.value = String(state.device);
    deviceSel.addEventListener("change", () => {
      state.device = Number(deviceSel.value);
      state.event = Number(section().dataset.start);
      state.range = null;
      state.sel = null;
      state.site = null;
      maps.clear();
      showDevice();
    });
  }
  bindWhatIf(api);
  bindCopy();

  async function setEvent(e) {
    const t0 = performance.now();
    state.event = e;
    timeline.setCursor(e);
    save();
    await loadMap();
    // How long the cursor took to redraw the map (read by the browser benchmark).
    if (state.event === e) map.canvas.dataset.drawMs = (performance.now() - t0).toFixed(1);
  }

  /** The map at the cursor: cached per event; a newer request replaces an older one. */
  async function loadMap() {
    const e = state.event;
    label.textContent = eventLabel(e, events(), null);
    let m = maps.get(e);
    if (!m) {
      if (mapRequest) mapRequest.abort();
      mapRequest = new AbortController();
      try {
        const r = await take(stateUrl(api, state.device, e), { signal: mapRequest.signal });
        if (!r.ok) return;
        m = await r.json();
      } catch {
        return;
      }
      maps.set(e, m);
      if (maps.size > 64) maps.delete(maps.keys().next().value);
    }
    if (state.event !== e) return;
    label.textContent = eventLabel(e, events(), m.event_info);
    map.setMap(m);
    if (m.totals) timeline.setAt(e, m.totals);
    loadPinners(e);
    loadFlame(e);
  }

  // The icicle follows the cursor once it rests (dragging asks for nothing): a newer event
  // cancels the request of an older one.
  const flame = new FlameView(document.getElementById("flame"), document.getElementById("flame-tooltip"));
  let flameTimer = 0;
  let flameRequest = null;
  function loadFlame(e) {
    clearTimeout(flameTimer);
    flameTimer = setTimeout(async () => {
      if (flameRequest) flameRequest.abort();
      flameRequest = new AbortController();
      try {
        const r = await fetch(flameUrl(api, state.device, e), { signal: flameRequest.signal });
        if (!r.ok || state.event !== e) return;
        const f = await r.json();
        if (state.event !== e) return;
        flame.setData(f);
        flame.canvas.dataset.event = String(e);
      } catch {
        // Aborted by a newer event.
      }
    }, 120);
  }

  async function loadPinners(e) {
    const r = await take(pinnersUrl(api, state.device, e));
    if (!r.ok || state.event !== e) return;
    const p = await r.json();
    pinnersAt.textContent = `after event ${e}: ${bytes(p.pinned.bytes)} pinned in ${p.pinned.segments} segments`;
    siteKeys = p.pinners.map((x) => siteKey(x.call_site));
    document.getElementById("pinners").hidden = p.pinners.length === 0;
    if (p.pinners.length === 0) pinnersAt.textContent = `after event ${e}: no free memory is pinned by live blocks`;
    renderPinners(pinnersBody, p.pinners, state.site, (i) => {
      state.site = state.site === i ? null : i;
      map.highlight(state.site === null ? null : siteKeys[i]);
      save();
      return state.site;
    });
    map.highlight(state.site !== null && siteKeys[state.site] !== undefined ? siteKeys[state.site] : null);
  }

  async function loadTimeline() {
    const canvas = document.getElementById("timeline");
    const [start, end] = state.range || [0, events()];
    const r = await take(timelineUrl(api, state.device, [start, end], canvas.clientWidth));
    if (!r.ok) return;
    const tl = decodeTimeline(await r.arrayBuffer());
    const dev = (analysis || (await analysisLoaded)).devices.find((d) => d.device === state.device);
    const need = dev && dev.diagnosis ? dev.diagnosis.need : null;
    timeline.setData(tl, dev ? dev.ooms : [], dev && dev.steps ? dev.steps : [], need, events(), state.event);
  }

  // The sites that hold the most get the palette's colours once the analysis names them;
  // what was drawn before is drawn again in them.
  let activeData = null;
  function colourSites() {
    const dev = analysis && analysis.devices.find((d) => d.device === state.device);
    if (!assignSiteColors(sitesByBytes(dev))) return;
    map.draw();
    if (activeData) drawActive(document.getElementById("active"), document.getElementById("active-legend"), activeData);
  }

  async function loadActive() {
    const canvas = document.getElementById("active");
    const [start, end] = state.range || [0, events()];
    const by = activeBy(state.colour);
    document.getElementById("active-by").textContent = by === "category" ? "by what it holds" : "by call site";
    const r = await take(activeUrl(api, state.device, [start, end], by));
    if (!r.ok) return;
    activeData = await r.json();
    drawActive(canvas, document.getElementById("active-legend"), activeData);
  }

  async function showDevice() {
    for (const s of sections) s.hidden = s !== section();
    colourSites();
    save();
    map.sel = state.sel;
    map.fitted = false;
    await Promise.all([loadMap(), loadTimeline(), loadActive()]);
  }

  // A fragment edited on the open page applies as a cold link does (replaceState, which the
  // page itself uses, does not fire this).
  window.addEventListener("hashchange", () => {
    const next = firstView(location.hash, devices);
    const deviceChanged = next.device !== state.device;
    Object.assign(state, next);
    if (deviceSel) deviceSel.value = String(state.device);
    sortSel.value = state.sort;
    map.setSort(state.sort);
    setColour(state.colour || "site");
    map.sel = state.sel;
    if (deviceChanged) maps.clear();
    showDevice();
  });

  (async () => {
    await showDevice();
    // Milliseconds from navigation to a drawn map and timeline (read by the benchmark).
    document.body.dataset.readyMs = performance.now().toFixed(0);
    document.body.dataset.ready = "1";
  })();
}
