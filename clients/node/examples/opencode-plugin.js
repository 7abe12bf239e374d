// An OpenCode (1.18) plug-in that checkpoints the worktree around every step of
// the agent: before each prompt, before and after each tool that can change
// files (bash, edit, write, apply_patch), and when the session goes idle (the
// end of a turn). Each checkpoint has the OpenCode session id as its session
// (a subagent's go to its parent's), so `snapshotd list --session <id>` reads
// as the conversation and `snapshotd revert <before> <after>` takes one step back.
//
// `snapshotd integrate opencode` installs this plug-in for you, with absolute
// paths to this package and to snapshotd. By hand: copy this file to
// .opencode/plugins/ (or ~/.config/opencode/plugins/) and make
// "snapshotd-client" importable there. What it does and its time limits:
// src/opencode.js.

import { opencodePlugin } from "snapshotd-client";

export const SnapshotdPlugin = opencodePlugin({ events: "tools" });
