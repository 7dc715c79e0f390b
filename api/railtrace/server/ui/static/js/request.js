// One request (`/requests/{id}`): flags with evidence, the KV path and the span waterfall.

import { STAGES, Unauthorized, api, bytes, flagBadge, h, maybe, secs, section, tile } from "./common.js";

// "Open in Grafana": Explore on the configured Tempo data source (settings `grafana_url`).
function grafanaLink(traceId) {
  const meta = (name) => document.querySelector(`meta[name="railtrace-grafana-${name}"]`)?.content;
  const base = meta("url");
  if (!base) return [];
  const left = { datasource: meta("datasource"), queries: [{ refId: "A", queryType: "traceql", query: traceId }] };
  return [" · ", h("a", { href: `${base}/explore?left=${encodeURIComponent(JSON.stringify(left))}`, target: "_blank", rel: "noopener" }, "Open in Grafana")];
}

export async function requestPage(main, ident) {
  let summary;
  try {
    summary = await api(`/api/v1/requests/${encodeURIComponent(ident)}`);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    main.replaceChildren(h("h1", {}, "Request"), h("p", { class: "bad", role: "alert" }, e.message));
    return;
  }
  const trace = await maybe(`/api/v1/traces/${encodeURIComponent(summary.trace_id)}`);
  const spans = trace.error ? [] : trace.spans;
  const kvSpan = spans.find((s) => s.role === "kv_transfer");
  const kv = summary.kv_transfer;
  main.replaceChildren(
    h("div", { class: "pagehead" }, h("h1", {}, "Request ", h("code", {}, summary.request_id || summary.trace_id))),
    h("div", { class: "tiles" },
      tile("TTFT", secs(summary.ttft_s), null, summary.ttft_s === null ? "bad" : ""),
      tile("end to end", secs(summary.e2e_s), null),
      tile("KV transfer", kv ? `${secs(kv.duration_s)} · ${bytes(kv.bytes)}` : "—", null),
      tile("path class", kv ? kv.path_class : "—", null, kv && /tcp|cross/.test(kv.path_class) ? "bad" : ""),
      tile("pairing level", summary.pairing_level || "—", null)),
    h("p", { class: "meta" }, `model ${summary.model || "—"} · started ${summary.start} · ${summary.span_count} spans · `,
      summary.complete ? "complete" : h("span", { class: "warn" }, "incomplete"), " · ",
      h("a", { href: `/api/v1/requests/${encodeURIComponent(summary.trace_id)}` }, "JSON"),
      ...grafanaLink(summary.trace_id)),
    flagsSection(summary),
    ...[joinsSection(summary)].filter(Boolean),
    kvPathSection(summary, kvSpan),
    waterfallSection(summary, spans, trace));
}

// Spans carrying this request's ids that the join rules left out (`coverage.rejected`: a
// sender that is not the hop it claims, a second candidate for a hop) or joined unverified.
// Notes quote sender-chosen names and ids: text nodes only.
function joinsSection(summary) {
  const cov = summary.coverage || {};
  const notes = (key) => (Array.isArray(cov[key]) ? cov[key].map(String) : []);
  const rejected = notes("rejected");
  const unverified = notes("unverified");
  if (!rejected.length && !unverified.length) return null;
  const list = (id, items) => h("ul", { class: "plain", id }, items.map((n) => h("li", { class: "evidence" }, n)));
  return section(`Joins: ${rejected.length} rejected, ${unverified.length} unverified`,
    h("p", { class: "muted" }, "Spans that carry this request's ids. Rejected ones do not count for it: their sender is not the hop they claim to be, or they contradict a verified one."),
    rejected.length ? [h("h3", {}, "Rejected"), list("rejected", rejected)] : null,
    unverified.length ? [h("h3", {}, "Joined, sender not verified"), list("unverified", unverified)] : null,
    cov.notes_dropped ? h("p", { class: "muted" }, `and ${Number(cov.notes_dropped)} more notes`) : null);
}

function flagsSection(summary) {
  const items = (summary.flags || []).map((f) =>
    h("li", { class: "evidence" }, flagBadge(f.name), " ",
      f.span_id ? h("a", { href: `#span-${f.span_id}`, class: "spanlink", onclick: () => openSpan(f.span_id) }, `span ${f.span_id}`) : "",
      h("div", {}, f.evidence || "")));
  return section(`Flags (${items.length})`, items.length ? h("ul", { class: "plain", id: "flags" }, items) : h("p", { class: "ok" }, "No flags: nothing found wrong with this request."));
}

function lanesOf(kv, kvSpan) {
  const devices = (kv && kv.devices) || [];
  const split = kvSpan && Array.isArray(kvSpan.attributes["llm_d.kv_transfer.split"]) ? kvSpan.attributes["llm_d.kv_transfer.split"] : null;
  return devices.map((d, i) => ({ device: d, share: split && split.length === devices.length ? split[i] : 1 / devices.length }));
}

function laneNic(device) {
  // UCX lane names: "rc_mlx5/mlx5_1:1" (transport/device:port) or "tcp/eth0".
  const m = /^([^/]+)\/([^:]+)/.exec(device);
  return m ? { transport: m[1], nic: m[2] } : { transport: "", nic: device };
}

function kvPathSection(summary, kvSpan) {
  const kv = summary.kv_transfer;
  if (!kv) return section("KV transfer path", h("p", { class: "muted" }, "No KV transfer was seen for this request."));
  // A transfer pulled from a P2P KV source (`kv_transfer.source`) is drawn, and was judged,
  // from that pod, not from the prefill pod.
  const p = kv.source || summary.prefill || {};
  const from = kv.source ? "KV source" : "prefill";
  const d = summary.decode || {};
  const lanes = lanesOf(kv, kvSpan);
  const sameRail = p.rail && d.rail && p.rail === d.rail;
  const hop = (title, lines, cls) => h("div", { class: `hop ${cls || ""}` }, h("div", { class: "hoptitle" }, title), lines.map((l) => h("div", {}, l)));
  const arrow = () => h("div", { class: "arrow", "aria-hidden": "true" }, "→");
  const laneBox = h("div", { class: `hop fabric ${/tcp|cross/.test(kv.path_class) ? "badpath" : ""}` },
    h("div", { class: "hoptitle" }, `${kv.transport || "?"} · ${kv.path_class}`),
    lanes.map((l) => {
      const { nic } = laneNic(l.device);
      const off = nic !== d.nic && nic !== p.nic;
      return h("div", { class: `lane ${off ? "offrail" : ""}` },
        h("span", { class: "lanebar", style: `width:${Math.max(4, Math.round(l.share * 100))}%` }),
        h("span", { class: "lanelabel" }, `${l.device} — ${Math.round(l.share * 100)}% of bytes${off ? " (not the paired NIC)" : ""}`));
    }),
    h("div", { class: "muted" }, `${bytes(kv.bytes)} in ${secs(kv.duration_s)}` + (kv.duration_s ? ` = ${(kv.bytes / kv.duration_s / 1e9).toFixed(2)} GB/s` : "")));
  const path = h("div", { class: "kvpath", id: "kv-path" },
    hop(`${from} GPU`, [p.gpu || "?", p.pod || "", p.node || ""], "gpu"), arrow(),
    hop(`${from} NIC`, [p.nic || "?", p.rail ? `rail ${p.rail}` : "rail ?"], "nic"), arrow(),
    laneBox, arrow(),
    hop("decode NIC", [d.nic || "?", d.rail ? `rail ${d.rail}` : "rail ?"], "nic"), arrow(),
    hop("decode GPU", [d.gpu || "?", d.pod || "", d.node || ""], "gpu"));
  const expected = [];
  if (kv.transport === "tcp") {
    expected.push(`RDMA from ${p.nic || `the ${from} GPU's NIC`} to ${d.nic || "the decode GPU's NIC"}` +
      (sameRail ? ` on rail ${p.rail} (rdma_same_rail)` : ""));
  } else if (kv.path_class === "rdma_cross_rail") {
    const off = lanes.filter((l) => ![p.nic, d.nic].includes(laneNic(l.device).nic));
    expected.push(`every byte on the paired NICs ${p.nic || "?"} ↔ ${d.nic || "?"}` + (p.rail ? ` (rail ${p.rail})` : "") +
      (off.length ? `; ${off.map((l) => `${l.device} carried ${Math.round(l.share * 100)}%`).join(", ")} instead` : ""));
  }
  return section("KV transfer path",
    kv.source ? h("p", { id: "kv-source" }, `Pulled from the P2P KV source ${kv.source.pod || "?"}, not from the prefill pod: judged between it and decode.`) : null,
    path,
    expected.length ? h("p", { class: "expected" }, h("strong", {}, "Expected instead: "), expected) : h("p", { class: "ok" }, "The transfer took the path the topology pairs these GPUs with."),
    h("p", { class: "muted" }, kv.evidence || ""));
}

// The waterfall of the page on screen: `openSpan` (flag evidence links, `#span-<id>` URLs) selects
// a span in it.
let selectSpan = null;

export function openSpan(id) {
  if (selectSpan) selectSpan(id);
}

// Nanoseconds as the ruler and the rows say them.
function dur(ns) {
  const s = ns / 1e9;
  if (s >= 1) return `${s.toFixed(s >= 10 ? 1 : 2)} s`;
  if (s >= 1e-3) return `${(s * 1e3).toFixed(s >= 0.01 ? 1 : 2)} ms`;
  return `${(s * 1e6).toFixed(0)} µs`;
}

// Ticks at 1, 2 or 5 × 10^k ns, four to eight across the span.
function ticks(total) {
  const raw = total / 5;
  const p = 10 ** Math.floor(Math.log10(Math.max(1, raw)));
  const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = 0; v <= total * 1.0001; v += step) out.push(v);
  return out;
}

// The critical path, as Jaeger draws it: from the last span to finish, back through the child
// that finished last before each point, until the start. Stitched traces are roots side by side.
function criticalPath(roots, kids) {
  const on = new Set();
  const walk = (s, until) => {
    on.add(s);
    let cursor = Math.min(s.end_ns, until);
    for (const c of [...(kids.get(s) || [])].sort((a, b) => b.end_ns - a.end_ns)) {
      if (c.start_ns >= cursor) continue;
      walk(c, cursor);
      cursor = c.start_ns;
    }
  };
  let cursor = Infinity;
  for (const r of [...roots].sort((a, b) => b.end_ns - a.end_ns)) {
    if (r.start_ns >= cursor) continue;
    walk(r, cursor);
    cursor = r.start_ns;
  }
  return on;
}

function spanDetail(s, t0, flags, critical) {
  const row = (k, v) => h("tr", {}, h("th", {}, k), h("td", {}, v));
  const value = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  const kv = (obj) => Object.keys(obj || {}).sort().map((k) => row(h("code", {}, k), value(obj[k])));
  return [
    h("h3", {}, s.name),
    flags.length ? h("p", {}, flags.map(flagBadge)) : null,
    h("table", { class: "compact kvtable" }, h("tbody", {},
      row("duration", dur(s.end_ns - s.start_ns)),
      row("start", `+${dur(s.start_ns - t0)}`),
      row("service", s.service_name || "—"),
      row("role", s.role || "—"),
      row("status", s.status_code === 2 ? h("span", { class: "bad" }, `error ${s.status_message || ""}`) : s.status_code === 1 ? "ok" : "unset"),
      row("critical path", critical ? "yes" : "no"),
      row("span id", h("code", {}, s.span_id)),
      row("parent", s.parent_span_id ? h("code", {}, s.parent_span_id) : "—"),
      row("trace id", h("code", {}, s.trace_id)))),
    h("h4", {}, `Attributes (${Object.keys(s.attributes || {}).length})`),
    h("table", { class: "compact kvtable attrs" }, h("tbody", {}, kv(s.attributes))),
    Object.keys(s.resource || {}).length ? [h("h4", {}, "Resource"), h("table", { class: "compact kvtable" }, h("tbody", {}, kv(s.resource)))] : null,
    (s.events || []).length ? [h("h4", {}, `Events (${s.events.length})`),
      h("ul", { class: "plain" }, s.events.map((e) => h("li", { class: "evidence" },
        `+${dur((e.time_ns || e.time_unix_nano || t0) - t0)} ${e.name || ""}`,
        Object.keys(e.attributes || {}).length ? h("div", { class: "muted" }, JSON.stringify(e.attributes)) : null)))] : null,
  ];
}

function waterfallSection(summary, spans, trace) {
  selectSpan = null;
  if (trace.error) return section("Spans", h("p", { class: "bad" }, `spans unavailable: ${trace.error}`));
  if (!spans.length) return section("Spans", h("p", { class: "muted" }, "No spans stored."));
  const t0 = Math.min(...spans.map((s) => s.start_ns));
  const t1 = Math.max(...spans.map((s) => s.end_ns));
  const total = Math.max(1, t1 - t0);
  const clamp = (ns) => Math.min(t1, Math.max(t0, ns));
  const pos = (ns) => ((clamp(ns) - t0) / total) * 100;
  const x = (ns) => `${pos(ns).toFixed(3)}%`;
  // At least 0.2 % wide, never past the right edge.
  const w = (a, b) => `${Math.min(100 - pos(a), Math.max(0.2, pos(b) - pos(a))).toFixed(3)}%`;
  // Tree order: children under their parent, siblings and roots by start time.
  const byId = new Map(spans.map((s) => [`${s.trace_id}/${s.span_id}`, s]));
  const kids = new Map();
  const roots = [];
  for (const s of spans) {
    const parent = s.parent_span_id && byId.get(`${s.trace_id}/${s.parent_span_id}`);
    if (parent) (kids.get(parent) || kids.set(parent, []).get(parent)).push(s);
    else roots.push(s);
  }
  const byStart = (a, b) => a.start_ns - b.start_ns || a.end_ns - b.end_ns || a.span_id.localeCompare(b.span_id);
  const order = [];
  const walk = (s, depth) => {
    order.push([s, depth]);
    for (const c of (kids.get(s) || []).sort(byStart)) walk(c, depth + 1);
  };
  roots.sort(byStart).forEach((r) => walk(r, 0));
  const critical = criticalPath(roots, kids);
  const traceIds = [...new Set(spans.map((s) => s.trace_id))].sort();
  const flagged = new Map();
  for (const f of summary.flags || []) if (f.span_id) (flagged.get(f.span_id) || flagged.set(f.span_id, []).get(f.span_id)).push(f.name);
  // Stages of the breakdown, end to end from the request's start, clamped to the spans' time.
  const startNs = Date.parse(summary.start) * 1e6 + Number((summary.start.match(/\.\d{3}(\d*)/) || [, ""])[1].padEnd(6, "0").slice(0, 6)) * 1;
  let at = isNaN(startNs) ? t0 : Math.max(t0, startNs);
  const bands = [];
  for (const st of STAGES) {
    const d = (summary.breakdown_s || {})[st];
    if (!d) continue;
    const end = at + d * 1e9;
    if (clamp(end) > clamp(at)) bands.push([st, d, clamp(at), clamp(end)]);
    at = end;
  }
  const shades = () => bands.map(([st, d, a, b]) =>
    h("div", { class: `stage stage-${st}`, style: `left:${x(a)};width:${w(a, b)}`, title: `${st} ${secs(d)}` }));
  const legend = h("div", { class: "legend" },
    STAGES.filter((st) => (summary.breakdown_s || {})[st]).map((st) =>
      h("span", { class: "legenditem" }, h("span", { class: `swatch stage-${st}` }), `${st} ${secs(summary.breakdown_s[st])}`)),
    h("span", { class: "legenditem" }, h("span", { class: "swatch critical-swatch" }), "critical path"));
  const marks = ticks(total);
  const ruler = h("div", { class: "wrow axis" },
    h("div", { class: "wname" }, "span"),
    h("div", { class: "wtrack ruler", id: "ruler" }, shades(), marks.map((v) => {
      const p = (v / total) * 100;
      return h("span", { class: `tick ${p > 85 ? "end" : ""}`, style: `left:${p.toFixed(3)}%` }, dur(v));
    })));
  const panel = h("aside", { class: "card spanpanel", id: "span-detail", "aria-live": "polite" },
    h("p", { class: "muted" }, "Select a span to see all its attributes."));
  const collapsed = new Set();
  const rowInfo = [];
  const relayout = () => {
    let cut = Infinity;
    for (const r of rowInfo) {
      if (r.depth > cut) { r.el.hidden = true; continue; }
      cut = Infinity;
      r.el.hidden = false;
      r.el.classList.toggle("collapsed", collapsed.has(r.s));
      if (collapsed.has(r.s)) cut = r.depth;
    }
  };
  const rows = order.map(([s, depth]) => {
    const flag = flagged.get(s.span_id) || [];
    const ti = traceIds.indexOf(s.trace_id);
    const hasKids = (kids.get(s) || []).length > 0;
    const d = s.end_ns - s.start_ns;
    const p0 = pos(s.start_ns);
    const p1 = pos(s.end_ns);
    const toggle = hasKids
      ? h("button", { type: "button", class: "toggle", "aria-label": "collapse or expand", onclick: (ev) => {
        ev.stopPropagation();
        if (collapsed.has(s)) collapsed.delete(s); else collapsed.add(s);
        relayout();
      } })
      : h("span", { class: "toggle-spacer" });
    const el = h("div", {
      class: `wrow ${flag.length ? "flagged" : ""} ${s.status_code === 2 ? "error" : ""} ${critical.has(s) ? "critical" : ""}`,
      id: `span-${s.span_id}`, "data-depth": depth, tabindex: 0, role: "button",
      onclick: () => select(s), onkeydown: (ev) => { if (ev.key === "Enter") select(s); },
    },
    h("div", { class: "wname", style: `padding-left:${depth * 12}px` }, toggle,
      traceIds.length > 1 ? h("span", { class: `tchip t${ti % 6}`, title: s.trace_id }, `T${ti + 1}`) : "",
      h("span", { class: "sname", title: s.name }, s.name), " ",
      h("span", { class: "svc muted" }, s.service_name || ""),
      flag.map((n) => h("span", { class: `flag flag-${n}` }, n))),
    h("div", { class: "wtrack" }, shades(),
      h("div", { class: `wbar role-${s.role || "other"}`, style: `left:${x(s.start_ns)};width:${w(s.start_ns, s.end_ns)}`, title: `${s.name} ${dur(d)}` }),
      // The duration beside its bar: after it, inside its end when the bar is long and runs to
      // the right edge, before it otherwise.
      p1 <= 75 ? h("span", { class: "wdur", style: `left:${(p1 + 0.5).toFixed(3)}%` }, dur(d))
        : p1 - p0 > 12 ? h("span", { class: "wdur inside", style: `right:${(100 - p1 + 0.5).toFixed(3)}%` }, dur(d))
          : h("span", { class: "wdur", style: `right:${(100 - p0 + 0.5).toFixed(3)}%` }, dur(d))));
    rowInfo.push({ s, depth, el });
    return el;
  });
  const select = (s) => {
    for (const r of rowInfo) r.el.classList.toggle("target", r.s === s);
    panel.replaceChildren(...spanDetail(s, t0, flagged.get(s.span_id) || [], critical.has(s)).flat().filter(Boolean));
    // Expand the span's ancestors, so a selected span is always on screen.
    let p = byId.get(`${s.trace_id}/${s.parent_span_id}`);
    while (p) { collapsed.delete(p); p = byId.get(`${p.trace_id}/${p.parent_span_id}`); }
    relayout();
  };
  selectSpan = (id) => {
    const s = spans.find((sp) => sp.span_id === id);
    if (s) select(s);
  };
  const traces = traceIds.length > 1
    ? h("p", {}, `Stitched from ${traceIds.length} traces: `, traceIds.map((t, i) => h("span", { class: `tchip t${i % 6}` }, `T${i + 1} ${t}`)))
    : h("p", { class: "muted" }, `trace ${traceIds[0]}`);
  const tools = h("div", { class: "tabs" },
    h("button", { type: "button", class: "small", id: "collapse-all", onclick: () => { for (const r of rowInfo) if ((kids.get(r.s) || []).length) collapsed.add(r.s); relayout(); } }, "collapse all"),
    h("button", { type: "button", class: "small", id: "expand-all", onclick: () => { collapsed.clear(); relayout(); } }, "expand all"),
    h("span", { class: "muted" }, `${critical.size} spans on the critical path`));
  return section(`Spans (${spans.length}) on one time axis — ${dur(total)}`, traces, legend, tools,
    h("div", { class: "wflayout" },
      h("div", { class: "waterfall", id: "waterfall" }, ruler, rows),
      panel),
    trace.truncated ? h("p", { class: "warn" }, "Only the first spans are shown.") : "");
}
