// The OpenCode plug-in example, driven as OpenCode drives it, against a real daemon.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { after, before, test } from "node:test";

import { PACKAGE_DIR, gitTree, makeRepo, startDaemon, writeFiles } from "./helpers.js";
import { PROBE_TIMEOUT_MS, opencodePlugin } from "../src/opencode.js";
import { connect } from "../src/index.js";
import { SnapshotdPlugin } from "../examples/opencode-plugin.js";

let daemon;

before(async () => {
  // Where the plug-in looks by default: $XDG_RUNTIME_DIR/snapshotd/snapshotd.sock.
  const folder = path.join(process.env.XDG_RUNTIME_DIR, "snapshotd");
  fs.mkdirSync(folder, { mode: 0o700, recursive: true });
  daemon = await startDaemon(path.join(folder, "snapshotd.sock"));
});

after(async () => {
  await daemon?.stop();
});

test("a turn through the plug-in's hooks reads as the conversation, and one step reverts", async () => {
  const repo = makeRepo({ "app.js": "console.log(1);\n" });
  const hooks = await SnapshotdPlugin({ directory: repo, worktree: repo });
  const session = "ses_test_1";

  await hooks["chat.message"]({ sessionID: session }, { parts: [{ type: "text", text: "Add a greeting\nand more" }] });
  await hooks["tool.execute.before"]({ tool: "read", sessionID: session, callID: "c0" }, { args: { filePath: "app.js" } });
  await hooks["tool.execute.before"]({ tool: "bash", sessionID: session, callID: "c1" }, { args: { command: "echo hi > hi.txt" } });
  writeFiles(repo, { "hi.txt": "hi\n" });
  await hooks["tool.execute.after"]({ tool: "bash", sessionID: session, callID: "c1" }, { title: "echo hi > hi.txt", output: "", metadata: {} });
  await hooks["tool.execute.before"]({ tool: "edit", sessionID: session, callID: "c2" }, { args: { filePath: path.join(repo, "app.js") } });
  writeFiles(repo, { "app.js": "console.log('hello');\n" });
  await hooks["tool.execute.after"]({ tool: "edit", sessionID: session, callID: "c2" }, { title: "app.js", output: "", metadata: {} });
  await hooks.event({ event: { type: "session.idle", properties: { sessionID: session } } });

  const sd = await connect({ socket: daemon.socket });
  try {
    const { checkpoints } = await sd.list({ path: repo, session });
    assert.deepEqual(checkpoints.map((each) => each.label).reverse(), [
      "before: Add a greeting",
      "before bash: echo hi > hi.txt",
      "after bash: echo hi > hi.txt",
      "before edit: app.js",
      "after edit: app.js",
      "after turn",
    ]);
    assert.equal(checkpoints[0].tree, gitTree(repo));

    // Take back the bash step only: hi.txt goes, the edit stays.
    const byLabel = Object.fromEntries(checkpoints.map((each) => [each.label, each.id]));
    const result = await sd.revert({ from: byLabel["before bash: echo hi > hi.txt"], to: byLabel["after bash: echo hi > hi.txt"] });
    assert.deepEqual(result.deleted, ["hi.txt"]);
    assert.equal(fs.existsSync(path.join(repo, "hi.txt")), false);
    assert.equal(fs.readFileSync(path.join(repo, "app.js"), "utf8"), "console.log('hello');\n");
  } finally {
    await sd.close();
  }
});

test("a plug-in whose worktree the daemon refuses reports once on stderr and never throws", () => {
  const plugin = new URL("../examples/opencode-plugin.js", import.meta.url).href;
  const script = `
    const { SnapshotdPlugin } = await import(${JSON.stringify(plugin)});
    const hooks = await SnapshotdPlugin({ directory: "/nonexistent/project", worktree: "" });
    await hooks["chat.message"]({ sessionID: "s" }, { parts: [] });
    await hooks.event({ event: { type: "session.idle", properties: { sessionID: "s" } } });
    process.exit(0);`;
  const run = spawnSync(process.execPath, ["--input-type=module", "-e", script], {
    cwd: PACKAGE_DIR,
    env: { ...process.env, SNAPSHOTD_SOCKET: daemon.socket },
    encoding: "utf8",
  });
  assert.equal(run.status, 0, run.stderr);
  assert.equal(run.stdout, "");
  const lines = run.stderr.trim().split("\n");
  assert.equal(lines.length, 1, run.stderr);
  assert.match(lines[0], /^snapshotd: a checkpoint was not recorded \(.*\/nonexistent\/project.*snapshotd doctor opencode/);
});

test("a subagent's checkpoints are recorded in its parent's session, inside the parent's turn", async () => {
  const repo = makeRepo({ "app.js": "console.log(1);\n" });
  const parent = "ses_parent";
  const child = "ses_child";
  const asked = [];
  const opencode = { session: { get: async ({ path: { id } }) => (asked.push(id), { data: { id, parentID: id === child ? parent : undefined } }) } };
  const hooks = await SnapshotdPlugin({ directory: repo, worktree: repo, client: opencode });

  await hooks["chat.message"]({ sessionID: parent }, { parts: [{ type: "text", text: "Delegate it" }] });
  await hooks["tool.execute.before"]({ tool: "task", sessionID: parent, callID: "t1" }, { args: { prompt: "do it" } });
  await hooks["chat.message"]({ sessionID: child, agent: "general" }, { parts: [{ type: "text", text: "do it" }] });
  await hooks["tool.execute.before"]({ tool: "write", sessionID: child, callID: "w1" }, { args: { filePath: path.join(repo, "sub.txt") } });
  writeFiles(repo, { "sub.txt": "sub\n" });
  await hooks["tool.execute.after"]({ tool: "write", sessionID: child, callID: "w1", args: { filePath: path.join(repo, "sub.txt") } }, { title: "sub.txt" });
  await hooks.event({ event: { type: "session.idle", properties: { sessionID: child } } });
  await hooks.event({ event: { type: "session.idle", properties: { sessionID: parent } } });

  const sd = await connect({ socket: daemon.socket });
  try {
    const { checkpoints } = await sd.list({ path: repo, session: parent });
    assert.deepEqual(checkpoints.map((each) => each.label).reverse(), [
      "before: Delegate it", "before subagent: do it", "before write: sub.txt", "after write: sub.txt", "after subagent", "after turn",
    ]);
    assert.equal((await sd.list({ path: repo, session: child })).checkpoints.length, 0);
    assert.equal(checkpoints[0].tree, gitTree(repo));
    assert.deepEqual(asked, [parent, child]); // each session is asked about once
    const byLabel = Object.fromEntries(checkpoints.map((each) => [each.label, each.agent]));
    assert.deepEqual(byLabel["before: Delegate it"], { tool: "opencode", session: parent });
    assert.deepEqual(byLabel["before write: sub.txt"], { tool: "opencode", session: parent, subagent: child, tool_use: "w1" });
    assert.deepEqual(byLabel["after subagent"], { tool: "opencode", session: parent, subagent: child });
  } finally {
    await sd.close();
  }
});

test("a daemon that accepts and never answers costs one budget, then each hook a quick ping", async () => {
  const folder = fs.mkdtempSync(path.join(process.env.XDG_RUNTIME_DIR, "hung-"));
  const socket = path.join(folder, "s.sock");
  const server = net.createServer(() => {}); // accepts, reads nothing, answers nothing
  await new Promise((resolve) => server.listen(socket, resolve));
  try {
    const hooks = await opencodePlugin({ socket, beforeBudgetMs: 1500 })({ directory: "/", worktree: "" });
    const started = Date.now();
    await hooks["chat.message"]({ sessionID: "s" }, { parts: [{ type: "text", text: "hello" }] });
    const first = Date.now() - started;
    await hooks["tool.execute.before"]({ tool: "write", sessionID: "s", callID: "c" }, { args: { filePath: "/x" } });
    await hooks["tool.execute.after"]({ tool: "write", sessionID: "s", callID: "c" }, { title: "x" });
    await hooks.event({ event: { type: "session.idle", properties: { sessionID: "s" } } });
    await hooks.dispose();
    const total = Date.now() - started;
    assert.ok(first >= 1400 && first < 5000, `the first hook took ${first} ms`);
    assert.ok(total < first + 3 * PROBE_TIMEOUT_MS + 2000, `the whole turn took ${total} ms`);
    const last = JSON.parse(fs.readFileSync(path.join(process.env.SNAPSHOTD_HOME, "hooks", "last-opencode.json"), "utf8"));
    assert.equal(last.ok, false);
    assert.match(last.note, /does not answer|did not answer/);
  } finally {
    server.close();
  }
});
