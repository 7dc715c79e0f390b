// railtrace UI: plain ES module, no dependencies, no build step. Every figure comes from the
// query API (/api/v1/...) with the same bearer token as any API client (kept for the browser
// session only). Text from spans is always inserted as text, never as HTML.

const TOKEN_KEY = "railtrace.api_token";
const STAGES = ["scheduling", "prefill_queue", "prefill", "kv_transfer", "decode_queue", "decode"];
const FLAGS = [
  "tcp_fallback", "cross_rail", "gpu_nic_mismatch", "topology_blind_pairing",
  "broken_trace", "kv_transfer_failed", "slow_kv_transfer",
];
const PATH_CLASSES = ["nvlink", "shm", "rdma_same_rail", "rdma_cross_rail", "tcp", "unknown"];
const LEVELS = ["host", "nvlink", "subblock", "block", "zone", "region", "unknown"];
const PAGE_SIZE = 50;

class Unauthorized extends Error {}

// -- DOM helpers ------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const secs = (x) => (x === null || x === undefined ? "—" : x >= 1 ? `${x.toFixed(2)} s` : `${(x * 1000).toFixed(1)} ms`);
const pct = (x) => (x === null || x === undefined ? "—" : `${(x * 100).toFixed(1)}%`);
const bytes = (n) => {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
};
const short = (s, n = 12) => (s && s.length > n ? `${s.slice(0, n)}…` : s || "—");
const reqHref = (id) => `/requests/${encodeURIComponent(id)}`;

function flagBadge(name) {
  return h("a", { class: `flag flag-${name}`, href: `/requests?flag=${name}`, title: name }, name);
}

function pathBadge(pc) {
  return h("span", { class: `path path-${pc || "unknown"}` }, pc || "—");
}

function table(headers, rows, cls) {
  return h("div", { class: "scroll" },
    h("table", { class: cls || "" },
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "none")))));
}

function section(title, ...body) {
  return h("section", { class: "card" }, h("h2", {}, title), ...body);
}

// -- API --------------------------------------------------------------------------------

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const resp = await fetch(path, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  if (resp.status === 401) throw new Unauthorized();
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = new Error(body.detail ? String(body.detail) : `${resp.status} ${resp.statusText}`);
    err.status = resp.status;
    err.body = body;
    throw err;
  }
  return body;
}

// An optional part of a page: its failure is shown in its place, not over the page.
async function maybe(path) {
  try {
    return await api(path);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    return { error: e.message, status: e.status, body: e.body };
  }
}

function tokenForm(main) {
  const input = h("input", { type: "password", name: "token", autocomplete: "off", required: true, "aria-label": "API token" });
  main.replaceChildren(section("API token",
    h("p", {}, "This railtrace requires its API token (RAILTRACE_API_TOKEN) to read traces. It is kept for this browser tab only."),
    h("form", {
      class: "filters",
      onsubmit: (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        location.reload();
      },
    }, input, h("button", { type: "submit" }, "Open"))));
}

// -- Overview ---------------------------------------------------------------------------

function windowChooser(current) {
  return h("div", { class: "tabs" }, ["1h", "24h"].map((w) =>
    h("a", { href: `/?window=${w}`, class: w === current ? "active" : "" }, w === "1h" ? "last hour" : "last day")));
}

function weightedMean(groups, key) {
  let n = 0;
  let sum = 0;
  for (const g of groups) {
    if (g[key] === null || g[key] === undefined) continue;
    n += g.requests;
    sum += g[key] * g.requests;
  }
  return n ? sum / n : null;
}

async function overview(main, params) {
  const win = params.get("window") === "24h" ? "24h" : "1h";
  const since = Math.floor(Date.now() / 1000) - (win === "1h" ? 3600 : 86400);
  const [byPath, byFlag, byPair, ready, topo, quant, byCoverage] = await Promise.all([
    api(`/api/v1/stats?group_by=path_class&since=${since}`),
    api(`/api/v1/stats?group_by=flag&since=${since}`),
    api(`/api/v1/stats?group_by=pair&since=${since}`),
    fetch("/readyz").then((r) => r.json()).catch((e) => ({ status: "unreachable", problems: [String(e)] })),
    maybe("/api/v1/topology?summary=true"),
    api(`/api/v1/stats/ttft?since=${since}`),
    maybe(`/api/v1/stats?group_by=coverage&since=${since}`),
  ]);
  const sampling = byCoverage.error ? null : byCoverage.sampling || null;
  const share = sampling && typeof sampling.traced_share === "number" ? sampling.traced_share : null;
  const qOf = (key, value) => quant[key].find((g) => (g[key] || "unknown") === value) || {};
  const qCells = (g) => ["ttft_s_p50", "ttft_s_p90", "ttft_s_p99"].map((k) => h("td", { class: "num" }, secs(g[k])));
  const qNote = (q) => h("p", { class: "muted" },
    `TTFT quantiles over all ${q.rows.toLocaleString()} requests of the window, within ${Math.round((q.relative_error || 0) * 100)} %.`);
  const total = byPath.groups.reduce((a, g) => a + g.requests, 0);
  const flagged = Object.fromEntries(byFlag.groups.map((g) => [g.flag, g.requests]));
  const sinceIso = new Date(since * 1000).toISOString();
  const listHref = (extra) => `/requests?since=${encodeURIComponent(sinceIso)}${extra}`;

  const fleet = topo.error
    ? h("p", { class: "warn" }, `topology unavailable: ${topo.error}`)
    : h("p", {},
      `${topo.nodes} nodes in ${topo.blocks} blocks / ${topo.subblocks} subblocks, ${topo.pods} pods, `,
      `${topo.rails} rails`,
      topo.warnings.length || topo.discovery_gaps.length
        ? h("span", { class: "warn" }, ` — ${topo.warnings.length} warnings, ${topo.discovery_gaps.length} discovery gaps`)
        : "",
      " · ", h("a", { href: "/topology" }, "topology"));

  const tiles = h("div", { class: "tiles" },
    tile("requests", total, listHref("")),
    tile("flagged tcp_fallback", total ? pct((flagged.tcp_fallback || 0) / total) : "—", listHref("&flag=tcp_fallback")),
    tile("flagged cross_rail", total ? pct((flagged.cross_rail || 0) / total) : "—", listHref("&flag=cross_rail")),
    tile("mean TTFT", secs(weightedMean(byPath.groups, "ttft_s_mean")), null),
    tile("traced share", share === null ? "unknown" : pct(share), null, share === null ? "" : share < 1 ? "warn" : "ok"),
    tile("ingest", ready.status, null, ready.status === "ok" ? "ok" : "bad"));

  const pathRows = PATH_CLASSES.flatMap((pc) => byPath.groups.filter((g) => g.path_class === pc)).map((g) =>
    h("tr", {},
      h("td", {}, h("a", { href: listHref(`&path_class=${g.path_class}`) }, pathBadge(g.path_class))),
      h("td", { class: "num" }, g.requests),
      h("td", { class: "num" }, pct(g.requests / total)),
      qCells(qOf("path_class", g.path_class)),
      h("td", { class: "num" }, secs(g.kv_duration_s_mean))));

  const levels = {};
  for (const g of byPair.groups) (levels[g.pairing_level || "unknown"] ||= []).push(g);
  const levelRows = Object.keys(levels).sort((a, b) => LEVELS.indexOf(a) - LEVELS.indexOf(b)).map((lv) => {
    const gs = levels[lv];
    return h("tr", {},
      h("td", {}, lv),
      h("td", { class: "num" }, gs.reduce((a, g) => a + g.requests, 0)),
      qCells(qOf("pairing_level", lv)),
      h("td", { class: "num" }, secs(weightedMean(gs, "ttft_s_mean"))),
      h("td", { class: "num" }, secs(weightedMean(gs, "kv_duration_s_mean"))));
  });

  const flagRows = FLAGS.filter((f) => flagged[f]).map((f) =>
    h("tr", {},
      h("td", {}, flagBadge(f)),
      h("td", { class: "num" }, h("a", { href: listHref(`&flag=${f}`) }, flagged[f])),
      h("td", { class: "num" }, pct(flagged[f] / total))));

  const worst = [...byPair.groups].filter((g) => g.ttft_s_mean !== null)
    .sort((a, b) => b.ttft_s_mean - a.ttft_s_mean).slice(0, 8).map((g) =>
      h("tr", {},
        h("td", {}, h("a", { href: listHref(`&node=${encodeURIComponent(g.prefill_node)}`) }, g.prefill_node)),
        h("td", {}, h("a", { href: listHref(`&node=${encodeURIComponent(g.decode_node)}`) }, g.decode_node)),
        h("td", {}, g.pairing_level || "—"),
        h("td", { class: "num" }, g.requests),
        h("td", { class: "num" }, secs(g.ttft_s_mean)),
        h("td", { class: "num" }, secs(g.kv_duration_s_mean))));

  main.replaceChildren(
    h("div", { class: "pagehead" }, h("h1", {}, "Fleet"), windowChooser(win)),
    fleet,
    samplingNote(sampling, share),
    tiles,
    h("div", { class: "grid" },
      section("By path class", table(["path class", "requests", "share", "TTFT p50", "p90", "p99", "KV mean"], pathRows), qNote(quant)),
      section("By pairing level", table(["pairing level", "requests", "TTFT p50", "p90", "p99", "TTFT mean", "KV mean"], levelRows), qNote(quant)),
      section("Flags", table(["flag", "requests", "rate"], flagRows)),
      section("Ingest health", table(["", ""], [
        h("tr", {}, h("td", {}, "status"), h("td", { class: ready.status === "ok" ? "ok" : "bad" }, ready.status)),
        h("tr", {}, h("td", {}, "problems"), h("td", {}, (ready.problems || []).join("; ") || "none")),
        h("tr", {}, h("td", {}, "pending spans"), h("td", {}, ready.pending_spans ?? "—")),
        h("tr", {}, h("td", {}, "assembly"), h("td", {}, ready.assembly ?? "—")),
        h("tr", {}, h("td", {}, "topology"), h("td", {}, ready.topology ?? "—")),
      ]), h("p", { class: "muted" }, h("a", { href: "/metrics" }, "/metrics"), " has the counters over time."))),
    section("Slowest prefill → decode node pairs (mean TTFT)",
      table(["prefill node", "decode node", "level", "requests", "mean TTFT", "mean KV transfer"], worst)));
}

// How much of the traffic these counts cover (`sampling` of the coverage stats): below 1 it is
// said in words above the figures, never left out; no estimate is "unknown", never 100 %.
function samplingNote(sampling, share) {
  const est = sampling && sampling.source ? sampling.estimates[sampling.source] : null;
  const how = est
    ? ` (${est.source === "prometheus" ? `requests assembled / ${est.counter}` : "sampling thresholds in tracestate"}, ${Math.round(est.window_s / 60)} min window)`
    : "";
  if (share === null) {
    const reasons = sampling ? Object.values(sampling.estimates).map((e) => e.reason).filter(Boolean) : [];
    return h("p", { class: "muted sampling", "data-share": "unknown" },
      "Traced share of traffic: unknown", reasons.length ? ` — ${reasons.join("; ")}` : "",
      ". Counts are of the requests railtrace received traces of.");
  }
  if (share < 1) {
    return h("p", { class: "warn sampling", "data-share": String(share) },
      `Sampled: railtrace received traces of about ${pct(share)} of the requests served${how}. `,
      "Every count on this page is of traced requests only.");
  }
  return h("p", { class: "muted sampling", "data-share": String(share) }, `Every served request is traced${how}.`);
}

function tile(label, value, href, cls) {
  const v = h("div", { class: `value ${cls || ""}` }, value);
  return h("div", { class: "tile" }, h("div", { class: "label" }, label), href ? h("a", { href }, v) : v);
}

// -- Requests list ----------------------------------------------------------------------

const LIST_FILTERS = ["flag", "path_class", "node", "pod", "model", "since", "until"];
// The API's orders (`order=`), each paged by its own cursor over the whole filtered window.
const LIST_ORDERS = {
  start: { label: "newest", first: "« newest", next: "older »", note: "" },
  ttft: { label: "TTFT", first: "« slowest", next: "faster »", note: "slowest TTFT first; requests without a first token are not in this order" },
  kv_time: { label: "KV time", first: "« slowest", next: "faster »", note: "slowest KV transfer first; requests without a KV transfer are not in this order" },
};

async function requestsPage(main, params) {
  const q = new URLSearchParams();
  for (const k of [...LIST_FILTERS, "order", "cursor"]) if (params.get(k)) q.set(k, params.get(k));
  const limit = Number.parseInt(params.get("limit") || "", 10);
  q.set("limit", String(limit >= 1 && limit <= 1000 ? limit : PAGE_SIZE));
  const orderKey = Object.hasOwn(LIST_ORDERS, params.get("order") || "") ? params.get("order") : "start";
  const order = LIST_ORDERS[orderKey];
  let page;
  try {
    page = await api(`/api/v1/requests?${q}`);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    main.replaceChildren(filterForm(params), h("p", { class: "bad", role: "alert" }, `The filter was refused: ${e.message}`));
    return;
  }
  const orderLink = (key) => {
    const p = new URLSearchParams(params);
    p.delete("cursor"); // a cursor pages on only in the order that issued it
    if (key === "start") p.delete("order");
    else p.set("order", key);
    return h("a", { href: `/requests?${p}`, id: `order-${key}`, class: orderKey === key ? "active" : "" },
      LIST_ORDERS[key].label);
  };
  const rows = page.items.map((r) => {
    const kv = r.kv_transfer || {};
    return h("tr", { "data-trace": r.trace_id },
      h("td", { class: "nowrap" }, h("a", { href: reqHref(r.trace_id) }, (r.start || "").replace("T", " ").slice(0, 23))),
      h("td", {}, h("a", { href: reqHref(r.trace_id), title: r.request_id || "" }, short(r.request_id || r.trace_id, 14))),
      h("td", { class: "num" }, secs(r.ttft_s)),
      h("td", { class: "num" }, secs(kv.duration_s)),
      h("td", {}, pathBadge(kv.path_class)),
      h("td", { class: "nodes" }, h("span", { title: (r.prefill || {}).node || "" }, (r.prefill || {}).pod || "—"), " → ",
        h("span", { title: (r.decode || {}).node || "" }, (r.decode || {}).pod || "—")),
      h("td", {}, h("span", { class: "flags" }, (r.flags || []).map((f) => flagBadge(f.name)))));
  });
  const first = new URLSearchParams(params);
  first.delete("cursor");
  const next = new URLSearchParams(params);
  if (page.next_cursor) next.set("cursor", page.next_cursor);
  main.replaceChildren(
    h("div", { class: "pagehead" }, h("h1", {}, "Requests")),
    filterForm(params),
    h("div", { class: "tabs" }, "order: ", Object.keys(LIST_ORDERS).map(orderLink),
      order.note ? h("span", { class: "muted" }, ` (${order.note})`) : ""),
    table(["start (UTC)", "request", "TTFT", "KV time", "path", "prefill → decode", "flags"], rows, "requests"),
    h("nav", { class: "pager" },
      params.get("cursor") ? h("a", { href: `/requests?${first}`, id: "first-page" }, order.first) : "",
      page.next_cursor ? h("a", { href: `/requests?${next}`, id: "next-page", rel: "next" }, order.next) : h("span", { class: "muted" }, "end of list")));
}

function filterForm(params) {
  const sel = (name, values) => h("label", {}, name.replace("_", " "),
    h("select", { name }, h("option", { value: "" }, "any"),
      values.map((v) => h("option", { value: v, selected: params.get(name) === v }, v))));
  const txt = (name, ph) => h("label", {}, name,
    h("input", { name, value: params.get(name) || "", placeholder: ph, size: 18 }));
  return h("form", { class: "filters", method: "get", action: "/requests" },
    sel("flag", FLAGS), sel("path_class", PATH_CLASSES), txt("node", "node name"), txt("pod", "pod name"),
    txt("model", "model"), txt("since", "RFC 3339 or unix s"), txt("until", "RFC 3339 or unix s"),
    params.get("order") ? h("input", { type: "hidden", name: "order", value: params.get("order") }) : "",
    h("button", { type: "submit" }, "Filter"), h("a", { href: "/requests" }, "clear"));
}

// -- One request ------------------------------------------------------------------------

// "Open in Grafana": Explore on the configured Tempo data source (settings `grafana_url`).
function grafanaLink(traceId) {
  const meta = (name) => document.querySelector(`meta[name="railtrace-grafana-${name}"]`)?.content;
  const base = meta("url");
  if (!base) return [];
  const left = { datasource: meta("datasource"), queries: [{ refId: "A", queryType: "traceql", query: traceId }] };
  return [" · ", h("a", { href: `${base}/explore?left=${encodeURIComponent(JSON.stringify(left))}`, target: "_blank", rel: "noopener" }, "Open in Grafana")];
}

async function requestPage(main, ident) {
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

function openSpan(id) {
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

// -- Topology ---------------------------------------------------------------------------

async function topologyPage(main) {
  const [topo, contract] = await Promise.all([maybe("/api/v1/topology"), maybe("/api/v1/contract")]);
  if (topo.error) {
    main.replaceChildren(h("h1", {}, "Topology"), h("p", { class: "bad", role: "alert" }, topo.error));
    return;
  }
  const nodes = new Map(topo.nodes.map((n) => [n.name, n]));
  const placed = new Set();
  const blocks = Object.entries(topo.blocks || {}).map(([block, subs]) =>
    h("div", { class: "block" }, h("h3", {}, `block ${short(block, 16)}`),
      Object.entries(subs).map(([sub, names]) =>
        h("div", { class: "subblock" }, h("h4", {}, `subblock ${short(sub, 16)}`),
          names.map((n) => { placed.add(n); return nodeCard(nodes.get(n), n); })))));
  const loose = topo.nodes.filter((n) => !placed.has(n.name));
  main.replaceChildren(
    h("div", { class: "pagehead" }, h("h1", {}, "Topology")),
    h("p", {}, `${topo.nodes.length} nodes, ${topo.pods.length} pods, ${Object.keys(topo.rails || {}).length} rails · sources: ${(topo.sources || []).length}`),
    section(`Warnings (${topo.warnings.length})`, h("ul", { class: "plain" }, topo.warnings.map((w) => h("li", { class: "warn" }, typeof w === "string" ? w : JSON.stringify(w))))),
    section(`Discovery gaps (${topo.discovery_gaps.length})`, h("ul", { class: "plain" }, topo.discovery_gaps.map((g) => h("li", { class: "warn" }, typeof g === "string" ? g : `${g.object}: missing ${(g.missing || []).join(", ")}${g.note ? ` (${g.note})` : ""}`)))),
    section("Nodes by block and subblock", h("div", { class: "blocks" }, blocks, loose.length ? h("div", { class: "block" }, h("h3", {}, "no block label"), loose.map((n) => nodeCard(n, n.name))) : "")),
    contractSection(contract));
}

function nodeCard(node, name) {
  if (!node) return h("div", { class: "node" }, h("h5", {}, name), h("p", { class: "warn" }, "not in the node list"));
  const nics = new Map(node.nics.map((n) => [n.name, n]));
  const pairing = new Map((node.pairings || []).map((p) => [p.gpu, p]));
  const rows = node.gpus.map((g) => {
    const p = pairing.get(g.name);
    const ns = p ? p.nics.map((n) => nics.get(n)).filter(Boolean) : [];
    return h("tr", {},
      h("td", {}, g.name),
      h("td", {}, ns.map((n) => n.rdma_device || n.name).join(", ") || h("span", { class: "warn" }, "none")),
      h("td", {}, ns.map((n) => n.rail || "—").join(", ") || "—"),
      h("td", { title: p ? p.evidence : "" }, p ? `${p.method}: ${p.evidence}` : h("span", { class: "warn" }, "not paired")));
  });
  return h("div", { class: "node", id: `node-${node.name}` },
    h("h5", {}, h("a", { href: `/requests?node=${encodeURIComponent(node.name)}` }, node.name)),
    h("div", { class: "muted" }, `${node.machine_type || "?"} · ${node.zone || "?"} · RDMA ${node.rdma_path ? "yes" : "no"}`),
    table(["GPU", "NIC", "rail", "paired by"], rows, "compact"));
}

function contractSection(contract) {
  if (contract.error) return section("Contract audit", h("p", { class: "warn" }, contract.error));
  const obligations = ["discovered", "preserved", "verified", "consumed"];
  const rows = (contract.pods || []).map((p) => h("tr", {},
    h("td", {}, h("a", { href: `/requests?pod=${encodeURIComponent(p.name)}` }, p.name)),
    h("td", {}, p.pool || p.role || "—"),
    h("td", {}, p.node || "—"),
    obligations.map((o) => {
      const ob = (p.obligations || {})[o] || {};
      return h("td", { class: `status-${ob.status || "unknown"}`, title: ob.summary || "" }, ob.status || "—");
    })));
  return section("Contract audit per pod", table(["pod", "pool", "node", ...obligations], rows, "compact"));
}

// -- Router -----------------------------------------------------------------------------

async function route() {
  const main = document.getElementById("main");
  const path = location.pathname.replace(/\/+$/, "") || "/";
  const params = new URLSearchParams(location.search);
  let page = "overview";
  try {
    if (path === "/") await overview(main, params);
    else if (path === "/requests") { page = "requests"; await requestsPage(main, params); }
    else if (path.startsWith("/requests/")) { page = "requests"; await requestPage(main, decodeURIComponent(path.slice(10))); }
    else if (path === "/topology") { page = "topology"; await topologyPage(main); }
    else main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "/" }, "overview")));
    document.title = `railtrace · ${page}`;
  } catch (e) {
    if (e instanceof Unauthorized) tokenForm(main);
    else main.replaceChildren(h("h1", {}, "Error"), h("p", { class: "bad", role: "alert" }, String(e.message || e)));
  }
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.page === page);
  main.setAttribute("aria-busy", "false");
  performance.mark("railtrace:rendered"); // benchmarks/ui reads it: navigation to a complete page
  if (location.hash.startsWith("#span-")) {
    openSpan(location.hash.slice(6));
    document.getElementById(location.hash.slice(1))?.scrollIntoView();
  }
}

route();
