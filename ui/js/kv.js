// Key/Value: folders browsed with `?keys&separator=/`, keys created
// (`?cas=0`: never over an existing one), edited with CAS on the index
// they were read at (a concurrent change is reported, not overwritten),
// deleted; a folder's delete asks first.

import { h, fill } from "./dom.js";
import { api, watch, kvPath, b64text } from "./api.js";

const crumbs = (path) => {
  const parts = path.split("/").filter(Boolean);
  let acc = "";
  return h("nav", { "aria-label": "Folder path", class: "crumbs" },
    h("a", { href: "#/kv/" }, "Key/Value"),
    parts.map((p, i) => {
      acc += p + (i < parts.length - 1 || path.endsWith("/") ? "/" : "");
      return [" / ", h("a", { href: `#/kv/${acc}` }, p)];
    }));
};

export async function page(main, [path], ctx) {
  if (path === "" || path.endsWith("/")) return folder(main, path, ctx);
  return key(main, path, ctx);
}

async function folder(main, prefix, ctx) {
  const body = h("div", { id: "kv-list" }, h("p", { class: "muted" }, "Loading…"));
  const name = h("input", { id: "kv-new-key", required: true, placeholder: "name, or folder/ to make a folder" });
  const value = h("textarea", { id: "kv-new-value" });
  const msg = h("div", { "aria-live": "polite" });
  const form = h("form", { id: "kv-create", "aria-label": "Create a key" },
    h("h2", {}, "Create"), h("label", {}, `Key (under ${prefix || "the root"})`, name),
    h("label", {}, "Value", value), h("p", {}, h("button", { class: "primary", type: "submit" }, "Create")), msg);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const full = prefix + name.value.trim();
    if (!name.value.trim()) return;
    try {
      const a = await api(`${kvPath(full)}?cas=0`, { method: "PUT", body: full.endsWith("/") ? "" : value.value, what: `creating ${full}` });
      if (a.data === false) fill(msg, h("p", { class: "error" }, `${full} exists already: nothing was changed.`));
      else { fill(msg, h("p", { class: "ok" }, `Created ${full}.`)); name.value = ""; value.value = ""; }
    } catch (e) { fill(msg, h("p", { class: "error" }, e.message)); }
  });
  const dialog = h("dialog", { id: "kv-confirm", "aria-labelledby": "kv-confirm-title" });
  fill(main, crumbs(prefix), h("h1", {}, prefix || "Key/Value"), ctx.errors, body, form, dialog);
  await watch(`${kvPath(prefix)}?keys&separator=/`, {
    signal: ctx.signal, ok: [404], what: `listing ${prefix || "the root"}`,
    onData: (keys) => {
      ctx.clear();
      const list = (keys || []).filter((k) => k !== prefix);
      fill(body, list.length ? h("ul", { class: "kv-keys" }, list.map((k) => {
        const rel = k.slice(prefix.length);
        const isFolder = k.endsWith("/");
        return h("li", { dataset: { key: k } }, h("a", { href: `#/kv/${k}` }, isFolder ? `📁 ${rel}` : rel),
          isFolder ? [" ", h("button", { type: "button", class: "danger", "aria-label": `Delete folder ${k}`,
            onclick: () => confirmDelete(dialog, k, ctx) }, "Delete folder")] : null);
      })) : h("p", { class: "muted" }, "No keys here."));
    },
    onError: ctx.error,
  });
}

function confirmDelete(dialog, folderKey, ctx) {
  const result = h("div", { "aria-live": "polite" });
  fill(dialog, h("h2", { id: "kv-confirm-title" }, `Delete folder ${folderKey}?`),
    h("p", {}, "Every key under it is deleted. This cannot be undone."), result,
    h("form", { method: "dialog", class: "inline" },
      h("button", { value: "cancel", id: "kv-confirm-cancel", autofocus: true }, "Cancel"),
      h("button", { type: "button", class: "danger", id: "kv-confirm-delete", onclick: async () => {
        try {
          await api(`${kvPath(folderKey)}?recurse`, { method: "DELETE", what: `deleting ${folderKey}` });
          dialog.close();
        } catch (e) { fill(result, h("p", { class: "error" }, e.message)); }
      } }, "Delete")));
  dialog.showModal();
}

async function key(main, path, ctx) {
  const value = h("textarea", { id: "kv-value", "aria-label": `Value of ${path}` });
  const msg = h("div", { id: "kv-message", "aria-live": "polite" });
  const info = h("p", { class: "muted" });
  let index = null;
  const load = async () => {
    const a = await api(kvPath(path), { ok: [404], what: `reading ${path}` });
    if (a.status === 404) {
      fill(info, "This key does not exist (any more).");
      index = 0;
      return;
    }
    const e = a.data[0];
    index = e.ModifyIndex;
    value.value = b64text(e.Value);
    fill(info, `Modify index ${e.ModifyIndex}, flags ${e.Flags}${e.Session ? `, locked by session ${e.Session}` : ""}.`);
  };
  const save = h("button", { class: "primary", type: "submit", id: "kv-save" }, "Save");
  const del = h("button", { class: "danger", type: "button", id: "kv-delete" }, "Delete");
  const form = h("form", { id: "kv-edit", "aria-label": `Edit ${path}` }, h("label", { for: "kv-value" }, "Value"), value,
    h("p", { class: "inline" }, save, " ", del), msg);
  const parent = path.includes("/") ? path.slice(0, path.lastIndexOf("/") + 1) : "";
  fill(main, crumbs(path), h("h1", {}, path), ctx.errors, info, form);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const a = await api(`${kvPath(path)}?cas=${index}`, { method: "PUT", body: value.value, what: `saving ${path}` });
      if (a.data === false) {
        fill(msg, h("p", { class: "error", id: "kv-conflict" },
          `${path} was changed by someone else since you opened it: your edit was not saved. `,
          h("button", { type: "button", onclick: async () => { await load(); fill(msg); } }, "Load the current value"),
          " (your text will be replaced)."));
        return;
      }
      await load();
      fill(msg, h("p", { class: "ok" }, `Saved ${path}.`));
    } catch (e) { fill(msg, h("p", { class: "error" }, e.message)); }
  });
  del.addEventListener("click", async () => {
    try {
      const a = await api(`${kvPath(path)}?cas=${index}`, { method: "DELETE", what: `deleting ${path}` });
      if (a.data === false) {
        fill(msg, h("p", { class: "error", id: "kv-conflict" }, `${path} was changed by someone else since you opened it: it was not deleted.`));
        return;
      }
      location.hash = `#/kv/${parent}`;
    } catch (e) { fill(msg, h("p", { class: "error" }, e.message)); }
  });
  await load();
}
