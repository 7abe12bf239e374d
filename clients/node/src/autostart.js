// Starting a daemon when none runs, as the command line does: `snapshotd
// serve --socket PATH` detached in a session of its own, from `/`, logging to
// `snapshotd.log` beside the socket (opened through the checked folder, never
// through a link); then connecting until it answers.

import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { DaemonUnreachableError, UnsafeSocketFolderError } from "./errors.js";
import { openSocketFolder } from "./socket.js";

export const DEFAULT_DAEMON_COMMAND = Object.freeze(["snapshotd"]);
export const DEFAULT_START_TIMEOUT_MS = 10_000;
const POLL_MS = 50;
const { O_APPEND, O_CREAT, O_NOFOLLOW, O_NONBLOCK, O_RDONLY, O_WRONLY } = fs.constants;
const LOG_TAIL_BYTES = 4096;
// A daemon that lost a start race to another exits at once, while the winner
// may not listen yet: keep trying this long after the child exits.
const RACE_GRACE_MS = 2_000;

/**
 * Start a daemon on `socketPath` and return a connection to it (or to one that
 * another client started meanwhile), with the started daemon for {@link endIfSpare}.
 * @param {string} socketPath absolute
 * @param {() => Promise<import("node:net").Socket | null>} tryConnect null while nobody listens
 * @param {{command?: readonly string[], env?: Record<string, string | undefined>, timeoutMs?: number}} options
 * @returns {Promise<{socket: import("node:net").Socket, started: StartedDaemon}>}
 */
export async function startAndConnect(socketPath, tryConnect, options) {
  const { command = DEFAULT_DAEMON_COMMAND, env = process.env, timeoutMs = DEFAULT_START_TIMEOUT_MS } = options;
  const daemon = startDaemon(socketPath, command, env);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const socket = await tryConnect();
    if (socket) return { socket, started: daemon };
    if (daemon.spawnError) throw notStartedError(command, daemon.spawnError);
    if (daemon.exitedAt !== null && Date.now() > daemon.exitedAt + RACE_GRACE_MS) {
      const why = lastLine(daemon.logPath);
      throw new DaemonUnreachableError(
        `The daemon could not start on ${socketPath} (exit status ${daemon.status})${why ? `: ${why}` : ""}; see ${daemon.logPath}.`,
        { data: { socket: socketPath, log: daemon.logPath } },
      );
    }
    if (Date.now() > deadline) {
      throw new DaemonUnreachableError(
        `The daemon did not start on ${socketPath} within ${timeoutMs / 1000} s; see ${daemon.logPath}.`,
        { data: { socket: socketPath, log: daemon.logPath } },
      );
    }
    await sleep(POLL_MS);
  }
}

/**
 * End the daemon started here when another one answered the connection: one
 * that lost a start race would otherwise take the socket over once the winner
 * stops, serving no one. The child leads its own process group (a wrapper
 * command's daemon stays in it), so a daemon outside that group is another.
 * @param {StartedDaemon} started
 * @param {{pid?: number, pgid?: number} | null} answered the `ping` result
 */
export function endIfSpare(started, answered) {
  if (started.pid === undefined || started.exitedAt !== null || !answered) return;
  if ((answered.pgid ?? answered.pid) === started.pid) return;
  try {
    process.kill(-started.pid, "SIGTERM");
  } catch {
    // gone already
  }
}

/**
 * @typedef {{logPath: string, pid: number | undefined, exitedAt: number | null,
 *   status: number | string | null, spawnError: Error | null}} StartedDaemon
 */

/**
 * Spawn `command serve --socket socketPath` detached; its state is filled in as it runs.
 * The socket folder is created mode 0700 and must pass the same check as for connecting.
 */
function startDaemon(socketPath, command, env) {
  const folder = path.dirname(socketPath);
  fs.mkdirSync(folder, { recursive: true, mode: 0o700 });
  const held = openSocketFolder(folder);
  if (!held) throw new UnsafeSocketFolderError(`The socket folder ${folder} went away as it was made.`, { data: { folder } });
  const logPath = path.join(folder, "snapshotd.log");
  let log;
  try {
    log = openLog(held, logPath);
  } finally {
    held.close();
  }
  const childEnv = { ...env };
  if (childEnv.SNAPSHOTD_HOME) childEnv.SNAPSHOTD_HOME = path.resolve(childEnv.SNAPSHOTD_HOME);
  /** @type {StartedDaemon} */
  const daemon = { logPath, pid: undefined, exitedAt: null, status: null, spawnError: null };
  try {
    const child = spawn(command[0], [...command.slice(1), "serve", "--socket", socketPath], {
      cwd: "/", // hold no worktree as the current folder
      env: childEnv,
      detached: true,
      stdio: ["ignore", log, log],
    });
    daemon.pid = child.pid;
    child.on("error", (error) => { daemon.spawnError = error; });
    child.on("exit", (code, signal) => {
      daemon.status = code ?? signal;
      daemon.exitedAt = Date.now();
    });
    child.unref();
  } finally {
    fs.closeSync(log);
  }
  return daemon;
}

/**
 * The started daemon's log, for appending, through the held folder: a regular
 * file of this user, mode 0600, never a symlink (a link planted there is
 * refused, not followed).
 */
function openLog(held, logPath) {
  let fd;
  try {
    fd = fs.openSync(held.entry("snapshotd.log"), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, 0o600);
  } catch (error) {
    if (error.code !== "ELOOP") throw error;
    throw new UnsafeSocketFolderError(`Refusing the log ${logPath}: it is a symlink; remove it and try again.`, {
      data: { folder: held.folder, log: logPath },
    });
  }
  const info = fs.fstatSync(fd);
  if (!info.isFile() || info.uid !== process.geteuid()) {
    fs.closeSync(fd);
    throw new UnsafeSocketFolderError(`Refusing the log ${logPath}: it is not a regular file of yours; remove it and try again.`, {
      data: { folder: held.folder, log: logPath },
    });
  }
  fs.fchmodSync(fd, 0o600);
  return fd;
}

function notStartedError(command, error) {
  const reason = error.code === "ENOENT" ? `${command[0]} was not found` : error.message;
  return new DaemonUnreachableError(
    `Cannot start the daemon: ${reason}; install snapshotd or pass the command that runs it (daemonCommand).`,
    { data: { command: [...command] } },
  );
}

/** The last non-empty line of the log (the daemon's own one-sentence reason), or "". */
function lastLine(logPath) {
  let fd;
  try {
    fd = fs.openSync(logPath, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    const size = fs.fstatSync(fd).size;
    const tail = Buffer.alloc(Math.min(size, LOG_TAIL_BYTES));
    fs.readSync(fd, tail, 0, tail.length, size - tail.length);
    const lines = tail.toString("utf8").split("\n").map((line) => line.trim()).filter(Boolean);
    return (lines.at(-1) ?? "").replace(/^error:\s*/, "").replace(/\.$/, "");
  } catch {
    return "";
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}
