// snapshotd's OpenCode (1.18) plug-in: checkpoints of the worktree at the
// moments snapshotd's Claude Code and Codex hooks take them. Before each
// prompt (`before: <prompt>`) and when the session goes idle (`after turn`);
// with `events: "tools"` also before and after each tool that can change
// files (`before edit: src/app.js`, `after bash: make`). Each checkpoint's
// session is the OpenCode session; a subagent's (a `task` tool's child
// session) are recorded in its parent's session, as `before subagent: …`,
// its tools, and `after subagent`, so they fall inside the parent's turn.
// OpenCode's ids go with each as its agent trailers (`Snapshotd-Agent-Tool:
// opencode`, `-Session`, `-Subagent`: the child session, `-Prompt`: the
// prompt's message, `-Tool-Use`: the tool call, `-Model`).
//
// OpenCode waits for a plug-in's hook with no limit, so every wait here has
// one: a "before" checkpoint is waited for at most the hooks' budget
// ($SNAPSHOTD_HOOK_BEFORE_BUDGET, 55 s), "after" ones not at all (they go on
// in the background, in the session's order, and OpenCode's `dispose` waits
// for them up to the same budget). Once the daemon has let a call run out,
// checkpoints are skipped until it answers a quick ping again, so a daemon
// that accepts and never answers costs one budget, not one per tool.
// Failures never reach the model: one line on stderr, and the last outcome in
// snapshotd's hooks folder, which `snapshotd doctor opencode` reads.

import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import { connect } from "./client.js";
import { CallTimeoutError, ClientError, NotFoundError } from "./errors.js";

/** Tools of OpenCode 1.18 that can change files (`apply_patch` replaces `edit` and `write` for GPT models). */
export const CHANGING_TOOLS = Object.freeze(["bash", "edit", "write", "apply_patch"]);
/** A label quotes at most this many characters of a prompt or a command (as the hooks' labels). */
export const LABEL_DETAIL_CHARS = 72;
/** How long a checkpoint is waited for by default (ms): the hooks' "before" budget. */
export const DEFAULT_BEFORE_BUDGET_MS = 55_000;
/** How long the quick ping that ends a pause in checkpoints may take (ms). */
export const PROBE_TIMEOUT_MS = 2_000;

const AFTER_TURN = "after turn";
const PATCH_MARKERS = ["*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: "];

/** The first non-empty line of `text`, cut to a label's length. */
function shorten(text) {
  const line = String(text ?? "").split("\n").map((part) => part.trim()).find(Boolean) ?? "";
  return line.length > LABEL_DETAIL_CHARS ? `${line.slice(0, LABEL_DETAIL_CHARS - 1).trimEnd()}…` : line;
}

/** Whether a session whose newest checkpoint is `label` is inside a turn that did not end. */
function turnOpen(label) {
  return !(label === AFTER_TURN || label.startsWith(`${AFTER_TURN} (`) || label.startsWith("session start"));
}

/** `$SNAPSHOTD_HOOK_BEFORE_BUDGET` seconds as ms, else `fallback`. */
function budgetFrom(env, fallback) {
  const seconds = Number(env.SNAPSHOTD_HOOK_BEFORE_BUDGET);
  return env.SNAPSHOTD_HOOK_BEFORE_BUDGET && Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : fallback;
}

/** Where the hooks keep their last outcome: `<data home>/hooks/last-opencode.json`. */
function resultPath(env) {
  const base = env.XDG_DATA_HOME || path.join(env.HOME || os.homedir(), ".local", "share");
  return path.join(env.SNAPSHOTD_HOME || path.join(base, "snapshotd"), "hooks", "last-opencode.json");
}

/** Keep one hook's outcome for `snapshotd doctor` (note null: recorded); a failure to write is ignored. */
function keepResult(file, event, cwd, note) {
  const entry = JSON.stringify({ time: Date.now() / 1000, event, cwd, ok: note === null, note });
  const temporary = `${path.dirname(file)}/.${path.basename(file)}.${process.pid}`;
  try {
    fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    fs.writeFileSync(temporary, entry, { mode: 0o600 });
    fs.renameSync(temporary, file);
  } catch {
    // the outcome is a convenience for doctor; the checkpoint is what matters
  }
}

/** `promise`, or `undefined` once `ms` have passed. */
function within(promise, ms) {
  let timer;
  const late = new Promise((resolve) => { timer = setTimeout(resolve, ms); });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * The plug-in function OpenCode calls (export it from a file in a `plugins` folder).
 * @param {{events?: "turns" | "tools", daemonCommand?: string[], socket?: string, beforeBudgetMs?: number, env?: object}} [options]
 */
export function opencodePlugin(options = {}) {
  const env = options.env ?? process.env;
  const tools = (options.events ?? "tools") === "tools";
  const budget = options.beforeBudgetMs ?? budgetFrom(env, DEFAULT_BEFORE_BUDGET_MS);
  const connectOptions = { socket: options.socket, env, autostart: true, daemonCommand: options.daemonCommand };

  return async ({ directory, worktree, client: opencode }) => {
    const root = worktree && worktree !== "/" ? worktree : directory; // OpenCode's worktree is "/" outside git
    const results = resultPath(env);
    /** @type {Promise<import("./client.js").Snapshotd> | null} */
    let daemon = null;
    let paused = false; // a call ran out: skip checkpoints until a quick ping is answered
    let told = false;
    const parents = new Map(); // a subagent's session -> its parent's
    const chains = new Map(); // session -> its last checkpoint's promise (the session's order)
    const pending = new Set();
    const details = new Map(); // tool call -> what its "before" label named

    const shown = (file) => {
      const relative = path.relative(root, path.resolve(root, String(file ?? "")));
      return relative && !relative.startsWith("..") && !path.isAbsolute(relative) ? relative : String(file ?? "");
    };

    function connection() {
      daemon ??= connect({ ...connectOptions, callTimeoutMs: budget }).catch((error) => {
        daemon = null;
        throw error;
      });
      return daemon;
    }

    function drop() {
      const stale = daemon;
      daemon = null;
      stale?.then((sd) => sd.destroy(), () => {});
    }

    async function answers() {
      try {
        const quick = await connect({ ...connectOptions, autostart: false, callTimeoutMs: PROBE_TIMEOUT_MS });
        quick.destroy();
        return true;
      } catch {
        return false;
      }
    }

    function fail(event, message) {
      message = String(message).replace(/\.$/, "");
      keepResult(results, event, root, message);
      if (!told) console.error(`snapshotd: a checkpoint was not recorded (${message}); run \`snapshotd doctor opencode\``);
      told = true;
    }

    /** The session a checkpoint of `session` belongs to: a subagent's parent's (asked of OpenCode once). */
    async function owner(session) {
      if (!parents.has(session)) {
        const asked = opencode?.session?.get?.({ path: { id: session } })
          .then((reply) => reply?.data?.parentID ?? null, () => null);
        parents.set(session, (await within(asked ?? Promise.resolve(null), PROBE_TIMEOUT_MS)) ?? null);
      }
      const parent = parents.get(session);
      return parent ? ((await owner(parent)) ?? parent) : null;
    }

    async function attempt(event, session, label, opensTurn, agent) {
      if (paused && !(await answers())) {
        fail(event, `the daemon still does not answer; '${label}' was skipped`);
        return;
      }
      paused = false;
      try {
        const sd = await connection();
        if (opensTurn) {
          // A folder in no worktree yet has no checkpoint: the checkpoint below makes it one.
          const newest = await sd.list({ path: root, session, limit: 1 }).catch((error) => {
            if (error instanceof NotFoundError) return { checkpoints: [] };
            throw error;
          });
          const { checkpoints } = newest;
          if (checkpoints.length && turnOpen(checkpoints[0].label ?? "")) {
            await sd.checkpoint({ path: root, session, label: `${AFTER_TURN} (interrupted)`, agent: { tool: "opencode", session } });
          }
        }
        await sd.checkpoint({ path: root, session, label, agent });
        keepResult(results, event, root, null);
      } catch (error) {
        if (!(error instanceof ClientError) || error instanceof CallTimeoutError) drop();
        if (error instanceof CallTimeoutError) paused = true;
        fail(event, error.message);
      }
    }

    /** Checkpoint `label` in `session`'s order; resolves when it is recorded, or failed, or after the budget. */
    function record(event, session, label, opensTurn, agent) {
      const previous = chains.get(session) ?? Promise.resolve();
      const link = previous.then(() => attempt(event, session, label, opensTurn, agent));
      chains.set(session, link);
      pending.add(link);
      link.finally(() => {
        pending.delete(link);
        if (chains.get(session) === link) chains.delete(session);
      });
      return within(link, budget);
    }

    /** Record for `sessionID`, in its parent's session when it is a subagent's (`sub` labels it so), with
     * OpenCode's ids as the checkpoint's agent trailers (`ids`: the prompt's message, the tool call, the model). */
    async function checkpoint(event, sessionID, label, sub, ids = {}) {
      const parent = await owner(sessionID);
      const known = Object.fromEntries(Object.entries(ids).filter(([, value]) => typeof value === "string" && /^[^\s\x00-\x1f\x7f]([^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f])?$/.test(value) && value.length <= 1024));
      if (parent) return record(event, parent, sub(label), false, { tool: "opencode", session: parent, subagent: sessionID, ...known });
      return record(event, sessionID, label, event === "chat.message", { tool: "opencode", session: sessionID, ...known });
    }

    function toolDetail(tool, args) {
      if (tool === "bash") return shorten(args?.command);
      if (tool === "apply_patch") {
        const files = [];
        for (const line of String(args?.patchText ?? "").split("\n")) {
          const marker = PATCH_MARKERS.find((each) => line.startsWith(each));
          const file = marker && shown(line.slice(marker.length).trim());
          if (file && !files.includes(file)) files.push(file);
        }
        return shorten(files.join(", "));
      }
      return args?.filePath ? shorten(shown(args.filePath)) : "";
    }

    const hooks = {
      "chat.message": async ({ sessionID, messageID, model }, { parts }) => {
        const prompt = shorten(parts?.find((part) => part.type === "text")?.text);
        const ids = { prompt: messageID, model: model?.providerID && model?.modelID ? `${model.providerID}/${model.modelID}` : undefined };
        await checkpoint("chat.message", sessionID, `before: ${prompt}`, () => `before subagent: ${prompt}`.trimEnd(), ids);
      },
      event: async ({ event }) => {
        if (event.type === "session.created" && event.properties?.info?.parentID) {
          parents.set(event.properties.info.id, event.properties.info.parentID);
        } else if (event.type === "session.idle") {
          await checkpoint("session.idle", event.properties.sessionID, AFTER_TURN, () => "after subagent");
        }
      },
      dispose: async () => {
        await within(Promise.all(pending), budget);
        drop();
      },
    };
    if (tools) {
      hooks["tool.execute.before"] = async ({ tool, sessionID, callID }, { args }) => {
        if (!CHANGING_TOOLS.includes(tool)) return;
        const detail = toolDetail(tool, args);
        details.set(callID, detail);
        const label = `before ${tool}${detail ? `: ${detail}` : ""}`;
        await checkpoint("tool.execute.before", sessionID, label, (same) => same, { tool_use: callID });
      };
      hooks["tool.execute.after"] = async ({ tool, sessionID, callID, args }) => {
        if (!CHANGING_TOOLS.includes(tool)) return;
        const detail = details.get(callID) ?? toolDetail(tool, args);
        details.delete(callID);
        const label = `after ${tool}${detail ? `: ${detail}` : ""}`;
        checkpoint("tool.execute.after", sessionID, label, (same) => same, { tool_use: callID }); // not waited for
      };
    }
    connection().then((sd) => sd.open(root)).catch(() => {}); // warm the worktree: the first "before" is quick
    return hooks;
  };
}
