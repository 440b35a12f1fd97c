// The hash router: each route renders into <main> and keeps its lists
// live until the next route aborts them.

import { h, fill } from "./dom.js";
import { api, token, dc, watch } from "./api.js";
import * as services from "./services.js";
import * as nodes from "./nodes.js";
import * as kv from "./kv.js";
import * as intentions from "./intentions.js";
import * as config from "./config.js";
import * as acl from "./acl.js";

const routes = [
  [/^\/services$/, services.list],
  [/^\/services\/([^/]+)$/, services.detail],
  [/^\/services\/([^/]+)\/(topology|routing|intentions|linked)$/, services.detail],
  [/^\/nodes$/, nodes.list],
  [/^\/nodes\/([^/]+)$/, nodes.detail],
  [/^\/kv\/(.*)$/, kv.page],
  [/^\/intentions$/, intentions.page],
  [/^\/config$/, config.list],
  [/^\/config\/([^/]+)$/, config.list],
  [/^\/config\/([^/]+)\/([^/]+)$/, config.entry],
  [/^\/acl$/, acl.page],
];

const main = document.getElementById("main");
let current = null;

/** What every page gets: its abort signal, and ways to show failures. */
function context(signal) {
  const errors = h("div", { role: "alert" });
  return {
    signal,
    errors,
    /** Shows `e` (an ApiError or any Error) in words, once per message. */
    error(e) {
      if (signal.aborted) return;
      const msg = e?.message || String(e);
      if (![...errors.children].some((c) => c.textContent === msg)) {
        errors.append(h("p", { class: "error" }, msg));
      }
    },
    clear() { errors.replaceChildren(); },
  };
}

async function render() {
  current?.abort();
  current = new AbortController();
  const path = decodeURIComponentSafe(location.hash.replace(/^#/, "") || "/services");
  const ctx = context(current.signal);
  for (const a of document.querySelectorAll("#nav a")) {
    const section = a.getAttribute("href").slice(1).split("/")[1];
    if (path.split("/")[1] === section) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  for (const [re, page] of routes) {
    const m = path.match(re);
    if (m) {
      fill(main, ctx.errors);
      try {
        await page(main, m.slice(1).map((s) => s ?? ""), ctx);
      } catch (e) {
        if (e.name !== "AbortError") ctx.error(e);
      }
      return;
    }
  }
  fill(main, h("h1", {}, "Not found"), h("p", {}, `No page at ${path}. `, h("a", { href: "#/services" }, "Services")));
}

function decodeURIComponentSafe(s) {
  try { return decodeURIComponent(s); } catch { return s; }
}

function loginState() {
  const link = document.getElementById("login-link");
  link.textContent = token.get() ? "ACL (logged in)" : "ACL / Log in";
}

window.addEventListener("hashchange", () => { loginState(); render(); main.focus({ preventScroll: true }); });
window.addEventListener("cairn-token", loginState);
// An OIDC log-in coming back from its provider ends before the first page.
acl.finishOidc().finally(() => { loginState(); render(); });
// The datacenter selector: every known datacenter, this one first (the
// list is nearest first); a choice re-renders the page through `?dc=`.
const dcSelect = document.getElementById("dc");
dcSelect.addEventListener("change", () => {
  dc.set(dcSelect.selectedIndex === 0 ? "" : dcSelect.value);
  render();
});
// Datacenters join and leave: the list is polled (it has no index to
// block on), and the options change only when it does.
let known = "";
watch("/v1/catalog/datacenters", {
  signal: new AbortController().signal,
  what: "listing datacenters",
  onData: (list) => {
    const all = list || [];
    if (all.join() === known) return;
    known = all.join();
    if (dc.get() && !all.includes(dc.get())) dc.set("");
    fill(dcSelect, all.map((d) => h("option", { value: d, selected: d === (dc.get() || all[0]) }, d)));
  },
  onError: () => {},
});
