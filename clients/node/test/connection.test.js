// One connection: pipelined calls answered out of order, subscriptions as
// async iterators, the line limits of both sides, and how it ends.

import assert from "node:assert/strict";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";

import { makeRepo, startDaemon, waitFor, writeFiles } from "./helpers.js";
import {
  ConnectionClosedError,
  InvalidRequestError,
  NotFoundError,
  ResponseTooLongError,
  Subscription,
  connect,
} from "../src/index.js";

let daemon;

before(async () => {
  daemon = await startDaemon();
});

after(async () => {
  await daemon?.stop();
});

/** A repository with `count` files, so that a first (full) capture takes a while. */
function bigRepo(count) {
  const files = {};
  for (let i = 0; i < count; i++) files[`dir${i % 20}/file${i}.txt`] = `content ${i}\n`.repeat(20);
  return makeRepo(files);
}

describe("pipelining", () => {
  test("calls sent together are answered as they finish and matched by id", async () => {
    const sd = await connect({ socket: daemon.socket });
    try {
      const repos = [bigRepo(1000), bigRepo(1000)];
      const answered = [];
      const track = (name, promise) => promise.then((result) => { answered.push(name); return result; });
      // Nothing is awaited until every request is written.
      const captures = repos.map((repo, i) => track(`checkpoint ${i}`, sd.checkpoint({ path: repo, label: `repo ${i}` })));
      const pings = [1, 2, 3].map((i) => track(`ping ${i}`, sd.ping()));
      const results = await Promise.all([...captures, ...pings]);

      assert.ok(answered.indexOf("ping 1") < answered.indexOf("checkpoint 0"), `order: ${answered}`);
      for (const [i, repo] of repos.entries()) {
        const { worktree } = await sd.open(repo);
        assert.equal(results[i].checkpoint.worktree, worktree.id, "each result is its own request's");
        assert.equal(results[i].checkpoint.label, `repo ${i}`);
      }
      for (const ping of results.slice(2)) assert.equal(ping.pid, daemon.pid);
    } finally {
      await sd.close();
    }
  });

  test("close() lets the daemon answer every call already sent", async () => {
    const sd = await connect({ socket: daemon.socket });
    const repo = makeRepo();
    const calls = [sd.checkpoint({ path: repo }), sd.ping(), sd.list({ path: repo })];
    await sd.close();
    const [taken, pinged, listed] = await Promise.all(calls);
    assert.match(taken.checkpoint.id, /^[0-9a-f]{40}$/);
    assert.equal(pinged.pid, daemon.pid);
    assert.ok(Array.isArray(listed.checkpoints));
    const error = await sd.ping().catch((caught) => caught);
    assert.ok(error instanceof ConnectionClosedError);
  });
});

describe("subscribe", () => {
  test("notifications come out of the async iterator; break ends the subscription", { timeout: 60_000 }, async () => {
    const sd = await connect({ socket: daemon.socket });
    try {
      const repo = makeRepo();
      const other = makeRepo();
      const subscription = await sd.subscribe(repo);
      const quiet = await sd.subscribe({ path: other });
      assert.ok(subscription instanceof Subscription);
      assert.match(subscription.id, /\S/);
      const { worktree } = await sd.open(repo);

      writeFiles(repo, { "new.txt": "new\n" });
      let seen = null;
      for await (const change of subscription) {
        assert.equal(change.subscription, subscription.id);
        assert.equal(change.worktree, worktree.id);
        if (change.overflow || change.paths.includes("new.txt")) {
          seen = change;
          break;
        }
      }
      assert.ok(seen, "a notification named the new file");

      // `break` told the daemon to stop; the id is then unknown to it.
      await waitFor(async () => (await sd.status()).counters["calls.unsubscribe"] >= 1, "the unsubscribe");
      const error = await sd.unsubscribe(subscription.id).catch((caught) => caught);
      assert.ok(error instanceof NotFoundError, String(error));
      assert.deepEqual(await subscription.next(), { value: undefined, done: true });

      // The other subscription heard nothing of that file.
      quiet.close();
      assert.deepEqual(await quiet.next(), { value: undefined, done: true });
    } finally {
      await sd.close();
    }
  });

  test("with checkpoints: true, each checkpoint recorded there comes as a notification", { timeout: 60_000 }, async () => {
    const sd = await connect({ socket: daemon.socket });
    try {
      const repo = makeRepo();
      const timeline = await sd.subscribe(repo, { checkpoints: true });
      const taken = await sd.checkpoint({ path: repo, session: "timeline" });
      let recorded = null;
      for await (const event of timeline) {
        if (event.checkpoint) {
          recorded = event;
          break;
        }
      }
      assert.equal(recorded.subscription, timeline.id);
      assert.equal(recorded.checkpoint.id, taken.checkpoint.id);
      assert.equal(recorded.checkpoint.session, "timeline");
    } finally {
      await sd.close();
    }
  });

  test("close() returns once nothing is in flight, even when the daemon stopped answering", async () => {
    const own = await startDaemon();
    const sd = await connect({ socket: own.socket, callTimeoutMs: 500 });
    process.kill(own.pid, "SIGSTOP"); // accepts nothing more, closes nothing
    try {
      const late = sd.ping().catch((caught) => caught);
      const started = Date.now();
      await sd.close();
      assert.ok(Date.now() - started < 6_000, `close() took ${Date.now() - started} ms`);
      assert.ok((await late) instanceof Error);
    } finally {
      process.kill(own.pid, "SIGKILL");
      await own.exit;
    }
  });

  test("close() ends the iterators; a lost daemon rejects them and every call in flight", async () => {
    const own = await startDaemon();
    const sd = await connect({ socket: own.socket });
    const subscription = await sd.subscribe(makeRepo());
    const waiting = subscription.next();
    process.kill(own.pid, "SIGSTOP"); // so that the call below cannot be answered
    const inFlight = sd.ping();
    const settled = Promise.allSettled([waiting, inFlight]);
    process.kill(own.pid, "SIGKILL");
    await own.exit;
    const [next, call] = await settled;
    assert.equal(next.status, "rejected");
    assert.ok(next.reason instanceof ConnectionClosedError, String(next.reason));
    assert.ok(call.status === "rejected" && call.reason instanceof ConnectionClosedError, String(call.reason));
    assert.ok((await sd.ping().catch((caught) => caught)) instanceof ConnectionClosedError);

    const other = await connect({ socket: daemon.socket });
    const ended = await other.subscribe(makeRepo());
    const pending = ended.next();
    await other.close();
    assert.deepEqual(await pending, { value: undefined, done: true });
  });
});

describe("line limits", () => {
  test("a reply longer than lineLimit closes the connection with ResponseTooLongError", async () => {
    const sd = await connect({ socket: daemon.socket, lineLimit: 300 });
    assert.equal((await sd.ping()).pid, daemon.pid, "a short reply passes");
    const error = await sd.status().catch((caught) => caught);
    assert.ok(error instanceof ResponseTooLongError, String(error));
    assert.equal(error.data.limit, 300);
    assert.ok((await sd.ping().catch((caught) => caught)) instanceof ResponseTooLongError);
  });

  test("a request over the daemon's limit gets its InvalidRequestError, with the limit", async () => {
    const sd = await connect({ socket: daemon.socket });
    const error = await sd.call("ping", { padding: "x".repeat(16 * 1024 * 1024 + 1) }).catch((caught) => caught);
    assert.ok(error instanceof InvalidRequestError, String(error));
    assert.equal(error.code, -32600);
    assert.equal(error.data.limit, 16 * 1024 * 1024);
    assert.ok((await sd.ping().catch((caught) => caught)) instanceof InvalidRequestError);
    const fresh = await connect({ socket: daemon.socket });
    assert.equal((await fresh.ping()).pid, daemon.pid, "the daemon stays up");
    await fresh.close();
  });
});

test("paths in params are absolute and `paths` stay relative to the worktree", async () => {
  const sd = await connect({ socket: daemon.socket });
  try {
    const repo = makeRepo({ "a.txt": "a\n", "b.txt": "b\n" });
    const { checkpoint } = await sd.checkpoint({ path: repo });
    writeFiles(repo, { "a.txt": "changed\n", "b.txt": "changed\n" });
    const cwd = process.cwd();
    process.chdir(path.dirname(repo));
    try {
      const { files } = await sd.diff({ from: checkpoint.id, path: path.basename(repo), paths: ["a.txt"] });
      assert.deepEqual(files.map((each) => each.path), ["a.txt"]);
    } finally {
      process.chdir(cwd);
    }
  } finally {
    await sd.close();
  }
});
