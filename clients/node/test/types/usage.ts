// Compiled with `tsc --noEmit` only: the declarations describe the whole
// protocol, and misuse is a type error (each @ts-expect-error must fail).

import {
  AmbiguousError,
  type Checkpoint,
  type ChangedNotification,
  type CheckpointNotification,
  type FileChange,
  NotFoundError,
  Snapshotd,
  SnapshotdError,
  connect,
  resolveSocketPath,
} from "snapshotd-client";

export async function turn(worktree: string): Promise<void> {
  const sd: Snapshotd = await connect({ autostart: true, daemonCommand: ["snapshotd"], lineLimit: 1 << 20 });
  const socket: string = resolveSocketPath(undefined, {});
  const { version, pid, uptime_s } = await sd.ping();
  const before: Checkpoint = (await sd.checkpoint({ path: worktree, session: "t", label: "before" })).checkpoint;
  const { stats } = await sd.checkpoint({ worktree: before.worktree, exact: true });
  const scan: "full" | "watch" | "none" = stats.scan;
  const listed: Checkpoint[] = (await sd.list({ path: worktree, session: "t", limit: 5, remote: true })).checkpoints;
  const remote: string | undefined = listed[0]?.remote;
  const shown = await sd.show(before.id.slice(0, 7));
  const resolved = await sd.resolve({ checkpoint: "@~1", path: worktree, session: "t" });
  const files: FileChange[] = (await sd.diff({ from: before.id, to: "worktree", patch: true, context: 1 })).files;
  const patch: string | undefined = (await sd.diff({ from: "@", path: worktree })).patch;
  const restored = await sd.restore({ checkpoint: before.id, paths: ["a"], dry_run: true });
  const kept: string[] = (restored.kept ?? []).map((each) => each.reason);
  const reverted = await sd.revert({ from: before.id, force: true });
  const conflicts: string[] = reverted.conflicts.map((each) => each.path);
  await sd.delete({ checkpoints: [before.id] });
  await sd.delete({ path: worktree, session: null });
  const gc = await sd.gc({ all: true, dry_run: true, include_safety: false, keep: 3, older_than_s: 60 });
  const wouldDelete = gc.would_delete?.[0]?.session;
  const moved: string[] = (await sd.repair()).moved.map((move) => move.to);
  const counters: Record<string, number> = (await sd.status()).counters;
  const unopened: boolean = (await sd.worktrees({ known: true })).worktrees.some((each) => each.open === false);
  const { differences, scan_ms } = await sd.verify(worktree);
  const { pushed, up_to_date } = await sd.push({ path: worktree, remote: "origin" });
  const { fetched } = await sd.fetch({ path: worktree });
  const subscription = await sd.subscribe({ path: worktree });
  for await (const change of subscription) {
    const notification: ChangedNotification = change;
    if (notification.overflow || notification.paths.length) break;
  }
  await sd.unsubscribe(subscription.id);
  const timeline = await sd.subscribe(worktree, { checkpoints: true });
  for await (const event of timeline) {
    if ("checkpoint" in event) { const recorded: CheckpointNotification = event; void recorded.checkpoint.seq; }
    else if (event.overflow) break;
  }
  const page = await sd.diff({ from: "@", patch: true, offset: 25, max_patch_bytes: 1 << 20 });
  const nextPage: number | null | undefined = page.next_offset;
  if (nextPage != null && page.worktree_tree !== undefined) {
    await sd.diff({ from: "@", patch: true, offset: nextPage, worktree_tree: page.worktree_tree });
  }
  const raw = await sd.call<{ anything: number }>("future_method", { x: 1 });
  try {
    await sd.show("0000000");
  } catch (error) {
    if (error instanceof AmbiguousError) error.candidates.map(({ id, session, seq }) => `${id} ${session} #${seq}`);
    if (error instanceof NotFoundError) { const kind: string | null = error.kind; }
    if (error instanceof SnapshotdError) { const code: number | null = error.code; const data = error.data; }
  }
  await sd.shutdown();
  await sd.close();
  void [socket, version, pid, uptime_s, shown, resolved, files, patch, kept, conflicts, wouldDelete, moved, counters,
    differences, scan_ms, pushed, up_to_date, fetched, raw, scan, remote, nextPage];

  // @ts-expect-error: a checkpoint needs a worktree
  await sd.checkpoint({ label: "x" });
  // @ts-expect-error: diff needs `from`
  await sd.diff({ to: "worktree" });
  // @ts-expect-error: the status of a FileChange is one of five words
  const status: FileChange["status"] = "copied";
  // @ts-expect-error: restore needs a checkpoint
  await sd.restore({ paths: ["a"] });
  void status;
}
