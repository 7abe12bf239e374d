// Many agent sessions on one connection, or on a small pool of them, instead
// of a connection per session. The session is a param of each call; one
// connection carries every session's calls at once (the daemon runs up to 256
// of one connection together), so a server with more sessions in flight
// spreads them over a few connections: session after session in turn.
//
//   const pool = await SessionPool.open(4, { autostart: true });
//   await pool.checkpoint({ path: worktree, session: thread.id, label: "before turn 3" });
//   await pool.close();

import { connect } from "snapshotd-client";

export class SessionPool {
  #bySession = new Map();

  /** Open `size` connections (1 is often enough) with `connect`'s options. */
  static async open(size = 1, options = {}) {
    return new SessionPool(await Promise.all(Array.from({ length: size }, () => connect(options))));
  }

  /** @param {import("snapshotd-client").Snapshotd[]} connections */
  constructor(connections) {
    this.connections = connections;
  }

  /** The connection that carries `session`: each new session takes the next one in turn. */
  connectionFor(session) {
    let n = this.#bySession.get(session);
    if (n === undefined) {
      n = this.#bySession.size % this.connections.length;
      this.#bySession.set(session, n);
    }
    return this.connections[n];
  }

  checkpoint(params) { return this.connectionFor(params.session).checkpoint(params); }
  list(params) { return this.connectionFor(params.session).list(params); }
  revert(params) { return this.connectionFor(params.session).revert(params); }

  /** Let every connection answer what was sent, then close them. */
  async close() {
    await Promise.all(this.connections.map((connection) => connection.close()));
  }
}
