// What the npm client suites share: a `cairn server --dev` on free ports
// (the binary is $CAIRN_BIN, else target/debug/cairn), and a wait on a
// condition. Not a test file itself (`node --test` runs `*.test.js`).

const { spawn } = require("node:child_process");
const net = require("node:net");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const Consul = require("consul");

const ROOT = path.resolve(__dirname, "..", "..");
const BIN = process.env.CAIRN_BIN || path.join(ROOT, "target", "debug", "cairn");

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

async function eventually(what, fn, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${last}` : ""}`);
}

/**
 * Starts a dev server named `node` and waits for its leader: returns
 * {server (the child process), consul (a client of it), base (its URL),
 * logPath}.
 */
async function devServer(node) {
  const [http, raft, grpc, dns] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
  const logPath = path.join(os.tmpdir(), `cairn-${node}-${process.pid}.log`);
  const log = fs.openSync(logPath, "w");
  const server = spawn(BIN, ["server", "--dev", "--node", node,
    "--http-addr", `127.0.0.1:${http}`, "--raft-addr", `127.0.0.1:${raft}`,
    "--grpc-addr", `127.0.0.1:${grpc}`, "--dns-addr", `127.0.0.1:${dns}`],
  { stdio: ["ignore", log, log] });
  const consul = new Consul({ host: "127.0.0.1", port: http });
  await eventually("a leader", async () => (await consul.status.leader()) !== "");
  return { server, consul, base: `http://127.0.0.1:${http}`, logPath };
}

module.exports = { devServer, eventually };
