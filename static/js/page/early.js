// The first view's data requests, started as soon as the page's script runs, before the rest
// of it sets the page up. snapshot.js imports this module (the page's bundle evaluates it
// first, `web/bundle.rs`) and `take`s a response whose URL it asks for. Canvas widths are part
// of the URLs, so it waits for the document to be parsed and styled first; a URL that differs
// after all (the layout changed) is fetched as before.

import { firstView, stateUrl, pinnersUrl, timelineUrl, activeUrl, activeBy } from "../data/requests.js";

const started = new Map();

/** The early response for `url` if one was started (once), else a new fetch. */
export function take(url, init) {
  const early = started.get(url);
  started.delete(url);
  return early || fetch(url, init);
}

/** The page's device sections, and what each says of its device's trace. */
export function pageDevices() {
  const sections = [...document.querySelectorAll("section.device")];
  const devices = sections.map((s) => ({ device: Number(s.dataset.device), events: Number(s.dataset.events), start: Number(s.dataset.start) }));
  return { sections, devices };
}

function start() {
  const app = document.getElementById("app");
  if (!app || app.dataset.status !== "ready") return;
  const { devices } = pageDevices();
  if (!devices.length) return;
  const view = firstView(location.hash, devices);
  const events = devices.find((d) => d.device === view.device).events;
  const api = `/api/v1/snapshots/${app.dataset.id}`;
  const range = view.range || [0, events];
  const urls = [stateUrl(api, view.device, view.event), pinnersUrl(api, view.device, view.event)];
  const timeline = document.getElementById("timeline");
  if (timeline) urls.push(timelineUrl(api, view.device, range, timeline.clientWidth));
  if (document.getElementById("active")) urls.push(activeUrl(api, view.device, range, activeBy(view.colour)));
  for (const url of urls) {
    const r = fetch(url);
    r.catch(() => {});
    started.set(url, r);
  }
}

// Once parsed (readyState leaves "loading" before deferred scripts run, unlike
// DOMContentLoaded) and styled. At once when it can be: snapshot.js's own graph may be what
// runs this module, and its requests come right after.
function whenLaidOut(go) {
  const styled = () => {
    const css = document.querySelector('link[rel="stylesheet"]');
    if (!css || css.sheet) go();
    else css.addEventListener("load", go, { once: true });
  };
  if (document.readyState !== "loading") styled();
  else document.addEventListener("readystatechange", styled, { once: true });
}

whenLaidOut(start);
