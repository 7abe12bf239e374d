// Types of snapshotd-client: the objects, params and results of the snapshotd
// socket protocol (see snapshotd-protocol(7)), and the client's own API.
// Fields the daemon may add later are allowed; names here are the wire's.

// --- objects ------------------------------------------------------------------

/** A full commit id (40 hex digits; 64 in a SHA-256 repository). */
export type Oid = string;

/**
 * A checkpoint reference: a full id, a unique prefix of at least 7 hex digits
 * (matching checkpoints only), `@` (the newest of the session), `@~N` (N before
 * it), `#N` (by seq), `SESSION@`, `SESSION@~N`. `@` and `#N` count in the
 * worktree of the params' `path`/`worktree` and their `session` (absent: the
 * worktree's newest session; for `#N`, whichever session has that seq).
 */
export type CheckpointRef = string;

export interface Worktree {
  /** `wt_…`, stable across restarts and moves. */
  id: string;
  path: string;
  kind: "git" | "plain";
  git_dir: string | null;
  common_dir: string | null;
  head: Oid | null;
  branch: string | null;
  watching: boolean;
}

export interface Checkpoint {
  id: Oid;
  tree: Oid;
  /** The previous checkpoint of the same worktree and session (not the git parent). */
  parent: Oid | null;
  worktree: string;
  session: string | null;
  label: string | null;
  seq: number;
  /** ISO 8601 in UTC with milliseconds. */
  created_at: string;
  /** HEAD when it was taken; the commit's git parent. */
  base: Oid | null;
  changed: boolean;
  /** The machine it was taken on (host name or SNAPSHOTD_HOST); null for older checkpoints. */
  host: string | null;
  /** Set on checkpoints fetched from a remote (`list` with `remote`). */
  remote?: string;
  /** The agent's ids it was recorded with (its `Snapshotd-Agent-*` trailers). */
  agent?: Record<string, string>;
}

export interface CaptureStats {
  ms: number;
  processes: number;
  scan: "full" | "watch" | "none";
  hashed: number;
  /** Paths on disk left out of the tree (over the size cap, FIFOs, empty nested repositories). */
  skipped: string[];
  /** The same paths with why; size and cap (bytes) for a file over the size cap. */
  skipped_files: SkippedFile[];
}

export interface SkippedFile {
  path: string;
  reason: string;
  size?: number;
  cap?: number;
}

export type GitMode = "100644" | "100755" | "120000" | "160000" | "040000" | string;

export interface FileChange {
  path: string;
  old_path: string | null;
  status: "added" | "modified" | "deleted" | "renamed" | "type_changed";
  old_mode: GitMode | null;
  new_mode: GitMode | null;
  old_oid: Oid | null;
  new_oid: Oid | null;
  binary: boolean;
  additions: number;
  deletions: number;
  /** Bytes of each side of a binary file (null where the path does not exist, and for text). */
  old_size?: number | null;
  new_size?: number | null;
}

/** A path left alone, and why (a sentence for a person). */
export interface Conflict {
  path: string;
  reason: string;
}

export interface ChangedNotification {
  subscription: string;
  worktree: string;
  /** Hints: sorted paths relative to the worktree's root. */
  paths: string[];
  /** True when the list is incomplete: treat it as "anything may have changed". */
  overflow: boolean;
}

/** A checkpoint recorded in the worktree (subscriptions made with `checkpoints: true`). */
export interface CheckpointNotification {
  subscription: string;
  worktree: string;
  checkpoint: Checkpoint;
}

export type Notification = ChangedNotification | CheckpointNotification;

export interface SubscribeOptions {
  /** Also a `checkpoint` notification for every checkpoint recorded in the worktree. */
  checkpoints?: boolean;
}

// --- params -------------------------------------------------------------------

/** Names a worktree: `path` (any folder inside it; made absolute by the client) or `worktree` (an id). */
export type WorktreeTarget =
  | { path: string; worktree?: string }
  | { worktree: string; path?: string };

/** The same, optional. */
export interface OptionalWorktree {
  path?: string;
  worktree?: string;
}

export type CheckpointParams = WorktreeTarget & {
  session?: string | null;
  label?: string | null;
  /** The calling agent's ids, kept as the commit's `Snapshotd-Agent-*` trailers (`{tool: "opencode", session: "…"}`). */
  agent?: Record<string, string>;
  /** Scan the whole worktree even when the watcher names the changed paths. */
  exact?: boolean;
  /** Checkpoint even the user's home folder or `/` (refused with `needs_force` otherwise). */
  force?: boolean;
};

export type ListParams = WorktreeTarget & {
  session?: string | null;
  limit?: number | null;
  /** Also list checkpoints fetched from this remote, or from every remote with `true`. */
  remote?: string | boolean | null;
};

export interface ShowParams extends OptionalWorktree {
  checkpoint: CheckpointRef;
  /** The session that `@`-style references mean. */
  session?: string | null;
}

export type ResolveParams = ShowParams;

export interface DiffParams extends OptionalWorktree {
  from: CheckpointRef | "worktree";
  /** Leave out (not null) for the live worktree. */
  to?: CheckpointRef | "worktree";
  paths?: string[] | null;
  patch?: boolean;
  context?: number | null;
  session?: string | null;
  /** The first file to list (a page starts where the last one's `next_offset` said). */
  offset?: number;
  /** With `patch: true`: the most bytes of patch one answer holds (a page ends before it). */
  max_patch_bytes?: number;
  /** A later page of a diff of the worktree: the `worktree_tree` its first page gave, read instead of the disk. */
  worktree_tree?: string;
}

export interface RestoreParams extends OptionalWorktree {
  checkpoint: CheckpointRef;
  paths?: string[] | null;
  dry_run?: boolean;
  allow_other_worktree?: boolean;
  session?: string | null;
}

export interface RevertParams extends OptionalWorktree {
  from: CheckpointRef;
  to?: CheckpointRef | null;
  paths?: string[] | null;
  dry_run?: boolean;
  force?: boolean;
  session?: string | null;
}

export type DeleteParams =
  | { checkpoints: CheckpointRef[]; path?: string; worktree?: string }
  | (WorktreeTarget & { session: string | null });

export interface GcParams extends OptionalWorktree {
  /** Checkpoints kept per session (the newest). */
  keep?: number | null;
  older_than_s?: number | null;
  /** Every worktree the daemon knows; without it, a worktree is required. */
  all?: boolean;
  dry_run?: boolean;
  include_safety?: boolean;
}

export interface RepairParams {
  path?: string | null;
}

export type RemoteParams = WorktreeTarget & { remote?: string | null };

export type PushParams = RemoteParams & {
  /** Replace what the last fetch saw on the remote (after another machine moved a ref). */
  force?: boolean;
  /** From now on also push after every checkpoint of this worktree (the daemon, batched), or stop. */
  background?: boolean;
};

export interface BackgroundPush {
  pending: boolean;
  in_flight: boolean;
  pushes: number;
  last_push_at: string | null;
  last_error: string | null;
}

// --- results ------------------------------------------------------------------

export interface PingResult {
  version: string;
  pid: number;
  /** The daemon's process group: the group of the client that started it, when one did. */
  pgid: number;
  uptime_s: number;
}

export interface WorktreeResult {
  worktree: Worktree;
}

export interface WorktreesParams {
  /** Also every recorded worktree this daemon has not opened (each with `open: false`). */
  known?: boolean;
}

export interface KnownWorktree extends Worktree {
  /** False for a worktree listed from its record alone (head, branch null; not watched). */
  open?: boolean;
  /** "here"; "moved" or "gone" when its folder is no longer at its path; "removed" when git removed it too. */
  presence?: string;
  problem?: string | null;
}

export interface WorktreesResult {
  worktrees: KnownWorktree[];
}

export interface CheckpointResult {
  checkpoint: Checkpoint;
  stats: CaptureStats;
}

export interface ListResult {
  /** Newest first. */
  checkpoints: Checkpoint[];
}

export interface ShowResult {
  checkpoint: Checkpoint;
}

export type ResolveResult = ShowResult;

export interface DiffResult {
  files: FileChange[];
  /** With `patch: true`: a unified patch as `git diff` prints it. */
  patch?: string;
  /** True when the two sides are linked worktrees of one repository. */
  cross_worktree?: boolean;
  /** With `patch: true`: the `offset` of the next page, or null when this one is the last. */
  next_offset?: number | null;
  /** When a side is the worktree: the tree captured, for the later pages' `worktree_tree`. */
  worktree_tree?: string;
}

export interface RestoreResult {
  /** Null for a dry run and when nothing changed. */
  safety_checkpoint: Checkpoint | null;
  written: string[];
  deleted: string[];
  /** The written paths that are submodules: only their folder is made (git submodule update fills it). */
  submodules?: string[];
  /** Paths left alone because something stood in the way. */
  skipped?: Conflict[];
  /** Files left in place (e.g. ignored when the restore began). */
  kept?: Conflict[];
}

export interface RevertResult {
  safety_checkpoint: Checkpoint | null;
  written: string[];
  deleted: string[];
  /** The written paths that are submodules: only their folder is made (git submodule update fills it). */
  submodules?: string[];
  conflicts: Conflict[];
}

export interface DeleteResult {
  deleted: number;
}

export interface GcWouldDelete {
  worktree: string;
  path: string;
  session: string | null;
  /** Ids of the checkpoints that would go. */
  checkpoints: string[];
  [field: string]: unknown;
}

export interface GcResult {
  deleted: number;
  freed_bytes?: number;
  /** On a dry run, per worktree and session. */
  would_delete?: GcWouldDelete[];
}

export interface Move {
  worktree: string;
  from: string;
  to: string;
}

export interface RepairResult {
  moved: Move[];
  /** Linked worktrees whose git link named another place and now names theirs (moved or not). */
  mended: ForgottenWorktree[];
  /** Open worktrees still gone after the repair (deleted, or moved where no watcher saw). */
  gone: ForgottenWorktree[];
}

/** Either the id of a worktree no longer at its path, or the path it was recorded at. */
export type ForgetParams = { worktree: string; path?: never } | { path: string; worktree?: never };

export interface ForgottenWorktree {
  worktree: string;
  path: string;
}

export interface ForgetResult {
  forgotten: ForgottenWorktree[];
}

export interface StatusWorktree extends Worktree {
  /** Its checkpoints in every session (safety ones included); null when its store cannot be read now. */
  checkpoint_count: number | null;
  /** When the newest was taken (ISO 8601), or null. */
  last_checkpoint_at: string | null;
  [field: string]: unknown;
}

export interface StatusResult {
  worktrees: StatusWorktree[];
  counters: Record<string, number>;
  spawn?: { native: boolean; error: string | null };
  version?: string;
  pid?: number;
  size_cap?: number;
  home?: string;
  /** Per worktree id whose background push is on. */
  background_push?: Record<string, BackgroundPush>;
  /** Whether the daemon has each of inotify, peercred (SO_PEERCRED), syncfs and proc, and why not. */
  facilities?: Record<"inotify" | "peercred" | "syncfs" | "proc", Facility>;
  /** One sentence per facility missing: what it is and what the daemon does instead. */
  warnings?: string[];
}

export interface Facility {
  available: boolean;
  /** Why it is missing (switched off by SNAPSHOTD_DISABLE, not on this platform, a call refused); null when available. */
  reason: string | null;
}

export interface VerifyDifference {
  path: string;
  warm: string | null;
  disk: string | null;
  cause: string;
}

export interface VerifyResult {
  differences: VerifyDifference[];
  scan_ms: number;
}

export interface PushResult {
  remote: string;
  pushed: string[];
  up_to_date: string[];
  /** Present when the push set the worktree's background push. */
  background?: boolean;
}

export interface FetchResult {
  remote: string;
  fetched: string[];
  /** Fetched refs removed because the remote no longer has them. */
  gone?: string[];
}

export type EmptyResult = Record<string, never>;

// --- the client ---------------------------------------------------------------

export interface ConnectOptions {
  /** The socket path, as the command line's `--socket`; else `SNAPSHOTD_SOCKET`, then the defaults. */
  socket?: string;
  /** Start `snapshotd serve --socket PATH` (detached) when no daemon answers. Default false. */
  autostart?: boolean;
  /** The command that runs snapshotd, before `serve --socket PATH`. Default `["snapshotd"]`. */
  daemonCommand?: readonly string[];
  /** How long to wait for a started daemon. Default 10000. */
  startTimeoutMs?: number;
  /** How long to wait for room at a busy daemon (a full queue, a refused connection) before BusyError. Default 30000. */
  connectTimeoutMs?: number;
  /** Longest reply line accepted, in bytes. Default 256 MiB. */
  lineLimit?: number;
  /** How long each call (the connection's confirming ping too) waits for its reply before CallTimeoutError. Default 120000; 0: no limit. */
  callTimeoutMs?: number;
  /** The environment for discovery and for a started daemon. Default `process.env`. */
  env?: Record<string, string | undefined>;
}

export const DEFAULT_LINE_LIMIT: number;
export const DEFAULT_CALL_TIMEOUT_MS: number;
export const SUBSCRIPTION_BUFFER: number;
export const DEFAULT_DAEMON_COMMAND: readonly string[];
export const DEFAULT_START_TIMEOUT_MS: number;
export const DEFAULT_CONNECT_TIMEOUT_MS: number;

/** The socket path the command line would use: `explicit`, `SNAPSHOTD_SOCKET`, `$XDG_RUNTIME_DIR/…`, `/tmp/snapshotd-<uid>/…`. */
export function resolveSocketPath(explicit?: string, env?: Record<string, string | undefined>): string;

/** Connect to the daemon; see {@link Snapshotd.connect}. */
export function connect(options?: ConnectOptions): Promise<Snapshotd>;

/** Options of {@link opencodePlugin}. */
export interface OpenCodePluginOptions {
  /** "turns": before each prompt and when the session goes idle; "tools" (default): also around each file-changing tool. */
  events?: "turns" | "tools";
  /** What runs snapshotd when no daemon answers (`serve --socket PATH` is appended). */
  daemonCommand?: string[];
  socket?: string;
  /** How long a checkpoint is waited for (default: $SNAPSHOTD_HOOK_BEFORE_BUDGET seconds, else 55 s). */
  beforeBudgetMs?: number;
  env?: Record<string, string | undefined>;
}
/** OpenCode 1.18's tools that can change files. */
export const CHANGING_TOOLS: readonly string[];
export const DEFAULT_BEFORE_BUDGET_MS: number;
/** OpenCode's plug-in function: checkpoints at the moments snapshotd's agent hooks take them. */
export function opencodePlugin(
  options?: OpenCodePluginOptions,
): (input: { directory: string; worktree?: string; client?: unknown }) => Promise<Record<string, (...args: any[]) => Promise<void>>>;

/** `changed` notifications of one subscription; `break` or `close()` ends it. */
/** Its notifications: `changed` ones, and `checkpoint` ones too when subscribed with `checkpoints: true`. */
export class Subscription<N extends Notification = ChangedNotification> implements AsyncIterableIterator<N> {
  readonly id: string;
  next(): Promise<IteratorResult<N, undefined>>;
  return(): Promise<IteratorResult<N, undefined>>;
  close(): void;
  [Symbol.asyncIterator](): Subscription<N>;
}

/** One connection to the daemon; calls may be in flight at once and are matched by id. */
export class Snapshotd {
  /**
   * Connect, after checking that the socket's folder is this user's and not
   * writable by others (else UnsafeSocketFolderError, and nothing is sent).
   */
  static connect(options?: ConnectOptions): Promise<Snapshotd>;
  private constructor();
  /** The absolute socket path. */
  readonly socketPath: string;
  /** The daemon's `ping` result, from confirming the connection. */
  readonly daemon: PingResult;

  /** Any method by name; rejects with the daemon's error as its class. */
  call<T = Record<string, unknown>>(method: string, params?: object): Promise<T>;
  /** Let the daemon answer what was sent, then close. */
  close(): Promise<void>;
  /** Close at once; calls in flight reject with ConnectionClosedError. */
  destroy(): void;

  ping(): Promise<PingResult>;
  open(target: string | WorktreeTarget): Promise<WorktreeResult>;
  worktrees(params?: WorktreesParams): Promise<WorktreesResult>;
  checkpoint(params: CheckpointParams): Promise<CheckpointResult>;
  list(params: ListParams): Promise<ListResult>;
  show(ref: CheckpointRef | ShowParams): Promise<ShowResult>;
  resolve(ref: CheckpointRef | ResolveParams): Promise<ResolveResult>;
  diff(params: DiffParams): Promise<DiffResult>;
  restore(params: RestoreParams): Promise<RestoreResult>;
  revert(params: RevertParams): Promise<RevertResult>;
  delete(params: DeleteParams): Promise<DeleteResult>;
  gc(params: GcParams): Promise<GcResult>;
  repair(params?: RepairParams): Promise<RepairResult>;
  /** Drop a worktree deleted on purpose (its record too); its checkpoints in a shared store stay until gc. */
  forget(params: ForgetParams): Promise<ForgetResult>;
  status(): Promise<StatusResult>;
  verify(target: string | WorktreeTarget): Promise<VerifyResult>;
  push(params: PushParams): Promise<PushResult>;
  fetch(params: RemoteParams): Promise<FetchResult>;
  subscribe(target: string | WorktreeTarget, options: SubscribeOptions & { checkpoints: true }): Promise<Subscription<Notification>>;
  subscribe(target: string | WorktreeTarget, options?: SubscribeOptions): Promise<Subscription>;
  unsubscribe(subscription: string): Promise<EmptyResult>;
  shutdown(): Promise<EmptyResult>;
}

// --- errors -------------------------------------------------------------------

export type ErrorKind =
  | "not_found"
  | "ambiguous"
  | "not_a_directory"
  | "worktree_mismatch"
  | "path_outside_worktree"
  | "git_error"
  | "unsupported"
  | "too_large"
  | "untrusted"
  | "busy"
  | "shutting_down"
  | "state_unreadable"
  | "needs_force";

export interface ErrorDetails {
  code?: number | null;
  kind?: string | null;
  data?: Record<string, unknown>;
  method?: string;
}

/** Base of every error of this package. */
export class SnapshotdError extends Error {
  constructor(message: string, details?: ErrorDetails);
  /** The JSON-RPC code; null for errors the client raises itself. */
  readonly code: number | null;
  /** `data.kind` of an application error (an ErrorKind, or a newer daemon's); else null. */
  readonly kind: ErrorKind | (string & {}) | null;
  readonly data: Record<string, unknown>;
  /** The method of the request that failed, when it is known. */
  readonly method?: string;
}

export class ParseError extends SnapshotdError {}
export class InvalidRequestError extends SnapshotdError {}
export class MethodNotFoundError extends SnapshotdError {}
export class InvalidParamsError extends SnapshotdError {}
export class InternalError extends SnapshotdError {}

export class ApplicationError extends SnapshotdError {
  readonly code: number;
}
export class NotFoundError extends ApplicationError {}
export class AmbiguousError extends ApplicationError {
  /** Every checkpoint the reference could name, newest first (`data.candidates`). */
  readonly candidates: AmbiguousCandidate[];
}

/** One checkpoint an ambiguous reference matches, as `git rev-parse` lists them. */
export interface AmbiguousCandidate {
  id: Oid;
  session: string | null;
  seq: number;
  label: string | null;
  created_at: string;
  worktree: string;
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

export class ClientError extends SnapshotdError {
  readonly code: null;
  readonly kind: null;
}
export class ConnectionClosedError extends ClientError {}
export class DaemonUnreachableError extends ClientError {}
export class UnsafeSocketFolderError extends ClientError {}
export class UntrustedDaemonError extends ClientError {}
export class ResponseTooLongError extends ClientError {}
export class CallTimeoutError extends ClientError {}

export const ERROR_CODES: {
  readonly PARSE_ERROR: -32700;
  readonly INVALID_REQUEST: -32600;
  readonly METHOD_NOT_FOUND: -32601;
  readonly INVALID_PARAMS: -32602;
  readonly INTERNAL_ERROR: -32603;
  readonly APPLICATION_ERROR: -32000;
};

/** The error object of a response, as the matching class. */
export function errorFromWire(
  error: { code?: unknown; message?: unknown; data?: unknown },
  method?: string,
): SnapshotdError;
