// The npm `consul` client's prepared query calls (consul.query.create,
// list, get, update, execute, explain, destroy), unchanged, against a
// `cairn server --dev` on free ports. The binary is $CAIRN_BIN, else
// target/debug/cairn.

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { devServer } = require("./cairn");

let server;
let consul;
let base;

before(async () => {
  ({ server, consul, base } = await devServer("node-q"));
});

after(() => {
  if (server) server.kill("SIGTERM");
});

async function register(node, address, tags, status) {
  await consul.catalog.register({
    node, address,
    service: { service: "js-web", id: `js-${node}`, port: 80, tags },
    check: { checkid: `js-${node}-check`, name: "check", status, serviceid: `js-${node}` },
  });
}

test("query: create, list, get, update, execute, explain, destroy", async () => {
  await register("js-a", "10.8.0.1", ["v1"], "passing");
  await register("js-b", "10.8.0.2", ["v1"], "warning");
  await register("js-c", "10.8.0.3", ["v1"], "critical");

  const created = await consul.query.create({
    name: "js-q",
    service: { service: "js-web", tags: ["v1"], failover: { nearestn: 2 } },
    dns: { ttl: "15s" },
  });
  assert.match(created.ID, /^[0-9a-f-]{36}$/);

  const listed = await consul.query.list();
  assert.ok(listed.some((q) => q.ID === created.ID));
  const got = await consul.query.get(created.ID);
  assert.equal(got.Name, "js-q");
  assert.equal(got.Service.Failover.NearestN, 2);
  assert.equal(got.DNS.TTL, "15s");

  let res = await consul.query.execute(created.ID);
  assert.equal(res.Service, "js-web");
  assert.equal(res.Datacenter, "dc1");
  assert.equal(res.Failovers, 0);
  assert.deepEqual(res.Nodes.map((n) => n.Node.Node).sort(), ["js-a", "js-b"]);

  await consul.query.update({
    query: created.ID,
    name: "js-q",
    service: { service: "js-web", tags: ["v1"], onlypassing: true },
  });
  res = await consul.query.execute("js-q");
  assert.deepEqual(res.Nodes.map((n) => n.Node.Node), ["js-a"]);

  // The client takes `body[0]` of explain's answer, an object
  // (`{"Query": ...}`, as Consul's): it resolves to undefined against
  // Consul too. The call succeeds; the answer itself is read directly.
  await consul.query.explain("js-q");
  const explained = await (await fetch(`${base}/v1/query/js-q/explain`)).json();
  assert.equal(explained.Query.ID, created.ID);
  assert.equal(explained.Query.Service.OnlyPassing, true);

  await consul.query.destroy(created.ID);
  assert.ok(!(await consul.query.list()).some((q) => q.ID === created.ID));
  await assert.rejects(consul.query.execute(created.ID), /Query not found|not found/i);
});

test("query: a template by name and a refusal", async () => {
  const tpl = await consul.query.create({
    name: "js-tpl-",
    template: { type: "name_prefix_match", regexp: "^js-tpl-(.*)$" },
    service: { service: "${match(1)}" },
  });
  const res = await consul.query.execute("js-tpl-js-web");
  assert.equal(res.Service, "js-web");
  await consul.query.destroy(tpl.ID);
  // Unnamed and bound to no session: refused as Consul refuses it.
  await assert.rejects(consul.query.create("js-web"), /Must be bound to a session/);
});
