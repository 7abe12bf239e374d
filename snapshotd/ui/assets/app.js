// snapshotd ui: the timeline, an entry's files and diffs, and the actions, over the page's own /api.
// Everything shown is built with textContent; only the patch lines, which the server escaped and
// coloured with Pygments, are set as HTML.

const $ = (id) => document.getElementById(id);
const state = {
  worktrees: [], worktree: null, session: null, entries: [], nextOffset: null,
  entry: null, files: [], nextFile: null, file: null, picked: [], pickedFiles: new Set(),
  layout: "unified", seen: new Set(),
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, { credentials: "same-origin", ...options });
  const data = await response.json().catch(() => ({ error: { message: `The page's server answered ${response.status}.` } }));
  if (!response.ok || data.error) throw new Error(data.error ? data.error.message : `HTTP ${response.status}`);
  return data;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined) q.set(k, v);
  return q.toString();
}

function toast(text, error = false) {
  const t = $("toast");
  t.textContent = text;
  t.classList.toggle("error", error);
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.textContent = ""; }, error ? 12000 : 6000);
}

function age(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  for (const [unit, size] of [["day", 86400], ["hour", 3600], ["minute", 60]]) {
    if (seconds >= size) { const n = Math.floor(seconds / size); return `${n} ${unit}${n === 1 ? "" : "s"} ago`; }
  }
  return "just now";
}

const short = (id) => (id ? id.slice(0, 12) : "—");
const plural = (n, word, many = `${word}s`) => `${n} ${n === 1 ? word : many}`;

// --- worktrees and sessions ---------------------------------------------------------

async function loadWorktrees() {
  const data = await api("/api/worktrees");
  const shown = JSON.stringify(data.worktrees);
  if (shown === state.shownWorktrees && state.worktree) return; // unchanged: keep the focus where it is
  state.shownWorktrees = shown;
  state.worktrees = data.worktrees;
  if (!state.worktree || !state.worktrees.some((w) => w.id === state.worktree)) {
    state.worktree = data.focus || (state.worktrees[0] && state.worktrees[0].id) || null;
  }
  drawWorktrees();
}

function drawWorktrees() {
  const list = $("worktrees");
  list.replaceChildren();
  if (!state.worktrees.length) list.append(el("li", { class: "note", text: "No worktree yet: run `snapshotd checkpoint` or `snapshotd integrate`." }));
  for (const wt of state.worktrees) {
    const current = wt.id === state.worktree;
    const item = el("li", {},
      el("button", {
        type: "button", class: "worktree", "aria-current": current ? "true" : "false",
        onclick: () => chooseWorktree(wt.id, null),
      },
      el("span", { class: "path", text: wt.path }),
      el("span", { class: "sub", text: `${wt.presence === "gone" || wt.presence === "removed" ? `${wt.presence} · ` : ""}${wt.branch || wt.kind} · ${plural(wt.entries || 0, "entry", "entries")}` })));
    if (current) {
      const sessions = el("ul", { class: "sessions", "aria-label": `Sessions of ${wt.path}` });
      const all = el("button", { type: "button", class: "session", "aria-current": state.session === null ? "true" : "false",
        onclick: () => chooseWorktree(wt.id, null) }, "All sessions");
      sessions.append(el("li", {}, all));
      for (const s of wt.sessions) {
        sessions.append(el("li", {}, el("button", {
          type: "button", class: "session", "aria-current": state.session === s.name ? "true" : "false",
          onclick: () => chooseWorktree(wt.id, s.name),
        }, s.name === null ? "(no session)" : s.name, el("span", { class: "sub", text: `${s.entries} · ${age(s.newest)}` }))));
      }
      item.append(sessions);
    }
    list.append(item);
  }
  $("undo").disabled = !state.worktree;
}

async function chooseWorktree(id, session) {
  state.worktree = id;
  state.session = session;
  state.picked = [];
  drawWorktrees();
  await loadTimeline(true);
}

// --- the timeline -------------------------------------------------------------------

async function loadTimeline(reset, keep = 0) {
  if (!state.worktree) { $("entries").replaceChildren(); $("timeline-note").textContent = ""; return; }
  const offset = reset ? 0 : state.entries.length;
  const limit = reset && keep > 0 ? Math.min(Math.max(keep, 50), 500) : 50;
  const data = await api(`/api/timeline?${query({ worktree: state.worktree, session: state.session, offset, limit })}`);
  const fresh = [];
  if (reset) {
    if (state.seen.size) for (const e of data.entries) if (!state.seen.has(e.target)) fresh.push(e.target);
    state.entries = data.entries;
  } else {
    state.entries = state.entries.concat(data.entries);
  }
  for (const e of data.entries) state.seen.add(e.target);
  state.nextOffset = data.next_offset;
  $("timeline-note").textContent = `${plural(data.total, "entry", "entries")}, newest first`;
  drawEntries(new Set(fresh));
}

function entryKey(e) { return `${e.source || ""}..${e.target}`; }

function drawEntries(fresh) {
  const list = $("entries");
  list.replaceChildren();
  for (const e of state.entries) {
    const label = e.kind === "turn" ? `turn ${e.turn}` : e.session === "snapshotd:safety" ? "safety" : "checkpoint";
    const counts = e.files === null ? "" : `${plural(e.files, "file")} `;
    const pick = el("input", {
      type: "checkbox", "aria-label": `Pick “${e.title}” to compare`, checked: state.picked.includes(e.target),
      onchange: (ev) => pickEntry(e, ev.target.checked),
    });
    const open = el("button", { type: "button", class: "entry", "aria-label": `Open ${label}: ${e.title}`, onclick: () => openEntry(e) },
      el("span", { class: "title" }, el("span", { class: "tag", text: label }), e.title + (e.open ? " (open)" : "")),
      el("span", { class: "counts" }, counts, el("span", { class: "add", text: `+${e.additions ?? 0}` }), " ",
        el("span", { class: "del", text: `-${e.deletions ?? 0}` })),
      el("span", { class: "meta", text: `${e.session ?? "(no session)"} · #${e.first_seq}${e.first_seq !== e.last_seq ? `..#${e.last_seq}` : ""} · ${short(e.target)}` }),
      el("time", { class: "when", datetime: e.ended_at, title: new Date(e.ended_at).toLocaleString(), text: age(e.ended_at) }));
    const item = el("li", { class: [fresh.has(e.target) ? "fresh" : "", state.entry && entryKey(state.entry) === entryKey(e) ? "chosen" : ""].join(" ").trim() }, pick, open);
    item.dataset.target = e.target;
    list.append(item);
  }
  $("more").hidden = state.nextOffset === null;
  $("compare").disabled = state.picked.length !== 2;
}

function pickEntry(entry, on) {
  state.picked = state.picked.filter((id) => id !== entry.target);
  if (on) state.picked.push(entry.target);
  while (state.picked.length > 2) state.picked.shift();
  drawEntries(new Set());
}

function compare() {
  const chosen = state.entries.filter((e) => state.picked.includes(e.target));
  if (chosen.length !== 2) return;
  chosen.sort((a, b) => (a.ended_at < b.ended_at ? -1 : 1));
  openEntry({
    kind: "compare", title: `Compare ${short(chosen[0].target)} with ${short(chosen[1].target)}`, session: null,
    source: chosen[0].target, target: chosen[1].target, first_seq: chosen[0].last_seq, last_seq: chosen[1].last_seq,
    ended_at: chosen[1].ended_at,
  });
}

// --- an entry's files and their patches ------------------------------------------------

async function openEntry(entry) {
  state.entry = entry;
  state.pickedFiles = new Set();
  state.file = null;
  drawEntries(new Set());
  $("detail").hidden = false;
  $("detail-title").textContent = entry.title;
  $("detail-span").textContent = entry.source
    ? `From ${short(entry.source)} to ${short(entry.target)}${entry.session ? ` · session ${entry.session}` : ""}`
    : `The first checkpoint of its session (${short(entry.target)}): nothing before it to compare with.`;
  drawActions();
  $("files").replaceChildren();
  $("patch").replaceChildren();
  state.files = [];
  if (entry.source) await loadFiles(true);
  else drawFiles();
  $("detail").focus({ preventScroll: true });
  $("detail").scrollIntoView({ block: "start" });
}

function drawActions() {
  const e = state.entry;
  const box = $("actions");
  box.replaceChildren();
  if (!e) return;
  if (e.source && e.kind === "turn") {
    box.append(el("button", { type: "button", class: "danger", onclick: () => ask({ action: "revert", from: e.source, to: e.target }) }, "Revert this turn"));
  } else if (e.source && e.kind === "checkpoint") {
    box.append(el("button", { type: "button", class: "danger", onclick: () => ask({ action: "revert", from: e.source, to: e.target }) }, "Revert these changes"));
  }
  if (e.source) box.append(el("button", { type: "button", onclick: () => ask({ action: "restore", checkpoint: e.source }) }, `Restore to before (${short(e.source)})`));
  box.append(el("button", { type: "button", onclick: () => ask({ action: "restore", checkpoint: e.target }) }, `Restore to ${e.source ? "after" : "this checkpoint"} (${short(e.target)})`));
}

async function loadFiles(reset) {
  const e = state.entry;
  const offset = reset ? 0 : state.files.length;
  const data = await api(`/api/files?${query({ worktree: state.worktree, from: e.source, to: e.target, offset })}`);
  if (state.entry !== e) return;
  state.files = reset ? data.files : state.files.concat(data.files);
  state.nextFile = data.next_offset;
  $("files-title").textContent = `${plural(data.total, "file")} changed, +${data.additions} -${data.deletions}`;
  drawFiles();
  if (reset && state.files.length) await showFile(state.files[0]);
}

function drawFiles() {
  const list = $("files");
  list.replaceChildren();
  if (!state.entry.source) $("files-title").textContent = "Files";
  for (const f of state.files) {
    const name = f.old_display ? `${f.old_display} → ${f.display}` : f.display;
    const pick = el("input", { type: "checkbox", "aria-label": `Pick ${f.display}`, checked: state.pickedFiles.has(f.path),
      onchange: (ev) => { if (ev.target.checked) state.pickedFiles.add(f.path); else state.pickedFiles.delete(f.path); drawPickedButtons(); } });
    const counts = f.binary ? el("span", { class: "status", text: "binary" })
      : el("span", {}, el("span", { class: "add", text: `+${f.additions}` }), " ", el("span", { class: "del", text: `-${f.deletions}` }));
    const item = el("li", { class: state.file && state.file.path === f.path ? "chosen" : "" }, pick,
      el("button", { type: "button", class: "file", "aria-label": `Show the diff of ${name}`, onclick: () => showFile(f) },
        el("span", { class: "status", text: f.status }), name), counts);
    list.append(item);
  }
  $("more-files").hidden = state.nextFile === null;
  drawPickedButtons();
}

function drawPickedButtons() {
  const some = state.pickedFiles.size > 0;
  $("restore-some-before").disabled = !some || !state.entry || !state.entry.source;
  $("restore-some-after").disabled = !some || !state.entry;
}

async function showFile(f) {
  state.file = f;
  drawFiles();
  const e = state.entry;
  const box = $("patch");
  box.replaceChildren(el("p", { class: "note", text: `Loading ${f.display}…` }));
  let data;
  try {
    data = await api(`/api/patch?${query({ worktree: state.worktree, from: e.source, to: e.target, path: f.path })}`);
  } catch (err) {
    box.replaceChildren(el("p", { class: "summary", text: err.message }));
    return;
  }
  if (state.file !== f) return;
  state.patch = data;
  drawPatch();
}

function drawPatch() {
  const data = state.patch;
  const f = state.file;
  const box = $("patch");
  const title = el("h3", { text: f.old_display ? `${f.old_display} → ${f.display}` : f.display });
  const modes = data.old_mode && data.new_mode && data.old_mode !== data.new_mode ? ` (mode ${data.old_mode} → ${data.new_mode})` : "";
  if (data.shown !== "patch") {
    const why = {
      binary: "Binary file: its contents are not shown.",
      submodule: "A submodule: its commit changed.",
      large: `Too large to show here${data.bytes ? ` (${Math.round(data.bytes / 1024)} KiB of patch)` : ""}; see it with \`snapshotd diff --patch\`.`,
    }[data.shown];
    box.replaceChildren(title, el("p", { class: "summary", text: `${f.status}${modes}. ${why}` }));
    return;
  }
  const table = el("table", { class: "diff hl", "aria-label": `Diff of ${f.display}, ${state.layout === "split" ? "side by side" : "unified"}` });
  const widths = state.layout === "split" ? ["no", "sign", "", "no", "sign", ""] : ["no", "no", "sign", ""];
  table.append(el("colgroup", {}, ...widths.map((w) => el("col", { class: w ? `col-${w}` : "col-code" }))));
  const body = el("tbody");
  for (const hunk of data.hunks) {
    body.append(el("tr", { class: "hunk" }, el("td", { colspan: state.layout === "split" ? 6 : 4, text: hunk.header })));
    if (state.layout === "split") drawSplit(body, hunk.lines); else drawUnified(body, hunk.lines);
  }
  table.append(body);
  const notes = data.hunks.length ? null : el("p", { class: "summary", text: `${f.status}${modes}; no lines changed.` });
  box.replaceChildren(title, notes || table);
}

function code(line, cls) {
  const td = el("td", { class: `code ${cls}` });
  td.innerHTML = line.html; // escaped and coloured by the server (Pygments)
  return td;
}

const KIND = { "+": "plus", "-": "minus", " ": "", "\\": "" };

function drawUnified(body, lines) {
  for (const line of lines) {
    body.append(el("tr", { class: KIND[line.kind] },
      el("td", { class: "no", text: line.old ?? "" }), el("td", { class: "no", text: line.new ?? "" }),
      el("td", { class: "sign", text: line.kind === "\\" ? "" : line.kind }), code(line, "")));
  }
}

function drawSplit(body, lines) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (line.kind === " " || line.kind === "\\") {
      body.append(el("tr", {}, el("td", { class: "no", text: line.old ?? "" }), el("td", { class: "sign" }), code(line, ""),
        el("td", { class: "no", text: line.new ?? "" }), el("td", { class: "sign" }), code(line, "")));
      i += 1;
      continue;
    }
    const minus = [], plus = [];
    while (i < lines.length && lines[i].kind === "-") minus.push(lines[i++]);
    while (i < lines.length && lines[i].kind === "+") plus.push(lines[i++]);
    for (let k = 0; k < Math.max(minus.length, plus.length); k++) {
      const m = minus[k], p = plus[k];
      body.append(el("tr", {},
        el("td", { class: "no", text: m ? m.old : "" }), el("td", { class: `sign ${m ? "minus" : "empty"}`, text: m ? "-" : "" }),
        m ? code(m, "minus") : el("td", { class: "empty" }),
        el("td", { class: "no", text: p ? p.new : "" }), el("td", { class: `sign ${p ? "plus" : "empty"}`, text: p ? "+" : "" }),
        p ? code(p, "plus") : el("td", { class: "empty" })));
    }
  }
}

// --- actions: preview, confirm, result ---------------------------------------------------

function listOf(title, names) {
  if (!names || !names.length) return null;
  return el("div", {}, el("h3", { text: `${title} (${names.length})` }),
    el("ul", {}, ...names.slice(0, 200).map((n) => el("li", { text: n })), names.length > 200 ? el("li", { text: `… and ${names.length - 200} more` }) : null));
}

function describe(result, preview) {
  const shown = result.shown;
  const parts = [
    listOf(preview ? "Will write" : "Written", shown.written),
    listOf(preview ? "Will delete" : "Deleted", shown.deleted),
    listOf(preview ? "Will make a submodule's folder only" : "Made a submodule's folder only", shown.submodules),
    listOf("Conflicts, left alone (changed since)", shown.conflicts),
    listOf("Kept in place", shown.kept),
  ];
  if (!shown.written.length && !shown.deleted.length && !shown.submodules.length) parts.push(el("p", { text: "No file would change." }));
  return parts.filter(Boolean);
}

async function ask(request) {
  const base = { ...request, worktree: state.worktree };
  let preview;
  try {
    preview = await api("/api/action", { ...base, confirm: false });
  } catch (err) { toast(err.message, true); return; }
  const verb = { revert: "Revert", restore: "Restore", undo: "Undo the last restore" }[request.action];
  $("confirm-title").textContent = request.action === "undo"
    ? `${verb} (back to ${short(preview.checkpoint)})?`
    : `${verb}${request.paths ? ` ${plural(request.paths.length, "file")}` : ""}${request.checkpoint ? ` to ${short(request.checkpoint)}` : ""}?`;
  $("confirm-body").replaceChildren(el("p", { class: "note", text: "A safety checkpoint of the worktree as it is now is taken first, so this can be undone." }), ...describe(preview, true));
  const hasConflicts = (preview.conflicts || []).length > 0;
  $("force-label").hidden = !hasConflicts;
  $("force").checked = false;
  const dialog = $("confirm");
  const nothing = !preview.written.length && !preview.deleted.length && !hasConflicts;
  $("go").disabled = nothing;
  dialog.returnValue = "";
  dialog.showModal();
  $("cancel").focus();
  const answer = await new Promise((resolve) => dialog.addEventListener("close", () => resolve(dialog.returnValue), { once: true }));
  if (answer !== "confirm") { toast("Nothing changed."); return; }
  try {
    const done = await api("/api/action", { ...base, force: $("force").checked, confirm: true });
    const safety = done.safety_checkpoint ? ` Safety checkpoint ${short(done.safety_checkpoint.id)}.` : "";
    const left = (done.conflicts || []).length ? ` ${plural(done.conflicts.length, "file")} left alone (conflict).` : "";
    const made = done.shown.submodules.length ? `, ${plural(done.shown.submodules.length, "submodule folder")} made` : "";
    toast(`${verb}: ${plural(done.shown.written.length, "file")} written, ${done.deleted.length} deleted${made}.${left}${safety}`);
  } catch (err) { toast(err.message, true); }
  await refresh();
}

function restorePicked(side) {
  const e = state.entry;
  const checkpoint = side === "before" ? e.source : e.target;
  ask({ action: "restore", checkpoint, paths: [...state.pickedFiles] });
}

// --- live updates -----------------------------------------------------------------

let refreshTimer = null;
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refresh, 250);
}

async function refresh() {
  try {
    await loadWorktrees();
    await loadTimeline(true, state.entries.length);
  } catch (err) { toast(err.message, true); }
}

function listen() {
  const source = new EventSource("/api/events");
  source.addEventListener("hello", () => { $("live").textContent = "live: new checkpoints appear as they land"; });
  source.addEventListener("checkpoint", (ev) => {
    const data = JSON.parse(ev.data);
    $("live").textContent = `live: checkpoint ${short(data.checkpoint && data.checkpoint.id)} landed ${new Date().toLocaleTimeString()}`;
    refreshSoon();
  });
  source.addEventListener("changed", (ev) => { if (JSON.parse(ev.data).overflow) refreshSoon(); });
  source.addEventListener("reconnected", refreshSoon);
  source.onerror = () => { $("live").textContent = "reconnecting to the page's server…"; };
}

// --- start --------------------------------------------------------------------------

function start() {
  $("more").addEventListener("click", () => loadTimeline(false).catch((err) => toast(err.message, true)));
  $("more-files").addEventListener("click", () => loadFiles(false).catch((err) => toast(err.message, true)));
  $("compare").addEventListener("click", compare);
  $("undo").addEventListener("click", () => ask({ action: "undo" }));
  $("restore-some-before").addEventListener("click", () => restorePicked("before"));
  $("restore-some-after").addEventListener("click", () => restorePicked("after"));
  for (const radio of document.querySelectorAll('input[name="layout"]')) {
    radio.addEventListener("change", () => { state.layout = radio.value; if (state.patch && state.file) drawPatch(); });
  }
  listen();
  refresh();
  // A worktree the daemon opens later (a new agent worktree) shows up without a reload.
  setInterval(() => loadWorktrees().catch(() => {}), 30000);
}

start();
