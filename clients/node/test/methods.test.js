// The typed methods against a real daemon on real git repositories; git
// itself is the oracle for what a checkpoint holds.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";

import { git, gitTree, makeRepo, startDaemon, writeFiles } from "./helpers.js";
import {
  AmbiguousError,
  ApplicationError,
  InvalidParamsError,
  MethodNotFoundError,
  NotFoundError,
  PathOutsideWorktreeError,
  SnapshotdError,
  WorktreeMismatchError,
  connect,
} from "../src/index.js";

let daemon;
let sd;

before(async () => {
  daemon = await startDaemon();
  sd = await connect({ socket: daemon.socket });
});

after(async () => {
  await sd?.close();
  await daemon?.stop();
});

describe("the daemon's own methods", () => {
  test("ping names the daemon's process", async () => {
    const result = await sd.ping();
    assert.equal(result.pid, daemon.pid);
    assert.equal(typeof result.version, "string");
  });

  test("open, worktrees and status report the worktree", async () => {
    const repo = makeRepo();
    const { worktree } = await sd.open(repo);
    assert.equal(worktree.path, fs.realpathSync(repo));
    assert.equal(worktree.kind, "git");
    assert.equal(worktree.branch, "main");
    assert.equal(worktree.head, git(repo, "rev-parse", "HEAD").trim());
    assert.ok((await sd.worktrees()).worktrees.some((each) => each.id === worktree.id));
    const known = await sd.worktrees({ known: true });
    assert.ok(known.worktrees.some((each) => each.id === worktree.id && each.open === true));
    const status = await sd.status();
    assert.ok(status.worktrees.some((each) => each.id === worktree.id));
    assert.ok(status.counters["calls.open"] >= 1);
  });

  test("a relative path is taken from this process's folder, not the daemon's", async () => {
    const repo = makeRepo();
    const cwd = process.cwd();
    process.chdir(path.dirname(repo));
    try {
      const { worktree } = await sd.open(path.basename(repo));
      assert.equal(worktree.path, fs.realpathSync(repo));
    } finally {
      process.chdir(cwd);
    }
  });
});

describe("a turn: checkpoint, list, show, diff, revert, restore", () => {
  let repo;
  let first;
  let second;

  before(async () => {
    repo = makeRepo({ "src/app.py": "print('hello')\n", "keep.txt": "keep\n" });
    first = (await sd.checkpoint({ path: repo, session: "thread-7", label: "before turn 1" })).checkpoint;
    writeFiles(repo, { "src/app.py": "print('hello')\nprint('bye')\n", "src/util.py": "X = 1\n" });
    fs.rmSync(path.join(repo, "keep.txt"));
    const taken = await sd.checkpoint({ path: repo, session: "thread-7", label: "after turn 1" });
    second = taken.checkpoint;
    assert.ok(["full", "watch", "none"].includes(taken.stats.scan));
  });

  test("each checkpoint's tree is the tree git writes", async () => {
    assert.equal(second.tree, gitTree(repo));
    assert.equal(second.parent, first.id);
    assert.equal(second.seq, first.seq + 1);
    assert.equal(second.changed, true);
    assert.equal(second.session, "thread-7");
  });

  test("list gives the session newest first, and limit bounds it", async () => {
    const { checkpoints } = await sd.list({ path: repo, session: "thread-7" });
    assert.deepEqual(checkpoints.map((each) => each.label), ["after turn 1", "before turn 1"]);
    const limited = await sd.list({ path: repo, session: "thread-7", limit: 1 });
    assert.deepEqual(limited.checkpoints.map((each) => each.id), [second.id]);
  });

  test("show takes a prefix, as a string or in params", async () => {
    assert.deepEqual((await sd.show(first.id.slice(0, 8))).checkpoint, first);
    assert.deepEqual((await sd.show({ checkpoint: second.id, path: repo })).checkpoint, second);
  });

  test("diff between the two checkpoints, with the patch", async () => {
    const { files, patch } = await sd.diff({ from: first.id, to: second.id, patch: true });
    const byPath = Object.fromEntries(files.map((each) => [each.path, each.status]));
    assert.deepEqual(byPath, { "keep.txt": "deleted", "src/app.py": "modified", "src/util.py": "added" });
    assert.match(patch, /\+print\('bye'\)/);
  });

  test("diff against the live worktree when `to` is left out", async () => {
    writeFiles(repo, { "live.txt": "live\n" });
    try {
      const { files } = await sd.diff({ from: second.id, path: repo });
      assert.deepEqual(files.map((each) => [each.path, each.status]), [["live.txt", "added"]]);
    } finally {
      fs.rmSync(path.join(repo, "live.txt"));
    }
  });

  test("a dry-run revert reports and changes nothing; a revert undoes the turn", async () => {
    const preview = await sd.revert({ from: first.id, to: second.id, dry_run: true });
    assert.equal(preview.safety_checkpoint, null);
    assert.deepEqual(preview.written.sort(), ["keep.txt", "src/app.py"]);
    assert.deepEqual(preview.deleted, ["src/util.py"]);
    assert.ok(fs.existsSync(path.join(repo, "src/util.py")));

    const reverted = await sd.revert({ from: first.id, to: second.id });
    assert.deepEqual(reverted.conflicts, []);
    assert.equal(reverted.safety_checkpoint.session, "snapshotd:safety");
    assert.equal(gitTree(repo), first.tree);

    // And back again: restore the state after the turn.
    const restored = await sd.restore({ checkpoint: second.id });
    assert.equal(restored.safety_checkpoint.tree, first.tree);
    assert.equal(gitTree(repo), second.tree);
  });

  test("a revert leaves a path changed since alone and reports it", async () => {
    writeFiles(repo, { "src/util.py": "X = 2  # changed by someone else\n" });
    const result = await sd.revert({ from: first.id, to: second.id });
    assert.deepEqual(result.conflicts.map((each) => each.path), ["src/util.py"]);
    assert.equal(fs.readFileSync(path.join(repo, "src/util.py"), "utf8"), "X = 2  # changed by someone else\n");
    assert.equal(fs.readFileSync(path.join(repo, "src/app.py"), "utf8"), "print('hello')\n");
  });

  test("restore of some paths only", async () => {
    const result = await sd.restore({ checkpoint: second.id, paths: ["src/app.py"] });
    assert.deepEqual(result.written, ["src/app.py"]);
    assert.deepEqual(result.deleted, []);
    assert.equal(fs.readFileSync(path.join(repo, "src/app.py"), "utf8"), "print('hello')\nprint('bye')\n");
    assert.ok(fs.existsSync(path.join(repo, "keep.txt")), "a path outside `paths` stays");
  });

  test("delete of a session, then gc of the worktree", async () => {
    await sd.checkpoint({ path: repo, session: "scratch" });
    assert.equal((await sd.delete({ path: repo, session: "scratch" })).deleted, 1);
    assert.deepEqual((await sd.list({ path: repo, session: "scratch" })).checkpoints, []);
    const gc = await sd.gc({ path: repo, keep: 1 });
    assert.ok(gc.deleted >= 1, "the older thread-7 checkpoint goes");
    assert.deepEqual((await sd.list({ path: repo, session: "thread-7" })).checkpoints.map((each) => each.id), [second.id]);
  });

  test("repair with nothing moved", async () => {
    assert.deepEqual(await sd.repair({ path: repo }), { moved: [], mended: [], gone: [] });
  });
});

test("a file name that is not UTF-8 goes out and back as the daemon writes it (U+DC00+byte)", async () => {
  const repo = makeRepo();
  const rawName = Buffer.concat([Buffer.from(repo + "/caf"), Buffer.from([0xff]), Buffer.from(".txt")]);
  fs.writeFileSync(rawName, "bytes\n");
  const { checkpoint } = await sd.checkpoint({ path: repo });
  fs.rmSync(rawName);
  const { files } = await sd.diff({ from: checkpoint.id, path: repo });
  assert.deepEqual(files.map((each) => [each.path, each.status]), [["caf\udcff.txt", "deleted"]]);
  const restored = await sd.restore({ checkpoint: checkpoint.id, paths: [files[0].path] });
  assert.deepEqual(restored.written, ["caf\udcff.txt"]);
  assert.equal(fs.readFileSync(rawName, "utf8"), "bytes\n");
});

describe("errors come back as their classes", () => {
  test("an unknown checkpoint is a NotFoundError with its kind and code", async () => {
    const error = await sd.show("0000000").catch((caught) => caught);
    assert.ok(error instanceof NotFoundError);
    assert.ok(error instanceof ApplicationError && error instanceof SnapshotdError);
    assert.equal(error.kind, "not_found");
    assert.equal(error.code, -32000);
    assert.equal(error.method, "show");
    assert.match(error.message, /0000000/);
  });

  test("a missing param is an InvalidParamsError", async () => {
    const error = await sd.checkpoint({}).catch((caught) => caught);
    assert.ok(error instanceof InvalidParamsError, String(error));
    assert.equal(error.code, -32602);
    assert.equal(error.kind, null);
  });

  test("a path outside the worktree is a PathOutsideWorktreeError", async () => {
    const repo = makeRepo();
    const { checkpoint } = await sd.checkpoint({ path: repo });
    const error = await sd.restore({ checkpoint: checkpoint.id, paths: ["/etc/passwd"] }).catch((caught) => caught);
    assert.ok(error instanceof PathOutsideWorktreeError, String(error));
  });

  test("a restore into another worktree is a WorktreeMismatchError", async () => {
    const one = makeRepo();
    const other = makeRepo();
    const { checkpoint } = await sd.checkpoint({ path: one });
    const error = await sd.restore({ checkpoint: checkpoint.id, path: other }).catch((caught) => caught);
    assert.ok(error instanceof WorktreeMismatchError, String(error));
    assert.equal(error.kind, "worktree_mismatch");
  });

  test("an unknown method is a MethodNotFoundError", async () => {
    const error = await sd.call("no_such_method").catch((caught) => caught);
    assert.ok(error instanceof MethodNotFoundError);
    assert.equal(error.code, -32601);
  });
});

describe("the December additions", () => {
  // Each is typed; a daemon that does not have it yet answers method not found.
  async function callOrMissing(promise, check) {
    try {
      check(await promise);
    } catch (error) {
      assert.ok(error instanceof MethodNotFoundError, `expected a result or MethodNotFoundError, got ${error}`);
      assert.equal(error.code, -32601);
    }
  }

  test("resolve and show take @, @~N, #N, SESSION@ and SESSION@~N", async () => {
    const repo = makeRepo();
    const first = (await sd.checkpoint({ path: repo, session: "node-t1" })).checkpoint;
    const second = (await sd.checkpoint({ path: repo, session: "node-t1" })).checkpoint;
    assert.equal((await sd.resolve({ checkpoint: "@", path: repo, session: "node-t1" })).checkpoint.id, second.id);
    assert.equal((await sd.resolve({ checkpoint: "node-t1@", path: repo })).checkpoint.id, second.id);
    assert.equal((await sd.resolve({ checkpoint: "node-t1@~1", path: repo })).checkpoint.id, first.id);
    assert.equal((await sd.show({ checkpoint: "#1", path: repo, session: "node-t1" })).checkpoint.id, first.id);
    assert.equal((await sd.resolve(first.id.slice(0, 9))).checkpoint.id, first.id);
    await sd.checkpoint({ path: repo, session: "other" });
    const error = await sd.resolve({ checkpoint: "#1", path: repo }).catch((caught) => caught);
    assert.ok(error instanceof AmbiguousError, String(error));
    assert.deepEqual(error.candidates.map((each) => each.session).sort(), ["node-t1", "other"]);
  });

  test("verify", async () => {
    const repo = makeRepo();
    await callOrMissing(sd.verify(repo), (result) => {
      assert.deepEqual(result.differences, []);
      assert.equal(typeof result.scan_ms, "number");
    });
  });

  test("push and fetch to a remote", async () => {
    const remote = makeRepo();
    const repo = makeRepo();
    git(repo, "remote", "add", "origin", remote);
    await sd.checkpoint({ path: repo, session: "s" });
    await callOrMissing(sd.push({ path: repo, remote: "origin" }), (result) => {
      assert.equal(result.remote, "origin");
      assert.ok(result.pushed.length >= 1);
    });
    await callOrMissing(sd.fetch({ path: repo, remote: "origin" }), (result) => {
      assert.equal(result.remote, "origin");
      assert.ok(Array.isArray(result.fetched));
    });
  });
});
