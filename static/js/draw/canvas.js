// Canvas set-up shared by the drawings: a backing store at the device's pixel ratio, sized to
// the element, and a context that draws in CSS pixels.

export function fit(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth;
  const h = canvas.clientHeight;
  if (resized(canvas)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

/** Whether the element's size differs from the backing store's last fit: a ResizeObserver's
 * callback redraws only then (it also fires when a drawing itself set the size it just drew at). */
export function resized(canvas) {
  const dpr = window.devicePixelRatio || 1;
  return canvas.width !== Math.round(canvas.clientWidth * dpr) || canvas.height !== Math.round(canvas.clientHeight * dpr);
}

/** Counts a drawing that had data, on the element (`data-draws`, read by the tests). */
export function counted(canvas) {
  canvas.dataset.draws = String(Number(canvas.dataset.draws || 0) + 1);
}
