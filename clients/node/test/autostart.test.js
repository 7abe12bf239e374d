// Starting a daemon when none runs, as the command line does.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { test } from "node:test";

import { SNAPSHOTD_BIN, alive, tempDir, waitFor } from "./helpers.js";
import { endIfSpare, startAndConnect } from "../src/autostart.js";
import { DaemonUnreachableError, UnsafeSocketFolderError, connect } from "../src/index.js";

/** Stop the daemon `sd` talks to and wait for its process to end. */
async function shutdown(sd) {
  const { pid } = await sd.ping();
  await sd.shutdown();
  await sd.close();
  await waitFor(() => !alive(pid), `daemon ${pid} to exit`);
}

/** The session id of a process (field 6 of /proc/PID/stat). */
function sessionOf(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[3]);
}

test("autostart runs `snapshotd serve` detached, from /, in a private folder", async () => {
  const socketPath = path.join(tempDir("sdc-auto-"), "new", "snapshotd.sock");
  const sd = await connect({ socket: socketPath, autostart: true, daemonCommand: [SNAPSHOTD_BIN] });
  const { pid } = await sd.ping();
  try {
    assert.notEqual(pid, process.pid);
    assert.equal(sessionOf(pid), pid, "it leads a session of its own");
    assert.equal(fs.readlinkSync(`/proc/${pid}/cwd`), "/");
    assert.equal(fs.statSync(path.dirname(socketPath)).mode & 0o777, 0o700);
    const log = path.join(path.dirname(socketPath), "snapshotd.log");
    assert.equal(fs.statSync(log).mode & 0o777, 0o600);
    const again = await connect({ socket: socketPath, autostart: true, daemonCommand: ["/nonexistent/snapshotd"] });
    assert.equal((await again.ping()).pid, pid, "a running daemon is used, not started again");
    await again.close();
  } finally {
    await shutdown(sd);
  }
});

/** Pids of the processes serving (or starting to serve) `socketPath`, from their command lines. */
function serversOn(socketPath) {
  const pids = [];
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let argv;
    try {
      argv = fs.readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
    } catch {
      continue; // gone meanwhile
    }
    const at = argv.indexOf("--socket");
    if (argv.includes("serve") && at >= 0 && argv[at + 1] === socketPath) pids.push(Number(entry));
  }
  return pids;
}

test("two clients starting at once reach the same daemon, and the other one started ends", async () => {
  const socketPath = path.join(tempDir("sdc-race-"), "snapshotd.sock");
  const options = { socket: socketPath, autostart: true, daemonCommand: [SNAPSHOTD_BIN] };
  const [one, two] = await Promise.all([connect(options), connect(options)]);
  const [a, b] = await Promise.all([one.ping(), two.ping()]);
  assert.equal(a.pid, b.pid);
  await waitFor(() => serversOn(socketPath).every((pid) => pid === a.pid), "the race's loser to end");
  await two.close();
  await shutdown(one);
  assert.deepEqual(serversOn(socketPath), []);
});

test("a daemon started while another answers is ended, so none takes the path later", async () => {
  const socketPath = path.join(tempDir("sdc-spare-"), "snapshotd.sock");
  const winner = await connect({ socket: socketPath, autostart: true, daemonCommand: [SNAPSHOTD_BIN] });
  const tryConnect = () => new Promise((resolve) => {
    const socket = net.createConnection(socketPath, () => resolve(socket));
    socket.once("error", () => resolve(null));
  });
  const { socket, started } = await startAndConnect(socketPath, tryConnect, { command: [SNAPSHOTD_BIN] });
  socket.destroy();
  assert.notEqual(started.pid, winner.daemon.pid);
  endIfSpare(started, winner.daemon);
  await shutdown(winner); // before the spare, still starting, could have taken the lock
  await waitFor(() => !alive(started.pid), "the spare daemon to end");
  assert.deepEqual(serversOn(socketPath), []);
  assert.equal(fs.existsSync(socketPath), false);
});

test("a command that is not there", async () => {
  const socketPath = path.join(tempDir("sdc-nocmd-"), "snapshotd.sock");
  const error = await connect({ socket: socketPath, autostart: true, daemonCommand: ["/nonexistent/snapshotd"] })
    .catch((caught) => caught);
  assert.ok(error instanceof DaemonUnreachableError, String(error));
  assert.match(error.message, /\/nonexistent\/snapshotd was not found/);
});

test("a daemon that exits at start: its reason and its log", async () => {
  const socketPath = path.join(tempDir("sdc-fail-"), "snapshotd.sock");
  const daemonCommand = ["sh", "-c", "echo 'error: the store is on fire.' >&2; exit 3", "sh"];
  const error = await connect({ socket: socketPath, autostart: true, daemonCommand }).catch((caught) => caught);
  assert.ok(error instanceof DaemonUnreachableError, String(error));
  assert.match(error.message, /could not start on .* \(exit status 3\): the store is on fire; see .*snapshotd\.log/);
});

test("a daemon that never listens: a time-out", async () => {
  const folder = tempDir("sdc-slow-");
  const pidFile = path.join(folder, "pid");
  const daemonCommand = ["sh", "-c", `echo $$ > ${pidFile}; exec sleep 60`, "sh"];
  const error = await connect({ socket: path.join(folder, "s.sock"), autostart: true, daemonCommand, startTimeoutMs: 300 })
    .catch((caught) => caught);
  try {
    assert.ok(error instanceof DaemonUnreachableError, String(error));
    assert.match(error.message, /did not start on .* within 0.3 s/);
  } finally {
    process.kill(Number(fs.readFileSync(pidFile, "utf8")), "SIGKILL");
  }
});

test("autostart does not start a daemon in another user's folder", { skip: process.geteuid() !== 0 && "needs root to chown" }, async () => {
  const folder = tempDir("sdc-theirs-");
  fs.chownSync(folder, 65534, 65534);
  const marker = path.join(tempDir("sdc-marker-"), "ran");
  const daemonCommand = ["sh", "-c", `touch ${marker}`, "sh"];
  const error = await connect({ socket: path.join(folder, "s.sock"), autostart: true, daemonCommand })
    .catch((caught) => caught);
  assert.ok(error instanceof UnsafeSocketFolderError, String(error));
  assert.equal(fs.existsSync(marker), false, "the command did not run");
});

test("a planted snapshotd.log link is refused, not appended to or re-moded", async () => {
  const folder = tempDir("sdc-loglink-");
  const precious = path.join(tempDir("sdc-precious-"), "precious.txt");
  fs.writeFileSync(precious, "precious\n", { mode: 0o644 });
  fs.chmodSync(precious, 0o644);
  fs.symlinkSync(precious, path.join(folder, "snapshotd.log"));
  const marker = path.join(tempDir("sdc-marker-"), "ran");
  const daemonCommand = ["sh", "-c", `touch ${marker}; echo started`, "sh"];
  const error = await connect({ socket: path.join(folder, "s.sock"), autostart: true, daemonCommand })
    .catch((caught) => caught);
  assert.ok(error instanceof UnsafeSocketFolderError, String(error));
  assert.match(error.message, /Refusing the log .*snapshotd\.log: it is a symlink/);
  assert.equal(fs.readFileSync(precious, "utf8"), "precious\n");
  assert.equal(fs.statSync(precious).mode & 0o7777, 0o644);
  assert.equal(fs.existsSync(marker), false, "no daemon was started");
});
