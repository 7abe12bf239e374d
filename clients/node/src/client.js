// A connection to the daemon: JSON-RPC 2.0 over a Unix socket, one JSON
// object per line. Calls are pipelined (each is written at once and its
// response matched by id, in whatever order the daemon answers), and the
// `changed` (and, when asked, `checkpoint`) notifications of a subscription come out of an async iterator.

import * as path from "node:path";

import { endIfSpare, startAndConnect } from "./autostart.js";
import { DEFAULT_CONNECT_TIMEOUT_MS, RoomWait, dial, isRefusal } from "./dialing.js";
import {
  CallTimeoutError,
  ClientError,
  ConnectionClosedError,
  DaemonUnreachableError,
  ResponseTooLongError,
  errorFromWire,
} from "./errors.js";
import { resolveSocketPath, unusablePathReason } from "./socket.js";

/** Longest reply line accepted, in bytes (a patch can be large; a JS string holds about 512 MiB). */
export const DEFAULT_LINE_LIMIT = 256 * 1024 * 1024;
/** Notifications a subscription holds for a slow reader before it folds them into one overflow. */
export const SUBSCRIPTION_BUFFER = 1024;
/** How long a call waits for its reply by default (ms); `callTimeoutMs: 0` waits without limit. */
export const DEFAULT_CALL_TIMEOUT_MS = 120_000;
/** How long close() waits for the daemon to close its side once nothing is in flight. */
const CLOSE_GRACE_MS = 2_000;
const CLOSE_POLL_MS = 100;

/**
 * Connect to the daemon (see {@link Snapshotd.connect}).
 * @param {import("../index").ConnectOptions} [options]
 */
export function connect(options) {
  return Snapshotd.connect(options);
}

export class Snapshotd {
  /** @type {import("node:net").Socket} */ #socket;
  #lines;
  #nextId = 1;
  /** @type {Map<number, {resolve: Function, reject: Function, method: string, onResult?: Function}>} */
  #pending = new Map();
  #callTimeoutMs = DEFAULT_CALL_TIMEOUT_MS;
  /** @type {Map<string, Subscription>} */
  #subscriptions = new Map();
  /** @type {Error | null} set once the connection is over */
  #closedError = null;
  #closing = false;
  #closed;

  /**
   * Connect to the daemon at the socket the command line would use.
   * The socket's folder is checked first: it must be this user's and not
   * writable by others, or nothing is sent. With `autostart`, a daemon is
   * started when none answers. A busy daemon is waited for, up to
   * `connectTimeoutMs`; the connection is confirmed with a `ping`, whose
   * result is `daemon`.
   * @param {import("../index").ConnectOptions} [options]
   * @returns {Promise<Snapshotd>}
   */
  static async connect(options = {}) {
    const env = options.env ?? process.env;
    const socketPath = resolveSocketPath(options.socket, env);
    const unusable = unusablePathReason(socketPath);
    if (unusable) throw new DaemonUnreachableError(unusable, { data: { socket: socketPath } });
    const wait = new RoomWait(socketPath, options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS);
    const tryConnect = () => dial(socketPath, wait);
    let started = null;
    for (;;) {
      let socket = await tryConnect();
      if (!socket && options.autostart) {
        ({ socket, started } = await startAndConnect(socketPath, tryConnect, {
          command: options.daemonCommand,
          env,
          timeoutMs: options.startTimeoutMs,
        }));
      }
      if (!socket) {
        throw new DaemonUnreachableError(
          `No snapshotd is running at ${socketPath}; start one with \`snapshotd serve\` or connect with autostart: true.`,
          { data: { socket: socketPath } },
        );
      }
      const callTimeoutMs = options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
      const client = new Snapshotd(socket, socketPath, options.lineLimit ?? DEFAULT_LINE_LIMIT, callTimeoutMs);
      try {
        client.daemon = await client.ping();
        if (started) endIfSpare(started, client.daemon);
        return client;
      } catch (error) {
        client.destroy();
        if (isRefusal(error)) await wait.refused(error);
        // The daemon closed it before reading (its refusal then comes after the failed
        // write, unread): only the ping was sent, so try again.
        else if (error.data?.cause === "EPIPE" || error.data?.cause === "ECONNRESET") {
          await wait.pause("it turns new connections away before reading them (its connection cap)");
        }
        else throw error;
      }
    }
  }

  /** Wrap a connected socket; use {@link Snapshotd.connect}. */
  constructor(socket, socketPath, lineLimit = DEFAULT_LINE_LIMIT, callTimeoutMs = DEFAULT_CALL_TIMEOUT_MS) {
    /** The absolute path of the socket this client talks to. */
    this.socketPath = socketPath;
    /** The daemon's `ping` result from connecting (`{version, pid, pgid, uptime_s}`). */
    this.daemon = null;
    this.#socket = socket;
    this.#lines = new LineReader(lineLimit);
    this.#callTimeoutMs = callTimeoutMs;
    this.#closed = new Promise((resolve) => socket.once("close", resolve));
    socket.on("data", (chunk) => this.#receive(chunk));
    socket.on("error", (error) => this.#fail(new ConnectionClosedError(
      `The connection to snapshotd at ${socketPath} failed: ${error.message}.`, { data: { cause: error.code } },
    )));
    socket.on("close", () => this.#fail(this.#closing
      ? new ConnectionClosedError("This client is closed.")
      : new ConnectionClosedError(`The connection to snapshotd at ${socketPath} closed before it replied.`)));
  }

  /**
   * Send one request and resolve with its result, or reject with the
   * daemon's error as its class. Many calls may be in flight at once.
   * @param {string} method
   * @param {object} [params] undefined members are left out
   */
  call(method, params = {}) {
    return this.#request(method, params);
  }

  /**
   * Let the daemon answer what was sent, then close (as `shutdown(SHUT_WR)`).
   * Subscriptions end; calls made afterwards reject with ConnectionClosedError.
   */
  async close() {
    if (!this.#closedError && !this.#closing) {
      this.#closing = true;
      for (const subscription of this.#subscriptions.values()) subscription._end(null);
      this.#socket.end();
      // A daemon that stopped answering (a `serve` stopped by Ctrl-Z) never closes its side: once
      // every call is answered or timed out, it gets CLOSE_GRACE_MS more, then the socket is destroyed.
      let lastBusy = Date.now();
      const watch = setInterval(() => {
        if (this.#pending.size > 0) lastBusy = Date.now();
        else if (Date.now() - lastBusy >= CLOSE_GRACE_MS) this.#socket.destroy();
      }, CLOSE_POLL_MS);
      watch.unref();
      this.#socket.once("close", () => clearInterval(watch));
    }
    await this.#closed;
  }

  /** Close at once; requests in flight reject with ConnectionClosedError. */
  destroy() {
    this.#closing = true;
    this.#socket.destroy();
  }

  // --- the methods of the protocol ------------------------------------------

  ping() { return this.#request("ping", {}); }
  open(target) { return this.#request("open", worktreeParams(target)); }
  worktrees(params = {}) { return this.#request("worktrees", params); }
  checkpoint(params) { return this.#request("checkpoint", withAbsolutePath(params)); }
  list(params) { return this.#request("list", withAbsolutePath(params)); }
  show(ref) { return this.#request("show", checkpointParams(ref)); }
  resolve(ref) { return this.#request("resolve", checkpointParams(ref)); }
  diff(params) { return this.#request("diff", withAbsolutePath(params)); }
  restore(params) { return this.#request("restore", withAbsolutePath(params)); }
  revert(params) { return this.#request("revert", withAbsolutePath(params)); }
  delete(params) { return this.#request("delete", withAbsolutePath(params)); }
  gc(params) { return this.#request("gc", withAbsolutePath(params)); }
  repair(params = {}) { return this.#request("repair", withAbsolutePath(params)); }
  forget(params) { return this.#request("forget", withAbsolutePath(params)); }
  status() { return this.#request("status", {}); }
  verify(target) { return this.#request("verify", worktreeParams(target)); }
  push(params) { return this.#request("push", withAbsolutePath(params)); }
  fetch(params) { return this.#request("fetch", withAbsolutePath(params)); }
  unsubscribe(subscription) { return this.#request("unsubscribe", { subscription }); }
  shutdown() { return this.#request("shutdown", {}); }

  /**
   * Subscribe to a worktree's `changed` notifications on this connection; with
   * `{ checkpoints: true }`, also one `checkpoint` notification per checkpoint recorded there.
   * @returns {Promise<Subscription>} iterate it with `for await`; `close()` or `break` ends it
   */
  subscribe(target, options = {}) {
    const params = { ...worktreeParams(target), ...(options.checkpoints ? { checkpoints: true } : {}) };
    return this.#request("subscribe", params, (result) => {
      // Made as the response is read, so that a notification in the same
      // chunk already finds it.
      const subscription = new Subscription(this, result.subscription);
      this.#subscriptions.set(subscription.id, subscription);
      return subscription;
    });
  }

  /** @internal */
  _forget(subscription) {
    this.#subscriptions.delete(subscription.id);
    if (!this.#closedError && !this.#closing) this.unsubscribe(subscription.id).catch(() => {});
  }

  // --- the wire ----------------------------------------------------------------

  #request(method, params, onResult) {
    if (this.#closedError || this.#closing) {
      return Promise.reject(this.#closedError ?? new ConnectionClosedError("This client is closed."));
    }
    const id = this.#nextId++;
    const line = JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n";
    return new Promise((resolve, reject) => {
      const limit = this.#callTimeoutMs;
      const timer = limit > 0 ? setTimeout(() => {
        if (!this.#pending.delete(id)) return;
        reject(new CallTimeoutError(
          `snapshotd at ${this.socketPath} did not answer ${method} within ${limit / 1000} s.`,
          { data: { method, timeout_ms: limit } },
        ));
      }, limit) : null;
      this.#pending.set(id, { resolve, reject, method, onResult, timer });
      this.#socket.write(line);
    });
  }

  #receive(chunk) {
    for (const line of this.#lines.feed(chunk)) {
      if (!line.trim()) continue;
      let message;
      try {
        message = JSON.parse(line);
      } catch {
        return this.#fail(new ClientError(`snapshotd at ${this.socketPath} sent a line that is not JSON.`));
      }
      this.#dispatch(message);
      if (this.#closedError) return;
    }
    if (this.#lines.overflow) {
      this.#fail(new ResponseTooLongError(
        `A reply from snapshotd is longer than the line limit of ${this.#lines.limit} bytes; ` +
          "the connection is closed (connect with a larger lineLimit).",
        { data: { limit: this.#lines.limit } },
      ));
    }
  }

  #dispatch(message) {
    if (!message || typeof message !== "object") return;
    if (!("id" in message)) {
      if ((message.method === "changed" || message.method === "checkpoint") && message.params) {
        this.#subscriptions.get(message.params.subscription)?._push(message.params);
      }
      return;
    }
    const waiter = this.#pending.get(message.id);
    if (!waiter) {
      // An error with "id": null is about the connection itself (a line over
      // the daemon's limit, a refused peer); the daemon closes it next.
      if (message.id === null && message.error) this.#fail(errorFromWire(message.error));
      return;
    }
    this.#pending.delete(message.id);
    clearTimeout(waiter.timer);
    if (message.error) waiter.reject(errorFromWire(message.error, waiter.method));
    else waiter.resolve(waiter.onResult ? waiter.onResult(message.result) : message.result);
  }

  /** End the connection with `error` for every call still waiting and every subscription. */
  #fail(error) {
    if (this.#closedError) return;
    this.#closedError = error;
    for (const waiter of this.#pending.values()) {
      clearTimeout(waiter.timer);
      waiter.reject(error);
    }
    this.#pending.clear();
    for (const subscription of this.#subscriptions.values()) subscription._end(this.#closing ? null : error);
    this.#subscriptions.clear();
    this.#socket.destroy();
  }
}

/**
 * A subscription's notifications, as an async iterator: `changed` ones, and
 * `checkpoint` ones (they carry `checkpoint`) when subscribed with `checkpoints: true`.
 * A reader that falls {@link SUBSCRIPTION_BUFFER} behind gets the backlog
 * folded into one notification with `overflow: true` ("anything may have
 * changed"), as the daemon itself does for a burst.
 */
export class Subscription {
  #client;
  #queue = [];
  #waiters = [];
  #done = false;
  #error = null;

  constructor(client, id) {
    this.#client = client;
    /** The id the daemon gave, as in each notification's `subscription`. */
    this.id = id;
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /** The next notification; rejects with ConnectionClosedError if the connection is lost. */
  next() {
    if (this.#queue.length) return Promise.resolve({ value: this.#queue.shift(), done: false });
    if (this.#error) {
      const error = this.#error;
      this.#error = null;
      return Promise.reject(error);
    }
    if (this.#done) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }

  /** Called by `break` out of `for await`: ends the subscription. */
  async return() {
    this.close();
    return { value: undefined, done: true };
  }

  /** End the subscription (the daemon is told to stop sending). */
  close() {
    if (this.#done) return;
    this._end(null);
    this.#client._forget(this);
  }

  /** @internal */
  _push(params) {
    if (this.#done) return;
    const waiter = this.#waiters.shift();
    if (waiter) return waiter.resolve({ value: params, done: false });
    if (this.#queue.length < SUBSCRIPTION_BUFFER) return void this.#queue.push(params);
    this.#queue = [{ subscription: this.id, worktree: params.worktree, paths: [], overflow: true }];
  }

  /** @internal */
  _end(error) {
    if (this.#done) return;
    this.#done = true;
    const waiters = this.#waiters.splice(0);
    if (error && waiters.length) {
      for (const waiter of waiters) waiter.reject(error);
      return;
    }
    this.#error = error;
    for (const waiter of waiters) waiter.resolve({ value: undefined, done: true });
  }
}

/** Splits the byte stream into lines, refusing one longer than `limit` bytes. */
class LineReader {
  #chunks = [];
  #size = 0;

  constructor(limit) {
    this.limit = limit;
    this.overflow = false;
  }

  /** The complete lines in `chunk` (with what came before); sets `overflow` past the limit. */
  feed(chunk) {
    const lines = [];
    let start = 0;
    for (;;) {
      const end = chunk.indexOf(10, start);
      const piece = chunk.subarray(start, end < 0 ? chunk.length : end);
      if (this.#size + piece.length > this.limit) {
        this.overflow = true;
        return lines;
      }
      if (end < 0) break;
      lines.push(Buffer.concat([...this.#chunks, piece]).toString("utf8"));
      this.#chunks = [];
      this.#size = 0;
      start = end + 1;
    }
    if (start < chunk.length) {
      this.#chunks.push(chunk.subarray(start));
      this.#size += chunk.length - start;
    }
    return lines;
  }
}

/** `"path"` or `{path}`/`{worktree}` as params, the path made absolute. */
function worktreeParams(target) {
  return withAbsolutePath(typeof target === "string" ? { path: target } : target);
}

/** A checkpoint reference or params with one, the path made absolute. */
function checkpointParams(ref) {
  return withAbsolutePath(typeof ref === "string" ? { checkpoint: ref } : ref);
}

/**
 * The params with `path` made absolute: the daemon runs from `/`, so a
 * relative path would name another folder. (`paths` are relative to the
 * worktree's root and stay as given.)
 */
function withAbsolutePath(params = {}) {
  if (typeof params.path !== "string") return params;
  return { ...params, path: path.resolve(params.path) };
}
