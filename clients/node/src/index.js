// snapshotd-client: a client for the snapshotd daemon's socket protocol.

export { DEFAULT_CALL_TIMEOUT_MS, DEFAULT_LINE_LIMIT, SUBSCRIPTION_BUFFER, Snapshotd, Subscription, connect } from "./client.js";
export { DEFAULT_DAEMON_COMMAND, DEFAULT_START_TIMEOUT_MS } from "./autostart.js";
export { DEFAULT_CONNECT_TIMEOUT_MS } from "./dialing.js";
export { resolveSocketPath } from "./socket.js";
export * from "./errors.js";
export { CHANGING_TOOLS, DEFAULT_BEFORE_BUDGET_MS, opencodePlugin } from "./opencode.js";
