// Every error this package raises: one class per error the daemon sends (by
// JSON-RPC code, and by `data.kind` for application errors), plus the few a
// client raises itself before or after talking to the daemon.

/** Base of every error from this package; `code` and `kind` as on the wire. */
export class SnapshotdError extends Error {
  /**
   * @param {string} message one sentence for a person
   * @param {{code?: number | null, kind?: string | null, data?: object, method?: string}} [details]
   */
  constructor(message, { code = null, kind = null, data = {}, method } = {}) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.kind = kind;
    this.data = data;
    if (method !== undefined) this.method = method;
  }
}

/** The line was not valid UTF-8 or JSON (-32700). */
export class ParseError extends SnapshotdError {}
/** Not a JSON-RPC 2.0 request, a line over the daemon's limit, or a refused peer (-32600). */
export class InvalidRequestError extends SnapshotdError {}
/** The daemon has no method of that name (-32601), e.g. an older daemon. */
export class MethodNotFoundError extends SnapshotdError {}
/** A parameter is missing, of the wrong type or out of range (-32602). */
export class InvalidParamsError extends SnapshotdError {}
/** The daemon failed unexpectedly; its log has the details (-32603). */
export class InternalError extends SnapshotdError {}

/** An application error (-32000); `kind` says which. Unknown kinds get this class. */
export class ApplicationError extends SnapshotdError {}
export class NotFoundError extends ApplicationError {}
/** A reference matches several checkpoints; `candidates` lists them (id, session, seq, label). */
export class AmbiguousError extends ApplicationError {
  /** @returns {Array<{id: string, session: string | null, seq: number, label: string | null}>} */
  get candidates() {
    return Array.isArray(this.data.candidates) ? this.data.candidates : [];
  }
}
export class NotADirectoryError extends ApplicationError {}
export class WorktreeMismatchError extends ApplicationError {}
export class PathOutsideWorktreeError extends ApplicationError {}
export class GitError extends ApplicationError {}
export class UnsupportedError extends ApplicationError {}
export class TooLargeError extends ApplicationError {}
export class UntrustedError extends ApplicationError {}
export class BusyError extends ApplicationError {}
export class ShuttingDownError extends ApplicationError {}

/** Raised by this package itself, never sent by the daemon: `code` and `kind` are null. */
export class ClientError extends SnapshotdError {}
/** The connection ended (or was closed) before the daemon replied. */
export class ConnectionClosedError extends ClientError {}
/** No daemon answers at the socket, or one could not be started. */
export class DaemonUnreachableError extends ClientError {}
/** The socket's folder belongs to another user or others may write to it; nothing was sent. */
export class UnsafeSocketFolderError extends ClientError {}
/** The socket file is a link or another user's: whoever listens there is not this user's daemon; nothing was sent. */
export class UntrustedDaemonError extends ClientError {}
/** A reply line is longer than the client's `lineLimit`; the connection is closed. */
export class ResponseTooLongError extends ClientError {}
/** The daemon did not answer a call within the client's `callTimeoutMs`; the connection stays, a late reply is dropped. */
export class CallTimeoutError extends ClientError {}

/** JSON-RPC codes of the protocol errors. */
export const ERROR_CODES = Object.freeze({
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  APPLICATION_ERROR: -32000,
});

const BY_CODE = new Map([
  [ERROR_CODES.PARSE_ERROR, ParseError],
  [ERROR_CODES.INVALID_REQUEST, InvalidRequestError],
  [ERROR_CODES.METHOD_NOT_FOUND, MethodNotFoundError],
  [ERROR_CODES.INVALID_PARAMS, InvalidParamsError],
  [ERROR_CODES.INTERNAL_ERROR, InternalError],
]);

const BY_KIND = new Map([
  ["not_found", NotFoundError],
  ["ambiguous", AmbiguousError],
  ["not_a_directory", NotADirectoryError],
  ["worktree_mismatch", WorktreeMismatchError],
  ["path_outside_worktree", PathOutsideWorktreeError],
  ["git_error", GitError],
  ["unsupported", UnsupportedError],
  ["too_large", TooLargeError],
  ["untrusted", UntrustedError],
  ["busy", BusyError],
  ["shutting_down", ShuttingDownError],
]);

/**
 * The error object of a response, as the matching class.
 * @param {{code?: unknown, message?: unknown, data?: unknown}} error
 * @param {string} [method] the method of the request it answers
 * @returns {SnapshotdError}
 */
export function errorFromWire(error, method) {
  const code = typeof error.code === "number" ? error.code : ERROR_CODES.INTERNAL_ERROR;
  const data = error.data && typeof error.data === "object" ? { ...error.data } : {};
  const kind = typeof data.kind === "string" ? data.kind : null;
  const message = typeof error.message === "string" ? error.message : "snapshotd sent an error without a message.";
  const cls = (kind && (BY_KIND.get(kind) ?? ApplicationError)) || BY_CODE.get(code) ||
    (code === ERROR_CODES.APPLICATION_ERROR ? ApplicationError : InternalError);
  return new cls(message, { code, kind, data, method });
}
