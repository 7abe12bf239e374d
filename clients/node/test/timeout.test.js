// Every call has a time limit: a daemon that accepts and never answers, or stops answering,
// costs a caller at most `callTimeoutMs`, and the connection goes on.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { test } from "node:test";

import { tempDir } from "./helpers.js";
import { CallTimeoutError, connect } from "../src/index.js";

/** A listener in a private folder that answers `ping` only when `answering()` says so, and nothing else. */
async function listener(answering) {
  const folder = tempDir("sdc-hung-");
  fs.chmodSync(folder, 0o700);
  const socketPath = path.join(folder, "s.sock");
  const peers = [];
  const server = net.createServer((peer) => {
    peers.push(peer);
    let buffer = "";
    peer.on("data", (chunk) => {
      buffer += chunk.toString("utf8");
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const request = JSON.parse(buffer.slice(0, end));
        buffer = buffer.slice(end + 1);
        if (request.method === "ping" && answering()) {
          peer.write(`${JSON.stringify({ jsonrpc: "2.0", id: request.id, result: { version: "0", pid: 1, uptime_s: 0 } })}\n`);
        }
      }
    });
  });
  await new Promise((resolve) => server.listen(socketPath, resolve));
  return { socketPath, close: () => { for (const peer of peers) peer.destroy(); server.close(); } };
}

test("a daemon that accepts and never answers fails the connection within callTimeoutMs", { timeout: 10_000 }, async () => {
  const hung = await listener(() => false);
  try {
    const started = Date.now();
    const error = await connect({ socket: hung.socketPath, callTimeoutMs: 300 }).catch((caught) => caught);
    assert.ok(error instanceof CallTimeoutError, String(error));
    assert.match(error.message, /did not answer ping within 0\.3 s/);
    assert.ok(Date.now() - started < 5000);
  } finally {
    hung.close();
  }
});

test("a call the daemon leaves unanswered rejects alone, and the connection goes on", { timeout: 10_000 }, async () => {
  const quiet = await listener(() => true);
  const sd = await connect({ socket: quiet.socketPath, callTimeoutMs: 300 });
  try {
    const error = await sd.checkpoint({ path: "/tmp" }).catch((caught) => caught);
    assert.ok(error instanceof CallTimeoutError, String(error));
    assert.deepEqual(error.data, { method: "checkpoint", timeout_ms: 300 });
    assert.equal((await sd.ping()).version, "0");
  } finally {
    sd.destroy();
    quiet.close();
  }
});
