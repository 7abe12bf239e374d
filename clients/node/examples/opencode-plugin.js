// An OpenCode plug-in that checkpoints the worktree around every step of the
// agent: before each user prompt is handled, before and after each tool that
// can change files, and when the session goes idle (the end of a turn).
// Each checkpoint has the OpenCode session id as its session, so
// `snapshotd list --session <id>` reads as the conversation, and
// `snapshotd revert <before> <after>` takes one step back.
//
// Install: copy this file to .opencode/plugins/ (or ~/.config/opencode/plugins/)
// and `npm install snapshotd-client` where OpenCode finds packages.
// A failure never blocks the agent: it is reported once on stderr, and every call
// gives up after $SNAPSHOTD_CALL_TIMEOUT seconds (30), since OpenCode waits for a
// plug-in's hook with no limit.

import * as path from "node:path";

import { ClientError, connect } from "snapshotd-client";

/** Tools of OpenCode 1.18 that can change files; reads and searches need no checkpoint. */
const CHANGING_TOOLS = new Set(["bash", "edit", "write", "apply_patch"]);

/** OpenCode waits for a plug-in's hook with no limit: a daemon that never answers must not hold it
 * (`$SNAPSHOTD_CALL_TIMEOUT` seconds, default 30). */
const CALL_LIMIT_MS = 1000 * (Number(process.env.SNAPSHOTD_CALL_TIMEOUT) || 30);

/** The first line of `text`, cut to a label's length. */
function firstLine(text, max = 80) {
  const line = String(text ?? "").trim().split("\n", 1)[0];
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

/** `work` (a promise), or an error once `ms` have passed. */
function within(work, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`snapshotd did not answer ${what} within ${ms / 1000} s`)), ms);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}

export const SnapshotdPlugin = async ({ directory, worktree }) => {
  const root = worktree || directory;
  let client = null;
  let warned = false;

  /** A path as the label shows it: relative to the worktree when inside it. */
  const shown = (file) => {
    const relative = path.relative(root, path.resolve(root, String(file ?? "")));
    return relative && !relative.startsWith("..") && !path.isAbsolute(relative) ? relative : String(file ?? "");
  };

  /** One connection for the plug-in's life, made again if the daemon went away. */
  async function daemon() {
    client ??= connect({ autostart: true }).catch((error) => {
      client = null;
      throw error;
    });
    return client;
  }

  async function checkpoint(session, label) {
    try {
      const sd = await within(daemon(), CALL_LIMIT_MS, "a connection");
      await within(sd.checkpoint({ path: root, session, label }), CALL_LIMIT_MS, `the checkpoint '${label}'`);
    } catch (error) {
      if (!(error instanceof ClientError) || !error.data) {
        const stale = client;
        client = null; // the connection is gone or stuck: make a new one next time
        stale?.then((sd) => sd.destroy(), () => {});
      }
      if (!warned) console.error(`snapshotd: no checkpoint (${error.message})`);
      warned = true;
    }
  }

  return {
    "chat.message": async ({ sessionID }, { parts }) => {
      const prompt = parts.find((part) => part.type === "text")?.text;
      await checkpoint(sessionID, `before: ${firstLine(prompt)}`);
    },
    "tool.execute.before": async ({ tool, sessionID }, { args }) => {
      if (!CHANGING_TOOLS.has(tool)) return;
      const what = tool === "bash" ? firstLine(args?.command) : args?.filePath ? shown(args.filePath) : "";
      await checkpoint(sessionID, `before ${tool}: ${what}`.trimEnd());
    },
    "tool.execute.after": async ({ tool, sessionID }, { title }) => {
      if (!CHANGING_TOOLS.has(tool)) return;
      await checkpoint(sessionID, `after ${tool}: ${tool === "bash" ? firstLine(title) : shown(firstLine(title))}`.trimEnd());
    },
    event: async ({ event }) => {
      if (event.type === "session.idle") await checkpoint(event.properties.sessionID, "after turn");
    },
  };
};
