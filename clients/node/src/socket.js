// Where the daemon's socket is, found as the command line finds it, and how
// it is reached without trusting a path another user could swap: its folder
// is opened without following links and checked by its descriptor, and the
// socket is then reached through that descriptor (/proc/self/fd/N/NAME), so
// the folder checked is the folder connected through.

import * as fs from "node:fs";
import * as path from "node:path";

import { UnsafeSocketFolderError, UntrustedDaemonError } from "./errors.js";

/** Longest socket path a Unix socket address holds (sun_path, with its NUL). */
const SUN_PATH_MAX = 107;
const { O_RDONLY, O_DIRECTORY, O_NOFOLLOW } = fs.constants;

/**
 * The socket path: `explicit`, then `$SNAPSHOTD_SOCKET`, then
 * `$XDG_RUNTIME_DIR/snapshotd/snapshotd.sock` when that variable is an
 * absolute path, else `/tmp/snapshotd-<uid>/snapshotd.sock`; made absolute.
 * @param {string} [explicit] the `--socket` of a command line
 * @param {Record<string, string | undefined>} [env]
 * @returns {string}
 */
export function resolveSocketPath(explicit, env = process.env) {
  if (explicit) return path.resolve(explicit);
  if (env.SNAPSHOTD_SOCKET) return path.resolve(env.SNAPSHOTD_SOCKET);
  const runtime = env.XDG_RUNTIME_DIR;
  if (runtime && path.isAbsolute(runtime)) return path.join(runtime, "snapshotd", "snapshotd.sock");
  return `/tmp/snapshotd-${process.getuid()}/snapshotd.sock`;
}

/**
 * Why the socket's folder, as `info` (an lstat or fstat) shows it, is not safe
 * to talk through, or null: it must be a folder (not a symlink) of this user
 * that no other user may write to, the rule the daemon keeps too. Another user
 * could otherwise put a socket of their own there and read every request.
 * @param {string} folder
 * @param {fs.Stats} info
 * @returns {string | null}
 */
function folderReason(folder, info) {
  if (info.isSymbolicLink()) return `Refusing the socket folder ${folder}: it is a symlink.`;
  if (!info.isDirectory()) return `The socket folder ${folder} is not a folder.`;
  const own = process.geteuid();
  if (info.uid !== own) return `Refusing the socket folder ${folder}: it belongs to uid ${info.uid}, not ${own}.`;
  if (info.mode & 0o022) {
    const mode = (info.mode & 0o7777).toString(8).padStart(4, "0");
    return `Refusing the socket folder ${folder}: other users may write to it (mode ${mode}).`;
  }
  return null;
}

/**
 * A held socket folder: its descriptor and the path of an entry through it.
 * Close it once connected (or the log is open).
 */
export class SocketFolder {
  /** @param {string} folder @param {number} fd */
  constructor(folder, fd) {
    this.folder = folder;
    this.fd = fd;
  }

  /** The path of `name` inside the folder held, not the folder now at `this.folder`. */
  entry(name) {
    const pinned = `/proc/self/fd/${this.fd}`;
    return fs.existsSync(pinned) ? `${pinned}/${name}` : path.join(this.folder, name);
  }

  close() {
    fs.closeSync(this.fd);
  }
}

/**
 * Open the socket's folder to talk through: refused (UnsafeSocketFolderError)
 * unless it passes the daemon's rule, checked on the folder opened, never on
 * a path that could be swapped in between.
 * @param {string} folder
 * @returns {SocketFolder | null} null when the folder does not exist
 */
export function openSocketFolder(folder) {
  let fd;
  try {
    fd = fs.openSync(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  } catch (error) {
    if (error.code === "ENOENT") return null;
    if (error.code !== "ELOOP" && error.code !== "ENOTDIR") throw error;
    let info;
    try {
      info = fs.lstatSync(folder);
    } catch {
      return null; // gone meanwhile
    }
    throw new UnsafeSocketFolderError(folderReason(folder, info) ?? `The socket folder ${folder} is not a folder.`, {
      data: { folder },
    });
  }
  const reason = folderReason(folder, fs.fstatSync(fd));
  if (reason) {
    fs.closeSync(fd);
    throw new UnsafeSocketFolderError(reason, { data: { folder } });
  }
  return new SocketFolder(folder, fd);
}

/**
 * Refuse a socket file in the held folder that is a link or another user's:
 * whoever bound it is the listener, and only this user (or root) can bind in
 * a folder that passed {@link openSocketFolder}; a socket left by another
 * user before the folder was made private is refused here.
 * @param {SocketFolder} held
 * @param {string} socketPath
 */
export function checkSocketFile(held, socketPath) {
  let info;
  try {
    info = fs.lstatSync(held.entry(path.basename(socketPath)));
  } catch (error) {
    if (error.code === "ENOENT") return;
    throw error;
  }
  const own = process.geteuid();
  const why = info.isSymbolicLink() ? "it is a symlink" : info.uid !== own ? `it belongs to uid ${info.uid}, not ${own}` : null;
  if (why) {
    throw new UntrustedDaemonError(
      `Refusing the daemon at ${socketPath}: ${why}, so nothing was sent to it; remove it or use a socket of your own.`,
      { data: { socket: socketPath } },
    );
  }
}

/**
 * Why `socketPath` cannot be used at all (too long for a Unix socket), or null.
 * @param {string} socketPath
 * @returns {string | null}
 */
export function unusablePathReason(socketPath) {
  if (Buffer.byteLength(socketPath) <= SUN_PATH_MAX) return null;
  return `The socket path ${socketPath} is longer than ${SUN_PATH_MAX} bytes; choose a shorter one.`;
}
