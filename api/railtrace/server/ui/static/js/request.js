// One request (`/requests/{id}`): flags with evidence, the KV path and the span waterfall.

import { STAGES, Unauthorized, api, bytes, flagBadge, h, maybe, secs, section, tile } from "./common.js";

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
      h("a", { href: `/api/v1/requests/${encodeURIComponent(summary.trace_id)}` }, "JSON")),
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

export function openSpan(id) {
  const row = document.getElementById(`span-${id}`);
  if (!row) return;
  const det = row.querySelector("details");
  if (det) det.open = true;
  row.classList.add("target");
}

function waterfallSection(summary, spans, trace) {
  if (trace.error) return section("Spans", h("p", { class: "bad" }, `spans unavailable: ${trace.error}`));
  if (!spans.length) return section("Spans", h("p", { class: "muted" }, "No spans stored."));
  const t0 = Math.min(...spans.map((s) => s.start_ns));
  const t1 = Math.max(...spans.map((s) => s.end_ns));
  const span = Math.max(1, t1 - t0);
  const x = (ns) => `${(((ns - t0) / span) * 100).toFixed(3)}%`;
  const w = (a, b) => `${Math.max(0.2, ((b - a) / span) * 100).toFixed(3)}%`;
  // Depth by parent links, children after their parent, per trace.
  const byId = new Map(spans.map((s) => [`${s.trace_id}/${s.span_id}`, s]));
  const kids = new Map();
  const roots = [];
  for (const s of spans) {
    const parent = s.parent_span_id && byId.get(`${s.trace_id}/${s.parent_span_id}`);
    if (parent) (kids.get(parent) || kids.set(parent, []).get(parent)).push(s);
    else roots.push(s);
  }
  const order = [];
  const walk = (s, depth) => {
    order.push([s, depth]);
    for (const c of (kids.get(s) || []).sort((a, b) => a.start_ns - b.start_ns)) walk(c, depth + 1);
  };
  roots.sort((a, b) => a.trace_id.localeCompare(b.trace_id) || a.start_ns - b.start_ns).forEach((r) => walk(r, 0));
  const traceIds = [...new Set(spans.map((s) => s.trace_id))].sort();
  const flagged = new Map();
  for (const f of summary.flags || []) if (f.span_id) (flagged.get(f.span_id) || flagged.set(f.span_id, []).get(f.span_id)).push(f.name);
  // Stages of the breakdown, end to end from the request's start.
  const startNs = Date.parse(summary.start) * 1e6 + Number((summary.start.match(/\.\d{3}(\d*)/) || [, ""])[1].padEnd(6, "0").slice(0, 6)) * 1;
  let at = isNaN(startNs) ? t0 : Math.max(t0, startNs);
  const bands = [];
  for (const st of STAGES) {
    const dur = (summary.breakdown_s || {})[st];
    if (!dur) continue;
    const end = at + dur * 1e9;
    bands.push([st, dur, at, end]);
    at = end;
  }
  // The stages shade every row's track, so each span reads against the stage it fell in.
  const shades = () => bands.map(([st, dur, a, b]) =>
    h("div", { class: `stage stage-${st}`, style: `left:${x(a)};width:${w(a, b)}`, title: `${st} ${secs(dur)}` }));
  const legend = h("div", { class: "legend" }, STAGES.filter((st) => (summary.breakdown_s || {})[st]).map((st) =>
    h("span", { class: "legenditem" }, h("span", { class: `swatch stage-${st}` }), `${st} ${secs(summary.breakdown_s[st])}`)));
  const rows = order.map(([s, depth]) => {
    const flag = flagged.get(s.span_id);
    const ti = traceIds.indexOf(s.trace_id);
    const attrs = Object.entries(s.attributes || {}).map(([k, v]) => h("div", {}, h("code", {}, k), " = ", JSON.stringify(v)));
    return h("div", { class: `wrow ${flag ? "flagged" : ""} ${s.status_code === 2 ? "error" : ""}`, id: `span-${s.span_id}` },
      h("div", { class: "wname", style: `padding-left:${depth * 12}px` },
        h("details", {},
          h("summary", {}, traceIds.length > 1 ? h("span", { class: `tchip t${ti % 6}`, title: s.trace_id }, `T${ti + 1}`) : "",
            s.name, (flag || []).map((n) => h("span", { class: `flag flag-${n}` }, n))),
          h("div", { class: "attrs" },
            h("div", {}, `${s.service_name || "?"} · span ${s.span_id} · trace ${s.trace_id}` + (s.role ? ` · role ${s.role}` : "")),
            h("div", {}, `${secs((s.end_ns - s.start_ns) / 1e9)} from +${secs((s.start_ns - t0) / 1e9)}`), attrs))),
      h("div", { class: "wtrack" }, shades(), h("div", { class: `wbar role-${s.role || "other"}`, style: `left:${x(s.start_ns)};width:${w(s.start_ns, s.end_ns)}`, title: `${s.name} ${secs((s.end_ns - s.start_ns) / 1e9)}` })));
  });
  const traces = traceIds.length > 1
    ? h("p", {}, `Stitched from ${traceIds.length} traces: `, traceIds.map((t, i) => h("span", { class: `tchip t${i % 6}` }, `T${i + 1} ${t}`)))
    : h("p", { class: "muted" }, `trace ${traceIds[0]}`);
  return section(`Spans (${spans.length}) on one time axis — ${secs(span / 1e9)}`, traces, legend,
    h("div", { class: "waterfall", id: "waterfall" },
      h("div", { class: "wrow axis" }, h("div", { class: "wname" }, "span"), h("div", { class: "wtrack" }, shades())),
      rows),
    trace.truncated ? h("p", { class: "warn" }, "Only the first spans are shown.") : "");
}
