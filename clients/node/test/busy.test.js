// A busy daemon is waited for within connectTimeoutMs, then named in one
// sentence ("snapshotd is busy: ..."), never a raw EAGAIN; and one connection
// (or a small pool, examples/many-sessions.js) serves many sessions at once.

import assert from "node:assert/strict";
import * as net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { test } from "node:test";

import { makeRepo, startDaemon } from "./helpers.js";
import { BusyError, connect } from "../src/index.js";
import { SessionPool } from "../examples/many-sessions.js";

/** Stop the daemon (SIGSTOP) and connect until its listen queue is full; `release()` closes them and lets it go on. */
async function fillQueue(daemon) {
  process.kill(daemon.pid, "SIGSTOP");
  const fillers = [];
  for (;;) {
    const outcome = await new Promise((resolve) => {
      const socket = net.createConnection(daemon.socket);
      socket.once("connect", () => resolve(socket));
      socket.once("error", (error) => resolve(error));
    });
    if (!(outcome instanceof net.Socket)) {
      assert.equal(outcome.code, "EAGAIN");
      break;
    }
    fillers.push(outcome);
  }
  return () => {
    for (const socket of fillers) socket.destroy();
    process.kill(daemon.pid, "SIGCONT");
  };
}

async function timed(promise) {
  const started = Date.now();
  const outcome = await promise.catch((error) => error);
  return { outcome, ms: Date.now() - started };
}

test("a full listen queue: BusyError after connectTimeoutMs, and a patient client gets through", { timeout: 120_000 }, async () => {
  const daemon = await startDaemon();
  let release = await fillQueue(daemon);
  try {
    const { outcome, ms } = await timed(connect({ socket: daemon.socket, connectTimeoutMs: 500 }));
    assert.ok(outcome instanceof BusyError, String(outcome));
    assert.match(outcome.message, /^snapshotd is busy: its queue of connections waiting at .* is full, and no room came within/);
    assert.ok(ms >= 450, `${ms} ms`);
    const patient = connect({ socket: daemon.socket, connectTimeoutMs: 60_000 });
    await sleep(1000);
    release();
    release = () => {};
    const sd = await patient;
    assert.equal(sd.daemon.pid, daemon.pid);
    await sd.close();
  } finally {
    release();
    await daemon.stop();
  }
});

test("past the connection cap: BusyError after connectTimeoutMs, then room when one closes", { timeout: 60_000 }, async () => {
  const daemon = await startDaemon(undefined, "--max-connections", "2");
  const held = [await connect({ socket: daemon.socket }), await connect({ socket: daemon.socket })];
  try {
    const { outcome, ms } = await timed(connect({ socket: daemon.socket, connectTimeoutMs: 500 }));
    assert.ok(outcome instanceof BusyError, String(outcome));
    assert.match(outcome.message, /^snapshotd is busy: it (serves its limit of 2 connections|turns new connections away before reading them \(its connection cap\)), and no room came within/);
    assert.ok(ms >= 450, `${ms} ms`);
    const patient = connect({ socket: daemon.socket, connectTimeoutMs: 30_000 });
    await sleep(500);
    await held.pop().close();
    const sd = await patient;
    assert.equal((await sd.ping()).pid, daemon.pid);
    await sd.close();
  } finally {
    for (const sd of held) sd.destroy();
    await daemon.stop();
  }
});

// One connection runs up to 256 calls at once: past that, a pool.
for (const [size, count] of [[1, 200], [4, 600]]) {
  test(`${size === 1 ? "one connection serves" : `a pool of ${size} connections serves`} ${count} sessions checkpointing at once`, { timeout: 120_000 }, async () => {
    const daemon = await startDaemon();
    const repo = makeRepo({ "a.txt": "a\n" });
    const pool = await SessionPool.open(size, { socket: daemon.socket });
    try {
      const sessions = Array.from({ length: count }, (_, n) => `agent-${n}`);
      const results = await Promise.all(sessions.map((session) => pool.checkpoint({ path: repo, session, label: "before turn 1" })));
      assert.deepEqual(results.map((result) => result.checkpoint.session), sessions);
      const listed = await Promise.all(sessions.map((session) => pool.list({ path: repo, session })));
      assert.deepEqual(listed.map((result) => result.checkpoints.length), sessions.map(() => 1));
      assert.equal(new Set(sessions.map((session) => pool.connectionFor(session))).size, size);
    } finally {
      await pool.close();
      await daemon.stop();
    }
  });
}
