// Config entries: browse by kind, one entry as JSON or as HCL (the form
// `cairn config write` and Consul's CLI take).

import { h, fill, seg, table } from "./dom.js";
import { watch } from "./api.js";

const KINDS = ["service-defaults", "proxy-defaults", "service-router", "service-splitter", "service-resolver", "service-intentions",
  "ingress-gateway", "terminating-gateway", "mesh", "exported-services"];

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

const IDENT = /^[A-Za-z_][A-Za-z0-9_-]*$/;

/** `v` written as HCL: objects as `{ }` blocks of `Key = value` lines,
 * arrays as `[ ]`; strings and numbers as in JSON, which HCL shares. */
export function hcl(v, ind = "") {
  if (Array.isArray(v)) {
    return v.length ? `[\n${v.map((x) => `${ind}  ${hcl(x, `${ind}  `)}`).join(",\n")}\n${ind}]` : "[]";
  }
  if (v !== null && typeof v === "object") {
    const e = Object.entries(v);
    return e.length ? `{\n${attrs(v, `${ind}  `)}${ind}}` : "{}";
  }
  return JSON.stringify(v);
}

function attrs(o, ind) {
  return Object.entries(o)
    .map(([k, x]) => `${ind}${IDENT.test(k) ? k : JSON.stringify(k)} = ${hcl(x, ind)}\n`).join("");
}

/** An entry as a file: the server's bookkeeping (indexes) left out. */
function asFile(e) {
  const { CreateIndex, ModifyIndex, ...rest } = e || {};
  return rest;
}

export async function entry(main, [kind, name], ctx) {
  const body = h("pre", { id: "config-body", tabindex: "0", "aria-label": `${kind} ${name}` }, "Loading…");
  let shown = null;
  let format = "json";
  const buttons = ["json", "hcl"].map((f) => h("button", {
    type: "button", id: `config-as-${f}`, "aria-pressed": String(f === format),
    onclick: () => { format = f; draw(); },
  }, f.toUpperCase()));
  const draw = () => {
    for (const b of buttons) b.setAttribute("aria-pressed", String(b.id === `config-as-${format}`));
    if (shown) body.textContent = format === "hcl" ? attrs(asFile(shown), "") : JSON.stringify(shown, null, 2);
  };
  fill(main, h("p", {}, h("a", { href: `#/config/${seg(kind)}` }, `← ${kind}`)), h("h1", {}, `${kind} / ${name}`),
    h("div", { class: "filters", role: "group", "aria-label": "Format" }, buttons), ctx.errors, body);
  await watch(`/v1/config/${seg(kind)}/${seg(name)}`, {
    signal: ctx.signal, what: `reading ${kind} ${name}`,
    onData: (e) => { ctx.clear(); shown = e; draw(); },
    onError: ctx.error,
  });
}
