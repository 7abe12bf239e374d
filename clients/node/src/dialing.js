// Reaching a busy daemon: wait for room within the client's time, then say so
// in one sentence, as the Python clients do. A full listen queue (connect
// fails at once with EAGAIN), a daemon starting or stopping (its lock beside
// the socket held while nobody listens) and a connection turned away at the
// daemon's cap (a `busy` error with `accepted: false`, nothing read) all
// mean "wait": they are retried with a short, growing, jittered delay.

import * as fs from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { BusyError, DaemonUnreachableError, ERROR_CODES } from "./errors.js";
import { checkSocketFile, openSocketFolder } from "./socket.js";

/** How long a client waits for room at a busy daemon by default. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 30_000;
const FIRST_DELAY_MS = 5;
const MAX_DELAY_MS = 250;

/** The retries of one connect: growing, jittered delays until the time is spent, then BusyError. */
export class RoomWait {
  #next = FIRST_DELAY_MS;

  /** @param {string} socketPath @param {number} timeoutMs */
  constructor(socketPath, timeoutMs = DEFAULT_CONNECT_TIMEOUT_MS) {
    this.socketPath = socketPath;
    this.started = Date.now();
    this.deadline = this.started + Math.max(timeoutMs, 0);
  }

  /** Wait before the next try; rejects with BusyError once the time is spent. */
  async pause(reason, retryAfterMs) {
    const now = Date.now();
    if (now >= this.deadline) throw this.busy(reason);
    let delay = this.#next * (0.5 + Math.random() / 2);
    this.#next = Math.min(this.#next * 2, MAX_DELAY_MS);
    if (typeof retryAfterMs === "number") delay = Math.max(delay, Math.min(retryAfterMs, MAX_DELAY_MS * 4) * (1 + Math.random() / 2));
    await sleep(Math.min(delay, this.deadline - now));
  }

  /** Wait after the daemon turned a connection away with `error`. */
  refused(error) {
    const limit = error.data.limit;
    const reason = Number.isInteger(limit) ? `it serves its limit of ${limit} connections` : "it turns new connections away";
    return this.pause(reason, error.data.retry_after_ms);
  }

  busy(reason) {
    const waited = (Date.now() - this.started) / 1000;
    return new BusyError(
      `snapshotd is busy: ${reason}, and no room came within ${waited.toFixed(1)} s; try again in a moment, ` +
        "allow a longer connectTimeoutMs, or share one connection between sessions.",
      { code: ERROR_CODES.APPLICATION_ERROR, kind: "busy", data: { socket: this.socketPath, waited_s: waited } },
    );
  }
}

/** Whether the daemon turned this connection away unread (its cap): the same requests may go on a new one. */
export function isRefusal(error) {
  return error instanceof BusyError && error.data.accepted === false;
}

/**
 * A connected socket at `socketPath`, or null when no daemon runs there
 * (ENOENT, ECONNREFUSED, and no daemon holds the lock beside the socket).
 * The folder and the socket file are checked first (see socket.js).
 * @param {string} socketPath
 * @param {RoomWait} wait
 * @returns {Promise<net.Socket | null>}
 */
export async function dial(socketPath, wait) {
  for (;;) {
    const outcome = await connectOnce(socketPath);
    if (outcome.socket) return outcome.socket;
    let reason = outcome.busy;
    if (!reason) {
      if (!daemonStarting(socketPath)) return null;
      reason = `the daemon at ${socketPath} is starting or stopping`;
    }
    await wait.pause(reason);
  }
}

function connectOnce(socketPath) {
  const held = openSocketFolder(path.dirname(socketPath));
  if (!held) return Promise.resolve({ missing: true });
  try {
    checkSocketFile(held, socketPath);
  } catch (error) {
    held.close();
    throw error;
  }
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(held.entry(path.basename(socketPath)));
    socket.once("connect", () => {
      held.close();
      socket.removeAllListeners("error");
      resolve({ socket });
    });
    socket.once("error", (error) => {
      held.close();
      if (error.code === "EAGAIN") return resolve({ busy: `its queue of connections waiting at ${socketPath} is full` });
      if (error.code === "ENOENT" || error.code === "ECONNREFUSED") return resolve({ missing: true });
      reject(new DaemonUnreachableError(
        `Cannot talk to snapshotd at ${socketPath}: ${error.message.replace(held.entry(""), `${held.folder}/`)}.`,
        { data: { socket: socketPath, cause: error.code } },
      ));
    });
  });
}

/**
 * Whether a daemon holds the lock file beside the socket (it is starting,
 * running or stopping). Node has no flock, so the kernel's table of locks
 * (/proc/locks) is searched for the lock file's device and inode.
 */
export function daemonStarting(socketPath) {
  let info, table;
  try {
    info = fs.lstatSync(`${socketPath}.lock`);
    table = fs.readFileSync("/proc/locks", "utf8");
  } catch {
    return false;
  }
  const dev = Number(info.dev);
  const major = ((dev >>> 8) & 0xfff).toString(16).padStart(2, "0");
  const minor = ((dev & 0xff) | ((dev >>> 12) & 0xfff00)).toString(16).padStart(2, "0");
  const wanted = `${major}:${minor}:${info.ino}`;
  return table.split("\n").some((line) => /\bFLOCK\b/.test(line) && line.split(/\s+/).includes(wanted));
}
