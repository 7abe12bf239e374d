// Real daemons and real git repositories for the tests. Importing this
// module gives the test process an environment of its own (HOME, runtime and
// data folders, git identity) under a temporary folder, so that neither the
// machine's git configuration nor a daemon the user runs is involved.

import { execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

export const PACKAGE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/** The `snapshotd` program under test: `$SNAPSHOTD_BIN`, else the project's .venv. */
export const SNAPSHOTD_BIN = path.resolve(PACKAGE_DIR, process.env.SNAPSHOTD_BIN || "../../.venv/bin/snapshotd");

const START_TIMEOUT_MS = 15_000;

const made = [];
process.once("exit", () => {
  for (const dir of made) fs.rmSync(dir, { recursive: true, force: true });
});

/** A new private temporary folder (mode 0700), removed when the process exits. */
export function tempDir(prefix = "sdc-") {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  made.push(dir);
  return dir;
}

function isolate() {
  const home = tempDir("sdc-home-");
  fs.mkdirSync(path.join(home, "run"), { mode: 0o700 });
  Object.assign(process.env, {
    HOME: home,
    XDG_CONFIG_HOME: path.join(home, ".config"),
    XDG_DATA_HOME: path.join(home, ".local", "share"),
    XDG_RUNTIME_DIR: path.join(home, "run"),
    SNAPSHOTD_HOME: path.join(home, "snapshotd-home"),
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_AUTHOR_NAME: "Test User",
    GIT_AUTHOR_EMAIL: "test@example.invalid",
    GIT_COMMITTER_NAME: "Test User",
    GIT_COMMITTER_EMAIL: "test@example.invalid",
    LC_ALL: "C",
  });
  for (const name of ["SNAPSHOTD_SOCKET", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_GLOBAL"]) {
    delete process.env[name];
  }
  fs.writeFileSync(path.join(home, ".gitconfig"), "[init]\n\tdefaultBranch = main\n");
}
isolate();

/** Run git in `cwd` and return its output. */
export function git(cwd, ...args) {
  return execFileSync("git", args, { cwd, encoding: "utf8" });
}

/** A git repository with `files` ({name: content}) committed on main. */
export function makeRepo(files = { "README.md": "hello\n" }) {
  const root = tempDir("sdc-repo-");
  git(root, "init", "-q");
  writeFiles(root, files);
  git(root, "add", "-A");
  git(root, "commit", "-q", "-m", "initial");
  return root;
}

/** Write each {relative path: content} under `root`, making folders as needed. */
export function writeFiles(root, files) {
  for (const [name, content] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(root, name)), { recursive: true });
    fs.writeFileSync(path.join(root, name), content);
  }
}

/** The tree git itself would record for the worktree: `git add -A && git write-tree` on a copy of the index. */
export function gitTree(root) {
  const index = path.join(tempDir("sdc-index-"), "index");
  const gitDir = git(root, "rev-parse", "--absolute-git-dir").trim();
  fs.copyFileSync(path.join(gitDir, "index"), index);
  const env = { ...process.env, GIT_INDEX_FILE: index };
  execFileSync("git", ["add", "-A"], { cwd: root, env });
  return execFileSync("git", ["write-tree"], { cwd: root, env, encoding: "utf8" }).trim();
}

/** Whether something accepts connections at the socket path. */
export function answers(socketPath) {
  return new Promise((resolve) => {
    const probe = net.createConnection(socketPath);
    probe.once("connect", () => { probe.destroy(); resolve(true); });
    probe.once("error", () => resolve(false));
  });
}

/**
 * Run `snapshotd serve --socket SOCKET` until `stop()`; resolves once it
 * accepts connections. The daemon's output goes to `log` beside the socket.
 */
export async function startDaemon(socketPath = path.join(tempDir("sdc-sock-"), "s.sock"), ...args) {
  const logPath = `${socketPath}.test.log`;
  const log = fs.openSync(logPath, "a");
  const proc = spawn(SNAPSHOTD_BIN, ["serve", "--socket", socketPath, ...args], { stdio: ["ignore", log, log] });
  fs.closeSync(log);
  let exited = null;
  const exit = new Promise((resolve) => proc.once("exit", (code, signal) => resolve((exited = code ?? signal))));
  const deadline = Date.now() + START_TIMEOUT_MS;
  while (!(await answers(socketPath))) {
    if (exited !== null || Date.now() > deadline) {
      proc.kill("SIGKILL");
      throw new Error(`the daemon did not start (exit ${exited}):\n${fs.readFileSync(logPath, "utf8")}`);
    }
    await sleep(20);
  }
  return {
    socket: socketPath,
    pid: proc.pid,
    exit,
    /** SIGTERM, then wait for it to exit. */
    async stop() {
      if (exited === null) proc.kill("SIGTERM");
      return exit;
    },
  };
}

/** Wait until `predicate()` is truthy, or fail after `timeoutMs`. */
export async function waitFor(predicate, what, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

/** Whether process `pid` is alive. */
export function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
