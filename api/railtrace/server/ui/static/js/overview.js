// The fleet overview (`/`): counts, TTFT quantiles and flags over the chosen window.

import { timeChart } from "./charts.js";
import { FLAGS, LEVELS, PATH_CLASSES, api, flagBadge, h, maybe, pathBadge, pct, secs, section, table, tile } from "./common.js";

// The windows the overview offers (`?window=`), in seconds.
export const WINDOWS = { "15m": [900, "last 15 min"], "1h": [3600, "last hour"], "6h": [21600, "last 6 h"], "24h": [86400, "last day"] };

function windowChooser(current) {
  return h("div", { class: "tabs" }, Object.entries(WINDOWS).map(([w, [, label]]) =>
    h("a", { href: `/?window=${w}`, class: w === current ? "active" : "" }, label)));
}

// Trends over the window from /api/v1/stats/timeseries. A bucket's `seconds_lost` (from the
// requests' `cost`, where the service has it) is drawn when present.
function trendsSection(series) {
  if (series.error) return section("Over time", h("p", { class: "warn" }, `trends unavailable: ${series.error}`));
  const b = series.buckets;
  const step = series.step_s >= 3600 ? `${series.step_s / 3600} h` : `${series.step_s / 60} min`;
  const flagsSeen = FLAGS.filter((f) => b.some((x) => x.flags[f]));
  const lost = b.some((x) => typeof x.seconds_lost === "number");
  return section(`Over time (${step} buckets)`,
    h("div", { class: "grid charts" },
      h("div", {}, h("h3", {}, "Requests by path class"),
        timeChart(b, { id: "trend-requests", label: "requests per bucket by path class",
          stacked: PATH_CLASSES.map((pc) => ({ label: pc, cls: `pc-${pc}`, value: (x) => x.path_class[pc] || 0 })).filter((s) => b.some(s.value)) })),
      h("div", {}, h("h3", {}, "Flagged requests"),
        timeChart(b, { id: "trend-flags", label: "flagged requests per bucket",
          lines: flagsSeen.map((f) => ({ label: f, cls: `fl-${f}`, value: (x) => x.flags[f] || 0 })) })),
      h("div", {}, h("h3", {}, "TTFT p50 / p99"),
        timeChart(b, { id: "trend-ttft", label: "TTFT quantiles per bucket", yFmt: secs,
          lines: [{ label: "p50", cls: "q-p50", value: (x) => x.ttft_s_p50 }, { label: "p99", cls: "q-p99", value: (x) => x.ttft_s_p99 }] })),
      lost ? h("div", {}, h("h3", {}, "Seconds lost"),
        timeChart(b, { id: "trend-lost", label: "seconds lost per bucket", yFmt: secs,
          stacked: [{ label: "seconds lost", cls: "lost", value: (x) => x.seconds_lost || 0 }] })) : null));
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

export async function overview(main, params) {
  const win = Object.hasOwn(WINDOWS, params.get("window") || "") ? params.get("window") : "1h";
  const since = Math.floor(Date.now() / 1000) - WINDOWS[win][0];
  const [byPath, byFlag, byPair, ready, topo, quant, byCoverage, series] = await Promise.all([
    api(`/api/v1/stats?group_by=path_class&since=${since}`),
    api(`/api/v1/stats?group_by=flag&since=${since}`),
    api(`/api/v1/stats?group_by=pair&since=${since}`),
    fetch("/readyz").then((r) => r.json()).catch((e) => ({ status: "unreachable", problems: [String(e)] })),
    maybe("/api/v1/topology?summary=true"),
    api(`/api/v1/stats/ttft?since=${since}`),
    maybe(`/api/v1/stats?group_by=coverage&since=${since}`),
    maybe(`/api/v1/stats/timeseries?since=${since}&buckets=60`),
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
    trendsSection(series),
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
