// The npm `consul` client (2.x), unchanged, against a `cairn server --dev`
// on free ports: KV with CAS, agent service registration and health,
// sessions with a lock, a watch (blocking queries), events. The binary is
// $CAIRN_BIN, else target/debug/cairn.

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { devServer, eventually } = require("./cairn");

let server;
let consul;

before(async () => {
  ({ server, consul } = await devServer("node-js"));
  // The server's own node and `consul` service are registered by then.
  await eventually("the server's node", async () =>
    (await consul.catalog.node.list()).some((n) => n.Node === "node-js"));
});

after(() => {
  if (server) server.kill("SIGTERM");
});

test("kv: set, get, CAS, recurse and delete", async () => {
  assert.equal(await consul.kv.set("app/a", "1"), true);
  assert.equal(await consul.kv.set({ key: "app/b", value: "2", flags: 7 }), true);
  const a = await consul.kv.get("app/a");
  assert.equal(a.Value, "1");
  // A CAS with a stale index changes nothing (the server answers `false`,
  // which this client resolves as no value, as it does with Consul).
  assert.notEqual(await consul.kv.set({ key: "app/a", value: "x", cas: a.ModifyIndex - 1 }), true);
  assert.equal((await consul.kv.get("app/a")).Value, "1");
  assert.equal(await consul.kv.set({ key: "app/a", value: "3", cas: a.ModifyIndex }), true);
  const all = await consul.kv.get({ key: "app/", recurse: true });
  assert.deepEqual(all.map((e) => [e.Key, e.Value, e.Flags]), [["app/a", "3", 0], ["app/b", "2", 7]]);
  assert.deepEqual(await consul.kv.keys("app/"), ["app/a", "app/b"]);
  await consul.kv.del({ key: "app/", recurse: true });
  assert.equal(await consul.kv.get("app/a"), undefined);
});

test("agent services and health", async () => {
  await consul.agent.service.register({
    name: "web", id: "web-1", port: 8080, tags: ["v1"],
    check: { ttl: "30s", status: "passing" },
  });
  const services = await consul.agent.service.list();
  assert.equal(services["web-1"].Service, "web");
  const healthy = await eventually("web passing", async () => {
    const rows = await consul.health.service({ service: "web", passing: true });
    return rows.length === 1 ? rows : null;
  });
  assert.equal(healthy[0].Service.Port, 8080);
  await consul.agent.check.fail({ id: "service:web-1", note: "down" });
  await eventually("web critical", async () =>
    (await consul.health.service({ service: "web", passing: true })).length === 0);
  await consul.agent.service.deregister("web-1");
  await eventually("web gone", async () =>
    (await consul.catalog.service.nodes("web")).length === 0);
});

test("sessions hold a lock until destroyed", async () => {
  const { ID: s1 } = await consul.session.create({ name: "a", ttl: "15s", behavior: "delete" });
  const { ID: s2 } = await consul.session.create({ name: "b", ttl: "15s" });
  assert.equal(await consul.kv.set({ key: "lock", value: "a", acquire: s1 }), true);
  assert.notEqual(await consul.kv.set({ key: "lock", value: "b", acquire: s2 }), true);
  assert.equal((await consul.kv.get("lock")).Session, s1);
  const info = await consul.session.info(s1);
  assert.equal(info.Name, "a");
  await consul.session.destroy(s1);
  // behavior "delete": the key went with the session.
  assert.equal(await consul.kv.get("lock"), undefined);
  await consul.session.destroy(s2);
});

test("a watch follows a key through blocking queries", async () => {
  const seen = [];
  const watch = consul.watch({ method: consul.kv.get, options: { key: "watched" } });
  watch.on("change", (data) => seen.push(data ? data.Value : null));
  watch.on("error", () => {});
  try {
    await eventually("the first answer", async () => seen.length >= 1);
    await consul.kv.set("watched", "one");
    await eventually("the change", async () => seen.includes("one"));
    await consul.kv.set("watched", "two");
    await eventually("the next change", async () => seen.includes("two"));
  } finally {
    watch.end();
  }
});

test("events: fire and list", async () => {
  const fired = await consul.event.fire({ name: "deploy", payload: "v2" });
  assert.equal(fired.Name, "deploy");
  assert.equal(fired.Payload, "v2");
  await consul.event.fire("other");
  const events = await eventually("the event delivered to this agent", async () => {
    const list = await consul.event.list({ name: "deploy" });
    return list.length === 1 ? list : null;
  });
  assert.equal(events[0].ID, fired.ID);
  assert.equal(events[0].Payload, "v2");
  assert.equal(events.every((e) => e.Name === "deploy"), true);
});
