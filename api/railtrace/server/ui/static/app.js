// railtrace UI entry point: routes a page URL to its module (static/js/), marks the page
// rendered. Plain ES modules, no dependencies, no build step. Every figure comes from the query API
// (/api/v1/...) with the same bearer token as any API client (kept for the browser session only).

import { Unauthorized, h, tokenForm } from "./js/common.js";
import { contractPage } from "./js/contract.js";
import { overview } from "./js/overview.js";
import { openSpan, requestPage } from "./js/request.js";
import { requestsPage } from "./js/requests.js";
import { topologyPage } from "./js/topology.js";

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
    else if (path === "/topology") { page = "topology"; await topologyPage(main, params); }
    else if (path === "/contract") { page = "contract"; await contractPage(main); }
    else {
      page = "not found";
      main.replaceChildren(h("h1", {}, "Not found"),
        h("p", {}, "railtrace has no page at ", h("code", {}, location.pathname), ". ", h("a", { href: "/" }, "Overview")));
    }
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
