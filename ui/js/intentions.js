// Intentions: the list in precedence order (live), create or edit (by
// source and destination), delete.

import { h, fill, table } from "./dom.js";
import { api, watch } from "./api.js";

const exact = (src, dst) => `/v1/connect/intentions/exact?source=${encodeURIComponent(src)}&destination=${encodeURIComponent(dst)}`;

export function intentionRows(list, ctx, editable, onEdit) {
  return table(["Source", "", "Destination", "Action", "Precedence", { text: "Description", class: "optional" }, editable ? "" : null].filter((x) => x !== null),
    list.map((i) => {
      const action = i.Action || (i.Permissions?.length ? `L7: ${i.Permissions.length} permissions` : "");
      return h("tr", { dataset: { source: i.SourceName, destination: i.DestinationName, action } },
        h("td", {}, i.SourceName), h("td", { "aria-hidden": "true" }, "→"), h("td", {}, i.DestinationName),
        h("td", { class: i.Action === "allow" ? "allowed" : "denied" }, action),
        h("td", {}, String(i.Precedence)), h("td", { class: "optional" }, i.Description || ""),
        editable ? h("td", {},
          h("button", { type: "button", "aria-label": `Edit ${i.SourceName} to ${i.DestinationName}`, onclick: () => onEdit(i) }, "Edit"), " ",
          h("button", { type: "button", class: "danger", "aria-label": `Delete ${i.SourceName} to ${i.DestinationName}`,
            onclick: async () => {
              try { await api(exact(i.SourceName, i.DestinationName), { method: "DELETE", what: "deleting the intention" }); }
              catch (e) { ctx.error(e); }
            } }, "Delete")) : null);
    }), { label: "Intentions" });
}

export async function page(main, _p, ctx) {
  const src = h("input", { id: "int-source", required: true, placeholder: "web or *" });
  const dst = h("input", { id: "int-destination", required: true, placeholder: "api or *" });
  const action = h("select", { id: "int-action" }, h("option", { value: "allow" }, "allow"), h("option", { value: "deny" }, "deny"));
  const desc = h("input", { id: "int-description" });
  const msg = h("div", { "aria-live": "polite", id: "int-message" });
  const form = h("form", { id: "int-form", class: "inline", "aria-label": "Create or update an intention" },
    h("label", {}, "Source", src), h("label", {}, "Destination", dst), h("label", {}, "Action", action),
    h("label", {}, "Description", desc), h("button", { class: "primary", type: "submit" }, "Save"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await api(exact(src.value.trim(), dst.value.trim()), {
        method: "PUT", what: "saving the intention",
        body: JSON.stringify({ SourceType: "consul", Action: action.value, Description: desc.value }),
      });
      fill(msg, h("p", { class: "ok" }, `Saved: ${src.value} → ${dst.value} ${action.value}.`));
    } catch (e) { fill(msg, h("p", { class: "error" }, e.message)); }
  });
  const onEdit = (i) => {
    src.value = i.SourceName; dst.value = i.DestinationName; action.value = i.Action || "deny"; desc.value = i.Description || "";
    src.focus();
  };
  const body = h("div", { id: "intentions" }, h("p", { class: "muted" }, "Loading…"));
  fill(main, h("h1", {}, "Intentions"), ctx.errors,
    h("p", { class: "muted" }, "Evaluated in precedence order, highest first: the first match decides."),
    body, h("h2", {}, "Create or update"), form, msg);
  await watch("/v1/connect/intentions", {
    signal: ctx.signal, what: "listing intentions",
    onData: (list) => {
      ctx.clear();
      fill(body, (list || []).length ? intentionRows(list, ctx, true, onEdit) : h("p", { class: "muted" }, "No intentions."));
    },
    onError: ctx.error,
  });
}
