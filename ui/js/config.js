// Config entries: browse by kind, one entry's JSON.

import { h, fill, seg, table } from "./dom.js";
import { watch } from "./api.js";

const KINDS = ["service-defaults", "proxy-defaults", "service-router", "service-splitter", "service-resolver", "service-intentions"];

export async function list(main, [kind = "service-defaults"], ctx) {
  const select = h("select", { id: "config-kind" }, KINDS.map((k) => h("option", { value: k, selected: k === kind }, k)));
  select.addEventListener("change", () => { location.hash = `#/config/${select.value}`; });
  const body = h("div", { id: "config-list" }, h("p", { class: "muted" }, "Loading…"));
  fill(main, h("h1", {}, "Config entries"), ctx.errors, h("div", { class: "filters" }, h("label", {}, "Kind", select)), body);
  await watch(`/v1/config/${seg(kind)}`, {
    signal: ctx.signal, what: `listing ${kind} entries`,
    onData: (entries) => {
      ctx.clear();
      fill(body, (entries || []).length ? table(["Name", "Modify index"], entries.map((e) =>
        h("tr", { dataset: { entry: e.Name } }, h("td", {}, h("a", { href: `#/config/${seg(kind)}/${seg(e.Name)}` }, e.Name)),
          h("td", {}, String(e.ModifyIndex)))), { label: `${kind} entries` })
        : h("p", { class: "muted" }, `No ${kind} entries.`));
    },
    onError: ctx.error,
  });
}

export async function entry(main, [kind, name], ctx) {
  const body = h("pre", { id: "config-json", tabindex: "0", "aria-label": `${kind} ${name} as JSON` }, "Loading…");
  fill(main, h("p", {}, h("a", { href: `#/config/${seg(kind)}` }, `← ${kind}`)), h("h1", {}, `${kind} / ${name}`), ctx.errors, body);
  await watch(`/v1/config/${seg(kind)}/${seg(name)}`, {
    signal: ctx.signal, what: `reading ${kind} ${name}`,
    onData: (e) => { ctx.clear(); body.textContent = JSON.stringify(e, null, 2); },
    onError: ctx.error,
  });
}
