// `/debug/pprof/profile` read by pprof-format (the npm decoder of Go's
// pprof protobuf, as `go tool pprof` reads it): a CPU profile of a
// `cairn server --dev` taken while it serves KV writes decodes, is typed as
// Go's CPU profiles are, and its samples name cairn's own functions.

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const zlib = require("node:zlib");
const { Profile } = require("pprof-format");
const { devServer } = require("./cairn");

let server;
let base;

before(async () => {
  ({ server, base } = await devServer("node-pprof"));
});

after(() => {
  if (server) server.kill("SIGTERM");
});

test("a CPU profile in pprof's format, of cairn's own work", async () => {
  // Work for the sampler: writes until the profile is in.
  let busy = true;
  const writers = Array.from({ length: 4 }, async (_, w) => {
    for (let i = 0; busy; i++) {
      await fetch(`${base}/v1/kv/pprof/${w}/${i}`, { method: "PUT", body: "v" });
    }
  });
  const res = await fetch(`${base}/debug/pprof/profile?seconds=2`);
  busy = false;
  await Promise.all(writers);
  assert.equal(res.status, 200, await res.clone().text());
  const raw = Buffer.from(await res.arrayBuffer());
  // Gzipped, as Go serves it.
  assert.deepEqual([...raw.subarray(0, 2)], [0x1f, 0x8b]);
  const p = Profile.decode(zlib.gunzipSync(raw));
  const str = (i) => p.stringTable.strings[Number(i)];
  assert.deepEqual(
    p.sampleType.map((t) => [str(t.type), str(t.unit)]),
    [["samples", "count"], ["cpu", "nanoseconds"]],
  );
  assert.equal(Number(p.period), 10_000_000);
  assert.ok(Number(p.durationNanos) >= 1_900_000_000, `duration ${p.durationNanos}`);
  assert.ok(p.sample.length > 0, "no samples");
  const fns = new Map(p.function.map((f) => [Number(f.id), str(f.name)]));
  const locs = new Map(p.location.map((l) => [Number(l.id), l]));
  const named = new Set();
  for (const s of p.sample) {
    for (const id of s.locationId) {
      for (const line of locs.get(Number(id)).line) named.add(fns.get(Number(line.functionId)));
    }
  }
  assert.ok([...named].some((n) => n && n.startsWith("cairn::")), [...named].slice(0, 20).join("\n"));
});

test("the profiles Go has and a Rust process does not say so", async () => {
  const heap = await fetch(`${base}/debug/pprof/heap`);
  assert.equal(heap.status, 404);
  assert.match(await heap.text(), /^Unknown profile: the allocator/);
  const threads = await (await fetch(`${base}/debug/pprof/goroutine`)).text();
  assert.match(threads, /tokio-rt-worker/);
});
