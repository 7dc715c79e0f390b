// The contract audit (`/contract`): per pod, whether each obligation of the topology contract
// holds (discovered, preserved, verified, consumed), with the audit's reason written out in each
// cell and its evidence one click away; pods and nodes link to their requests.

import { h, maybe, section, table } from "./common.js";
import { nodeLinks, podLinks } from "./topology.js";

const OBLIGATIONS = ["discovered", "preserved", "verified", "consumed"];

function cell(ob) {
  const o = ob || {};
  const evidence = (o.evidence || []).filter((e) => e && e.message);
  return h("td", { class: `status-${o.status || "unknown"}` },
    o.status || "—",
    h("span", { class: "reason" }, o.summary || ""),
    evidence.length ? h("details", {}, h("summary", {}, `evidence (${evidence.length})`),
      h("ul", { class: "plain" }, evidence.map((e) => h("li", { class: "evidence reason" },
        e.object ? h("code", {}, e.object) : "", " ", e.message)))) : null);
}

export async function contractPage(main) {
  const contract = await maybe("/api/v1/contract");
  if (contract.error) {
    main.replaceChildren(h("h1", {}, "Contract audit"), h("p", { class: "bad", role: "alert" }, contract.error));
    return;
  }
  const fleet = (contract.fleet || {}).obligations || {};
  const countRow = (name, members, obs) => h("tr", {}, h("td", {}, name), h("td", { class: "num" }, members ?? "—"),
    OBLIGATIONS.map((o) => {
      const x = (obs || {})[o] || {};
      const c = x.counts || {};
      return h("td", { class: `status-${x.status || "unknown"}` }, x.status || "—",
        h("span", { class: "reason" }, `${c.ok ?? 0} ok · ${c.broken ?? 0} broken · ${c.unknown ?? 0} unknown`));
    }));
  const pods = (contract.pods || []).map((p) => h("tr", { id: `pod-${p.name}` },
    h("td", {}, h("strong", {}, p.name), h("div", { class: "muted" }, podLinks.map((f, i) => [i ? " · " : "", f(p.name)]))),
    h("td", {}, p.pool || p.role || "—"),
    h("td", {}, p.node || "—", p.node ? h("div", { class: "muted" }, nodeLinks.map((f, i) => [i ? " · " : "", f(p.node)])) : null),
    OBLIGATIONS.map((o) => cell((p.obligations || {})[o]))));
  const broken = (contract.pods || []).filter((p) => OBLIGATIONS.some((o) => ((p.obligations || {})[o] || {}).status === "broken")).length;
  main.replaceChildren(...[
    h("div", { class: "pagehead" }, h("h1", {}, "Contract audit")),
    h("p", { class: "meta" }, `${contract.mode || ""} audit of ${(contract.pods || []).length} pods at ${contract.generated_at || "?"}: `,
      broken ? h("span", { class: "bad" }, `${broken} pods break an obligation`) : h("span", { class: "ok" }, "every obligation holds"),
      " · ", h("a", { href: "/api/v1/contract" }, "JSON")),
    (contract.warnings || []).length ? section("Warnings", h("ul", { class: "plain" }, contract.warnings.map((w) => h("li", { class: "warn" }, typeof w === "string" ? w : JSON.stringify(w))))) : null,
    section("Fleet and pools", table(["", "members", ...OBLIGATIONS], [
      countRow("fleet", (contract.fleet || {}).members, fleet),
      ...(contract.pools || []).map((p) => countRow(`pool ${p.pool}`, p.members, p.obligations))], "compact contract")),
    section("Per pod", table(["pod", "pool", "node", ...OBLIGATIONS], pods, "compact contract")),
  ].filter(Boolean));
}
