// Where the daemon's socket is, found as the command line finds it, and the
// check that its folder is private before anything is sent through it.

import * as fs from "node:fs";
import * as path from "node:path";

/** Longest socket path a Unix socket address holds (sun_path, with its NUL). */
const SUN_PATH_MAX = 107;

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
 * Why the socket's folder is not safe to talk through, or null when it is:
 * it must be a folder of this user's that no other user may write to (the
 * daemon refuses any other folder too). Another user could otherwise put a
 * socket of their own there and read every request.
 * @param {string} folder
 * @returns {string | null} null also when the folder does not exist
 */
export function unsafeFolderReason(folder) {
  let info;
  try {
    info = fs.statSync(folder);
  } catch (error) {
    if (error.code === "ENOENT") return null;
    throw error;
  }
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
 * Why `socketPath` cannot be used at all (too long for a Unix socket), or null.
 * @param {string} socketPath
 * @returns {string | null}
 */
export function unusablePathReason(socketPath) {
  if (Buffer.byteLength(socketPath) <= SUN_PATH_MAX) return null;
  return `The socket path ${socketPath} is longer than ${SUN_PATH_MAX} bytes; choose a shorter one.`;
}
