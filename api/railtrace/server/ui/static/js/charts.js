// Small SVG charts over time for the overview and the request list: drawn in a fixed viewBox that
// scales with its card (never wider than the window), colours by class from style.css.

import { h, svg } from "./common.js";

const W = 640;
const H = 170;
const PAD = { l: 58, r: 10, t: 12, b: 24 };
// Counts on an axis: whole numbers as they are, fractions to one decimal.
const count = (v) => (Number.isInteger(v) ? v.toLocaleString() : v.toFixed(1));

// Time of day (UTC) for an axis label; the date too when the span is over a day.
function timeLabel(ms, spanMs) {
  const iso = new Date(ms).toISOString();
  if (spanMs > 36 * 3600e3) return `${iso.slice(5, 10)} ${iso.slice(11, 16)}`;
  return spanMs && spanMs < 600e3 ? iso.slice(11, 19) : iso.slice(11, 16);
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 4, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function frame(x0, x1, yMax, yFmt, n = 4) {
  const parts = [];
  const plotW = W - PAD.l - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  for (let i = 0; i <= n; i++) {
    const y = PAD.t + plotH - (plotH * i) / n;
    parts.push(svg("line", { x1: PAD.l, x2: W - PAD.r, y1: y, y2: y, class: "gridline" }));
    parts.push(svg("text", { x: PAD.l - 4, y: y + 4, "text-anchor": "end", class: "axis" }, yFmt((yMax * i) / n)));
  }
  for (const f of [0, 0.5, 1]) {
    const x = PAD.l + plotW * f;
    parts.push(svg("text", { x, y: H - 6, "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle", class: "axis" },
      timeLabel(x0 + (x1 - x0) * f, x1 - x0)));
  }
  return parts;
}

function legend(series) {
  return h("div", { class: "legend" }, series.map((s) =>
    h("span", { class: "legenditem" }, h("span", { class: `swatch ${s.cls}` }), s.label)));
}

// Buckets ({start_ns, end_ns, ...}) as stacked bars (`stacked`) and/or lines (`lines`), each a
// {label, cls, value(bucket) -> number|null}. Bars and points carry a title with their figures.
export function timeChart(buckets, { stacked = [], lines = [], yFmt = count, id, label }) {
  if (!buckets.length) return h("p", { class: "muted" }, "no data in the window");
  const x0 = buckets[0].start_ns / 1e6;
  const x1 = buckets[buckets.length - 1].end_ns / 1e6;
  const plotW = W - PAD.l - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  const xs = (ms) => PAD.l + ((ms - x0) / Math.max(1, x1 - x0)) * plotW;
  let yMax = 0;
  for (const b of buckets) {
    yMax = Math.max(yMax, stacked.reduce((a, s) => a + (s.value(b) || 0), 0));
    for (const s of lines) yMax = Math.max(yMax, s.value(b) || 0);
  }
  yMax = niceMax(yMax);
  const ys = (v) => PAD.t + plotH - (v / yMax) * plotH;
  const marks = [];
  for (const b of buckets) {
    const a = xs(b.start_ns / 1e6);
    const w = Math.max(1, xs(b.end_ns / 1e6) - a - 1);
    let base = 0;
    for (const s of stacked) {
      const v = s.value(b) || 0;
      if (!v) continue;
      marks.push(svg("rect", { x: a, y: ys(base + v), width: w, height: ys(base) - ys(base + v), class: s.cls },
        svg("title", {}, `${timeLabel(b.start_ns / 1e6, 0)} ${s.label}: ${yFmt(v)}`)));
      base += v;
    }
  }
  for (const s of lines) {
    let d = "";
    let pen = false; // a bucket without a value breaks the line
    for (const b of buckets) {
      const v = s.value(b);
      if (v === null || v === undefined) { pen = false; continue; }
      const x = (xs(b.start_ns / 1e6) + xs(b.end_ns / 1e6)) / 2;
      d += `${pen ? "L" : "M"}${x.toFixed(1)},${ys(v).toFixed(1)}`;
      pen = true;
      marks.push(svg("circle", { cx: x.toFixed(1), cy: ys(v).toFixed(1), r: 2, class: s.cls },
        svg("title", {}, `${timeLabel(b.start_ns / 1e6, 0)} ${s.label}: ${yFmt(v)}`)));
    }
    if (d) marks.push(svg("path", { d, class: `line ${s.cls}` }));
  }
  return h("figure", { class: "chart", id },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label || "chart over time" }, frame(x0, x1, yMax, yFmt), marks),
    legend([...stacked, ...lines]));
}

// One point per request ({t_ms, y, href, cls, title}) over [x0, x1] ms: a click opens it.
export function scatter(points, { x0, x1, yFmt = count, id, label }) {
  if (!points.length) return h("p", { class: "muted" }, "no requests to plot");
  const plotW = W - PAD.l - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  if (!(x1 > x0)) { x0 -= 1000; x1 += 1000; }
  const yMax = niceMax(Math.max(...points.map((p) => p.y || 0)));
  const xs = (ms) => PAD.l + ((ms - x0) / (x1 - x0)) * plotW;
  const ys = (v) => PAD.t + plotH - (v / yMax) * plotH;
  const dots = points.map((p) => svg("a", { href: p.href, class: "point" },
    svg("circle", { cx: xs(p.t_ms).toFixed(1), cy: ys(p.y || 0).toFixed(1), r: 5, class: p.cls }, svg("title", {}, p.title))));
  return h("figure", { class: "chart", id },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label || "scatter over time" }, frame(x0, x1, yMax, yFmt), dots));
}
