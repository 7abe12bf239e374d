// An OpenCode plug-in that checkpoints the worktree around every step of the
// agent: before each user prompt is handled, before and after each tool that
// can change files, and when the session goes idle (the end of a turn).
// Each checkpoint has the OpenCode session id as its session, so
// `snapshotd list --session <id>` reads as the conversation, and
// `snapshotd revert <before> <after>` takes one step back.
//
// Install: copy this file to .opencode/plugins/ (or ~/.config/opencode/plugins/)
// and `npm install snapshotd-client` where OpenCode finds packages.
// A failure never blocks the agent: it is reported once on stderr.

import { ClientError, connect } from "snapshotd-client";

/** Tools that can change files; reads and searches need no checkpoint. */
const CHANGING_TOOLS = new Set(["bash", "edit", "write", "patch", "multiedit"]);

/** The first line of `text`, cut to a label's length. */
function firstLine(text, max = 80) {
  const line = String(text ?? "").trim().split("\n", 1)[0];
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

export const SnapshotdPlugin = async ({ directory, worktree }) => {
  const root = worktree || directory;
  let client = null;
  let warned = false;

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
      const sd = await daemon();
      await sd.checkpoint({ path: root, session, label });
    } catch (error) {
      if (error instanceof ClientError) client = null; // the connection is gone: make a new one next time
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
      const what = tool === "bash" ? firstLine(args?.command) : args?.filePath ?? "";
      await checkpoint(sessionID, `before ${tool}: ${what}`.trimEnd());
    },
    "tool.execute.after": async ({ tool, sessionID }, { title }) => {
      if (!CHANGING_TOOLS.has(tool)) return;
      await checkpoint(sessionID, `after ${tool}: ${firstLine(title)}`.trimEnd());
    },
    event: async ({ event }) => {
      if (event.type === "session.idle") await checkpoint(event.properties.sessionID, "after turn");
    },
  };
};
