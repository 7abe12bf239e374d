// Finding the daemon as the command line does, and refusing a socket folder
// that another user could have put a socket in.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";

import { SNAPSHOTD_BIN, startDaemon, tempDir, waitFor } from "./helpers.js";
import { DaemonUnreachableError, UnsafeSocketFolderError, connect, resolveSocketPath } from "../src/index.js";

const NOBODY = 65534;

describe("resolveSocketPath", () => {
  test("the option, then SNAPSHOTD_SOCKET, then XDG_RUNTIME_DIR, then /tmp/snapshotd-<uid>", () => {
    const env = { SNAPSHOTD_SOCKET: "/run/a.sock", XDG_RUNTIME_DIR: "/run/user/7" };
    assert.equal(resolveSocketPath("/x/given.sock", env), "/x/given.sock");
    assert.equal(resolveSocketPath(undefined, env), "/run/a.sock");
    assert.equal(resolveSocketPath("", { ...env, SNAPSHOTD_SOCKET: "" }), "/run/user/7/snapshotd/snapshotd.sock");
    assert.equal(resolveSocketPath(undefined, { XDG_RUNTIME_DIR: "relative/run" }),
      `/tmp/snapshotd-${process.getuid()}/snapshotd.sock`);
    assert.equal(resolveSocketPath(undefined, {}), `/tmp/snapshotd-${process.getuid()}/snapshotd.sock`);
  });

  test("a relative path is made absolute", () => {
    assert.equal(resolveSocketPath("rel.sock", {}), path.resolve("rel.sock"));
    assert.equal(resolveSocketPath(undefined, { SNAPSHOTD_SOCKET: "rel.sock" }), path.resolve("rel.sock"));
  });
});

describe("connect finds the daemon the command line finds", () => {
  let daemon;
  let runtime;

  before(async () => {
    runtime = tempDir("sdc-run-");
    fs.mkdirSync(path.join(runtime, "snapshotd"), { mode: 0o700 });
    daemon = await startDaemon(path.join(runtime, "snapshotd", "snapshotd.sock"));
  });

  after(async () => {
    await daemon?.stop();
  });

  /** The pid of the daemon that `snapshotd status` reaches with this environment. */
  function cliDaemonPid(env) {
    return JSON.parse(execFileSync(SNAPSHOTD_BIN, ["--json", "status"], { env, encoding: "utf8" })).pid;
  }

  test("through XDG_RUNTIME_DIR", async () => {
    const env = { ...process.env, XDG_RUNTIME_DIR: runtime };
    delete env.SNAPSHOTD_SOCKET;
    const sd = await connect({ env });
    try {
      assert.equal((await sd.ping()).pid, daemon.pid);
      assert.equal(cliDaemonPid(env), daemon.pid);
    } finally {
      await sd.close();
    }
  });

  test("through SNAPSHOTD_SOCKET, over XDG_RUNTIME_DIR", async () => {
    const env = { ...process.env, SNAPSHOTD_SOCKET: daemon.socket, XDG_RUNTIME_DIR: tempDir("sdc-other-") };
    const sd = await connect({ env });
    try {
      assert.equal(sd.socketPath, daemon.socket);
      assert.equal((await sd.ping()).pid, daemon.pid);
      assert.equal(cliDaemonPid(env), daemon.pid);
    } finally {
      await sd.close();
    }
  });

  test("no daemon and no autostart: DaemonUnreachableError, and nothing is created", async () => {
    const missing = path.join(tempDir("sdc-none-"), "sub", "snapshotd.sock");
    const error = await connect({ socket: missing }).catch((caught) => caught);
    assert.ok(error instanceof DaemonUnreachableError, String(error));
    assert.match(error.message, /No snapshotd is running at .*autostart/);
    assert.equal(fs.existsSync(path.dirname(missing)), false);
  });

  test("a socket path too long for a Unix socket", async () => {
    const error = await connect({ socket: `/tmp/${"x".repeat(120)}.sock` }).catch((caught) => caught);
    assert.ok(error instanceof DaemonUnreachableError, String(error));
    assert.match(error.message, /longer than 107 bytes/);
  });
});

describe("the socket folder must be private", () => {
  let daemon;
  before(async () => { daemon = await startDaemon(); });
  after(async () => { await daemon.stop(); });

  /** A listener standing in for a socket another user planted; counts who connects. */
  async function impostor(folder) {
    const socketPath = path.join(folder, "snapshotd.sock");
    const server = net.createServer((peer) => {
      server.connections += 1;
      // Answers the client's first line (its confirming ping), then hangs up.
      peer.once("data", (chunk) => {
        const { id } = JSON.parse(chunk.toString("utf8").split("\n")[0]);
        peer.end(`${JSON.stringify({ jsonrpc: "2.0", id, result: { version: "0", pid: 1, uptime_s: 0 } })}\n`);
      });
    });
    server.connections = 0;
    await new Promise((resolve) => server.listen(socketPath, resolve));
    return { server, socketPath };
  }

  async function assertRefused(folder, pattern) {
    const { server, socketPath } = await impostor(folder);
    try {
      const error = await connect({ socket: socketPath }).catch((caught) => caught);
      assert.ok(error instanceof UnsafeSocketFolderError, String(error));
      assert.match(error.message, pattern);
      assert.equal(error.data.folder, folder);
      assert.equal(server.connections, 0, "nothing was sent to the socket");
      // The same folder made private is used.
      fs.chownSync(folder, process.geteuid(), process.getegid());
      fs.chmodSync(folder, 0o700);
      const sd = await connect({ socket: socketPath });
      sd.destroy();
      await waitFor(() => server.connections === 1, "the connection to the private folder's socket");
    } finally {
      server.close();
    }
  }

  test("a folder of another user is refused before connecting", { skip: process.geteuid() !== 0 && "needs root to chown" }, async () => {
    const folder = tempDir("sdc-theirs-");
    fs.chownSync(folder, NOBODY, NOBODY);
    await assertRefused(folder, new RegExp(`it belongs to uid ${NOBODY}, not ${process.geteuid()}`));
  });

  test("a folder that the group may write to is refused", async () => {
    const folder = tempDir("sdc-group-");
    fs.chmodSync(folder, 0o770);
    await assertRefused(folder, /other users may write to it \(mode 0770\)/);
  });

  test("a folder that is a symlink is refused, even to a private folder with a daemon", async () => {
    const real = path.dirname(daemon.socket);
    const link = path.join(tempDir("sdc-link-"), "run");
    fs.symlinkSync(real, link);
    const error = await connect({ socket: path.join(link, path.basename(daemon.socket)) }).catch((caught) => caught);
    assert.ok(error instanceof UnsafeSocketFolderError, String(error));
    assert.match(error.message, /Refusing the socket folder .*: it is a symlink/);
  });

  test("a folder that anyone may write to is refused", async () => {
    const folder = tempDir("sdc-world-");
    fs.chmodSync(folder, 0o1777);
    await assertRefused(folder, /other users may write to it \(mode 1777\)/);
  });
});
