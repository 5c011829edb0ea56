// The page's data requests, built in one place so that the early ones (page/early.js) and
// the page's own (snapshot.js) are the same URLs. Pure: no DOM.

import { parse } from "./fragment.js";

/** The view a fragment opens on devices `[{device, events, start}]`: its device, event,
 *  range and colouring, with the defaults filled in (the first device, its first event). */
export function firstView(hash, devices) {
  const state = parse(hash);
  const ids = devices.map((d) => d.device);
  if (state.device === null || !ids.includes(state.device)) state.device = ids[0];
  const d = devices.find((x) => x.device === state.device);
  if (d && (state.event === null || state.event >= d.events)) state.event = d.start;
  return inRange(state);
}

/** The cursor brought inside a zoomed range (to its nearest edge): a zoom never leaves the
 *  map showing an event the timeline does not. */
export function inRange(state) {
  if (state.range && state.event !== null) {
    const [start, end] = state.range;
    state.event = Math.min(Math.max(state.event, start), end - 1);
  }
  return state;
}

export const stateUrl = (api, device, event) => `${api}/devices/${device}/state?event=${event}`;

export const flameUrl = (api, device, event) => `${api}/devices/${device}/flame?event=${event}`;

export const pinnersUrl = (api, device, event) => `${api}/devices/${device}/pinners?event=${event}`;

/** The timeline over `[start, end]`, a point per pixel of a canvas `width` wide. */
export function timelineUrl(api, device, [start, end], width) {
  const points = Math.max(50, Math.min(4000, Math.round(width)));
  return `${api}/devices/${device}/timeline?start=${start}&end=${end}&points=${points}&format=bin`;
}

/** What the chart of active memory is split by for a view's colouring. */
export const activeBy = (colour) => (colour === "category" ? "category" : "site");

/** Columns of the chart of active memory, whatever the canvas's width (about two pixels each
 *  on a laptop's screen): the server makes the whole trace's chart at this resolution once a
 *  snapshot is ready (`service::loaded::PAGE_ACTIVE_POINTS`), so a first load need not walk
 *  every event for it. */
export const ACTIVE_POINTS = 500;

/** The chart of active memory over `[start, end]`, by call site or by what the blocks hold. */
export function activeUrl(api, device, [start, end], by) {
  return `${api}/devices/${device}/active?start=${start}&end=${end}&points=${ACTIVE_POINTS}&top=8&by=${by}`;
}
