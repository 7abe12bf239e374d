"""Every method of the contract on a SHA-256 repository, checked against git.

pygit2's libgit2 cannot open a repository made with ``git init
--object-format=sha256``; snapshotd reads and writes it through git
(``snapshotd.git.repository``), and its ids have 64 hex digits. The first tests check
what is particular to such a repository: ids and prefixes, ambiguity, diffs
compared with git's own, the warm path staying off, compare-and-swap of refs,
``git gc``, and how many processes each method starts. Then the scenarios of
the restore, revert, engine and repair tests run again as they are, with every
repository they create made SHA-256 by ``GIT_DEFAULT_HASH``.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import capture_helpers
import pytest
import test_engine
import test_repair
import test_restore
import test_revert
import trio
from capture_helpers import assert_matches_git, checkpoint
from oracle import oracle_tree
from repo_helpers import commit_all, git, git_run, user_state
from test_restore import outside  # noqa: F401 - a fixture the restore scenarios take

from snapshotd.engine.core import Engine
from snapshotd.errors import InvalidParams, NotFound
from snapshotd.git import spawn
from snapshotd.git.command import GitRepository
from snapshotd.git.repository import open_repository, read_head

mode = capture_helpers.mode
eng = capture_helpers.eng

HEX64 = re.compile(r"^[0-9a-f]{64}$")
ZERO = "0" * 64
_STATUS = {"A": "added", "M": "modified", "D": "deleted", "R": "renamed", "T": "type_changed"}


def sha256_repo(path: Path, files: dict[str, str | bytes]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "--object-format=sha256")
    for rel, content in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (path / rel).write_bytes(content)
        else:
            (path / rel).write_text(content)
    commit_all(path, "start")
    assert git(path, "rev-parse", "--show-object-format") == "sha256"
    return path


def blob_id(data: bytes) -> str:
    return hashlib.sha256(b"blob %d\0" % len(data) + data).hexdigest()


def processes_of(count_before: int) -> int:
    return spawn.spawned_total() - count_before


def git_readers() -> set[int]:
    """Live ``git cat-file`` children of this process (a reader left running would show here)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"cat-file" in argv:
            found.add(int(entry))
    return found


# ---------------------------------------------------------------------------
# checkpoint, list, show


async def test_checkpoints_are_sha256_commits(eng: Engine, mode: str, tmp_path: Path) -> None:
    repo = sha256_repo(tmp_path / "r", {"a.txt": "one\n", "src/b.py": "print(1)\n", "run.sh": "#!/bin/sh\n"})
    (repo / "a.txt").write_text("edited\n")
    (repo / "new.txt").write_text("new\n")
    (repo / "run.sh").chmod(0o755)
    os.symlink("a.txt", repo / "link")
    first = await checkpoint(eng, repo, session="s1", label="first")
    cp = first["checkpoint"]
    assert HEX64.match(cp["id"]) and HEX64.match(cp["tree"])
    assert_matches_git(repo, first)
    assert cp["base"] == git(repo, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", f"{cp['id']}^") == cp["base"]
    assert "Snapshotd-Worktree: " + cp["worktree"] in git(repo, "log", "-1", "--format=%B", cp["id"])
    assert "+edited" in git(repo, "show", cp["id"])
    assert git(repo, "diff", "--name-only", cp["base"], cp["id"]).split() == ["a.txt", "link", "new.txt", "run.sh"]

    second = (await checkpoint(eng, repo, session="s1"))["checkpoint"]
    assert second["changed"] is False and second["tree"] == cp["tree"]
    assert second["parent"] == cp["id"] and second["seq"] == 2
    (repo / "a.txt").write_text("again\n")
    third_result = await checkpoint(eng, repo, session="s2")
    assert_matches_git(repo, third_result)
    third = third_result["checkpoint"]

    listed = (await eng.call("list", {"path": str(repo)}))["checkpoints"]
    assert [c["id"] for c in listed] == [third["id"], second["id"], cp["id"]]
    only = (await eng.call("list", {"path": str(repo), "session": "s1"}))["checkpoints"]
    assert [c["id"] for c in only] == [second["id"], cp["id"]]
    limited = (await eng.call("list", {"path": str(repo), "limit": 1}))["checkpoints"]
    assert [c["id"] for c in limited] == [third["id"]]
    for ref in (cp["id"], cp["id"][:7], cp["id"][:40], cp["id"][:63]):
        assert (await eng.call("show", {"checkpoint": ref}))["checkpoint"] == cp
    for ref in ("0000000", cp["base"][:12]):
        with pytest.raises(NotFound):
            await eng.call("show", {"checkpoint": ref})
    for ref in (cp["id"] + "0", cp["id"][:6]):
        with pytest.raises(InvalidParams, match=r"longer than any checkpoint id|too short"):
            await eng.call("show", {"checkpoint": ref})

    if mode == "warm":
        status = await eng.call("status", {})
        counters = status["counters"]
        assert status["worktrees"][0]["watching"] is True
        assert counters.get("captures.watch", 0) == 0
        assert counters["cold_reasons.sha256 repository"] == 3
        assert counters["fallbacks.object_format"] == 3
        assert third_result["stats"]["scan"] == "full"


async def test_a_prefix_only_blobs_share_names_no_checkpoint(engine: Engine, tmp_path: Path) -> None:
    repo = sha256_repo(tmp_path / "r", {"a.txt": "a\n"})
    cp = (await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"]
    seen: dict[str, bytes] = {}
    index = 0
    while True:  # birthday search: two blobs whose ids share 7 hex digits (~16k hashes)
        data = b"blob %d" % index
        prefix = blob_id(data)[:7]
        if prefix in seen:
            break
        seen[prefix] = data
        index += 1
    for content in (seen[prefix], data):
        assert git(repo, "hash-object", "-w", "--stdin", input=content) == blob_id(content)
    with pytest.raises(NotFound, match="No checkpoint matches"):  # blobs are never candidates
        await engine.call("show", {"checkpoint": prefix})
    assert (await engine.call("show", {"checkpoint": cp["id"][:7]}))["checkpoint"]["id"] == cp["id"]


# ---------------------------------------------------------------------------
# diff, compared with git


def oracle_diff(repo: Path, old: str, new: str) -> list[dict[str, Any]]:
    """FileChange records from git diff-tree --raw and --numstat (-z, renames)."""
    raw = git_run(repo, "diff-tree", "-r", "-M", "-z", "--raw", old, new).stdout.split(b"\0")
    records: list[dict[str, Any]] = []
    i = 0
    while i < len(raw) and raw[i]:
        meta = raw[i].decode()[1:].split()
        status = meta[4][0]
        old_path = os.fsdecode(raw[i + 1])
        new_path = os.fsdecode(raw[i + 2]) if status == "R" else old_path
        i += 3 if status == "R" else 2
        records.append(
            {
                "path": new_path,
                "old_path": old_path if status == "R" else None,
                "status": _STATUS[status],
                "old_mode": None if meta[0] == "000000" else meta[0],
                "new_mode": None if meta[1] == "000000" else meta[1],
                "old_oid": None if meta[2] == ZERO else meta[2],
                "new_oid": None if meta[3] == ZERO else meta[3],
            }
        )
    numstat = git_run(repo, "diff-tree", "-r", "-M", "-z", "--numstat", old, new).stdout.split(b"\0")
    i = 0
    for record in records:
        added, deleted, rest = numstat[i].decode().split("\t", 2)
        i += 3 if rest == "" else 1
        binary = added == "-"
        record.update(binary=binary, additions=0 if binary else int(added), deletions=0 if binary else int(deleted))
        for side in ("old", "new"):
            oid = record[f"{side}_oid"]
            record[f"{side}_size"] = int(git(repo, "cat-file", "-s", oid)) if binary and oid else None
    return records


def git_patch(repo: Path, old: str, new: str, *extra: str) -> str:
    return git_run(repo, "diff-tree", "-r", "-p", "-M", *extra, old, new).stdout.decode("utf-8", "replace")


LONG = "".join(f"line {n} of a file long enough for rename detection\n" for n in range(40))


async def test_diff_matches_git(engine: Engine, tmp_path: Path) -> None:
    repo = sha256_repo(
        tmp_path / "r",
        {
            "edit.txt": "one\ntwo\nthree\n",
            "gone.txt": "bye\n",
            "old name.txt": LONG,
            "mode.sh": "echo hi\n",
            "tolink.txt": "becomes a link\n",
            "bin.dat": b"\x00\x01binary\x00",
            "dir2file/a.txt": "a\n",
            "keep/same.txt": "same\n",
        },
    )
    a = (await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"]
    (repo / "edit.txt").write_text("one\n2\nthree\nfour\n")
    (repo / "gone.txt").unlink()
    (repo / "old name.txt").rename(repo / "new name.txt")
    (repo / "mode.sh").chmod(0o755)
    (repo / "tolink.txt").unlink()
    (repo / "tolink.txt").symlink_to("edit.txt")
    (repo / "bin.dat").write_bytes(b"\x00\x02other binary\x00")
    shutil.rmtree(repo / "dir2file")
    (repo / "dir2file").write_text("now a file\n")
    (repo / "added" / "deep").mkdir(parents=True)
    (repo / "added" / "deep" / "x.txt").write_text("x\n")
    b = (await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"]

    result = await engine.call("diff", {"from": a["id"], "to": b["id"], "patch": True})
    assert result["files"] == oracle_diff(repo, a["tree"], b["tree"])
    assert {f["status"] for f in result["files"]} == {"added", "deleted", "modified", "renamed", "type_changed"}
    assert any(f["binary"] for f in result["files"])
    assert result["patch"] == git_patch(repo, a["tree"], b["tree"])
    back = await engine.call("diff", {"from": b["id"][:9], "to": a["id"][:9]})
    assert back["files"] == oracle_diff(repo, b["tree"], a["tree"])
    narrow = await engine.call("diff", {"from": a["id"], "to": b["id"], "patch": True, "context": 0})
    assert narrow["patch"] == git_patch(repo, a["tree"], b["tree"], "-U0")

    # A rename is kept when either of its names is selected; the patch holds the selected files only.
    for selected in (["old name.txt"], ["new name.txt"]):
        only = await engine.call("diff", {"from": a["id"], "to": b["id"], "paths": selected, "patch": True})
        assert [(f["status"], f["old_path"], f["path"]) for f in only["files"]] == [
            ("renamed", "old name.txt", "new name.txt")
        ]
        assert only["patch"].startswith("diff --git a/old name.txt b/new name.txt\nsimilarity index")
    typed = await engine.call("diff", {"from": a["id"], "to": b["id"], "paths": ["tolink.txt"], "patch": True})
    assert [f["status"] for f in typed["files"]] == ["type_changed"]
    assert typed["patch"].count("diff --git") == 2  # git shows a deletion and an addition
    folder = await engine.call("diff", {"from": a["id"], "to": b["id"], "paths": ["added"]})
    assert [f["path"] for f in folder["files"]] == ["added/deep/x.txt"]

    # Against the live worktree (nothing is recorded).
    (repo / "edit.txt").write_text("changed once more\n")
    ids_before = [c["id"] for c in (await engine.call("list", {"path": str(repo)}))["checkpoints"]]
    live = await engine.call("diff", {"from": b["id"], "path": str(repo), "patch": True})
    now = oracle_tree(repo)
    assert live["files"] == oracle_diff(repo, b["tree"], now)
    assert live["patch"] == git_patch(repo, b["tree"], now)
    assert [c["id"] for c in (await engine.call("list", {"path": str(repo)}))["checkpoints"]] == ids_before
    same = await engine.call("diff", {"from": b["id"], "to": b["id"], "patch": True})
    assert same == {"files": [], "patch": "", "next_offset": None}


# ---------------------------------------------------------------------------
# restore, revert, delete, gc


async def test_restore_and_its_safety_checkpoint(engine: Engine, tmp_path: Path) -> None:
    repo = sha256_repo(tmp_path / "r", {"a.txt": "a\n", "d/b.txt": "b\n", "x.sh": "#!/bin/sh\n"})
    user = user_state(repo, with_worktree=False)
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "link").symlink_to("a.txt")
    cp_a = (await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"]
    state_a = test_restore.tree_state(repo)

    (repo / "a.txt").write_text("changed\n")
    (repo / "x.sh").chmod(0o755)
    shutil.rmtree(repo / "d")
    (repo / "link").unlink()
    (repo / "link").symlink_to("x.sh")
    (repo / "created.txt").write_text("created\n")
    (repo / "kept.log").write_text("ignored, never touched\n")
    state_b = test_restore.tree_state(repo)
    tree_b = oracle_tree(repo)

    dry = await engine.call("restore", {"checkpoint": cp_a["id"][:10], "path": str(repo), "dry_run": True})
    assert dry["safety_checkpoint"] is None
    assert sorted(dry["written"]) == ["a.txt", "d/b.txt", "link", "x.sh"]
    assert dry["deleted"] == ["created.txt"]
    assert test_restore.tree_state(repo) == state_b

    result = await engine.call("restore", {"checkpoint": cp_a["id"], "path": str(repo)})
    assert (result["written"], result["deleted"]) == (dry["written"], dry["deleted"])
    assert test_restore.tree_state(repo) == {**state_a, "kept.log": state_b["kept.log"]}
    assert oracle_tree(repo) == cp_a["tree"]
    safety = result["safety_checkpoint"]
    assert HEX64.match(safety["id"]) and safety["tree"] == tree_b and safety["session"] == "snapshotd:safety"

    back = await engine.call("restore", {"checkpoint": safety["id"], "path": str(repo)})
    assert test_restore.tree_state(repo) == state_b
    assert back["safety_checkpoint"]["tree"] == cp_a["tree"]
    assert user_state(repo, with_worktree=False) == user  # index, HEAD and refs never moved


async def test_delete_gc_and_git_gc_keep_the_rest(engine: Engine, tmp_path: Path) -> None:
    repo = sha256_repo(tmp_path / "r", {"a.txt": "start\n"})
    made = []
    for index in range(6):
        (repo / "a.txt").write_text(f"version {index}\n")
        (repo / f"new{index}.bin").write_bytes(os.urandom(2000))
        made.append((await engine.call("checkpoint", {"path": str(repo), "session": "s"}))["checkpoint"])
    deleted = await engine.call("delete", {"checkpoints": [made[1]["id"][:8], made[3]["id"]]})
    assert deleted["deleted"] == 2
    collected = await engine.call("gc", {"path": str(repo), "keep": 2})
    assert collected["deleted"] == 2
    kept = [c["id"] for c in (await engine.call("list", {"path": str(repo)}))["checkpoints"]]
    assert kept == [made[5]["id"], made[4]["id"]]
    for gone in (made[0], made[1], made[3]):
        with pytest.raises(NotFound):
            await engine.call("show", {"checkpoint": gone["id"]})

    git(repo, "gc", "-q", "--prune=now")
    fsck = git_run(repo, "fsck", "--full", "--no-dangling", check=False)
    assert fsck.returncode == 0 and b"missing" not in fsck.stdout + fsck.stderr
    for cp in made[4:]:
        assert git(repo, "cat-file", "-t", cp["id"]) == "commit"
        assert git_ok_show(repo, cp["id"])
    assert git_run(repo, "cat-file", "-e", made[0]["id"], check=False).returncode != 0  # collected by git gc

    fresh = Engine()
    try:
        (repo / "a.txt").write_text("later\n")
        await fresh.call("restore", {"checkpoint": made[4]["id"][:12], "path": str(repo)})
        assert (repo / "a.txt").read_text() == "version 4\n"
        assert not (repo / "new5.bin").exists()
        dropped = await fresh.call("delete", {"session": "s", "path": str(repo)})
        assert dropped["deleted"] == 2
        assert [c["session"] for c in (await fresh.call("list", {"path": str(repo)}))["checkpoints"]] == [
            "snapshotd:safety"
        ]
    finally:
        await fresh.aclose()


def git_ok_show(repo: Path, commit: str) -> bool:
    return git_run(repo, "show", "--stat", "--format=%H", commit, check=False).returncode == 0


async def test_revert_one_turn(engine: Engine, tmp_path: Path) -> None:
    repo = sha256_repo(tmp_path / "r", {"mine.txt": "mine\n", "theirs.txt": "theirs\n", "both.txt": "both\n"})
    before = (await engine.call("checkpoint", {"path": str(repo), "session": "a"}))["checkpoint"]
    (repo / "mine.txt").write_text("mine, edited\n")
    (repo / "both.txt").write_text("both, a's edit\n")
    (repo / "a-new.txt").write_text("a's new file\n")
    after = (await engine.call("checkpoint", {"path": str(repo), "session": "a"}))["checkpoint"]
    (repo / "theirs.txt").write_text("theirs, b's edit\n")
    (repo / "both.txt").write_text("both, b's edit on top\n")

    result = await engine.call("revert", {"from": before["id"][:7], "path": str(repo)})
    assert result["written"] == ["mine.txt"] and result["deleted"] == ["a-new.txt"]
    assert result["conflicts"] == [{"path": "both.txt", "reason": "changed since the checkpoint"}]
    assert (repo / "mine.txt").read_text() == "mine\n"
    assert (repo / "theirs.txt").read_text() == "theirs, b's edit\n"
    assert (repo / "both.txt").read_text() == "both, b's edit on top\n"
    forced = await engine.call("revert", {"from": before["id"], "to": after["id"], "path": str(repo), "force": True})
    assert forced["written"] == ["both.txt"] and (repo / "both.txt").read_text() == "both\n"
    undo = await engine.call("restore", {"checkpoint": result["safety_checkpoint"]["id"], "path": str(repo)})
    assert (repo / "mine.txt").read_text() == "mine, edited\n" and undo["safety_checkpoint"] is not None


# ---------------------------------------------------------------------------
# processes


async def test_processes_per_method(engine: Engine, tmp_path: Path) -> None:
    """Reads share one git reader per repository, so list and show do not grow with the store."""
    repo = sha256_repo(tmp_path / "r", {"a.txt": "a\n", "b.txt": "b\n"})
    readers_before = git_readers()
    counts: dict[str, int] = {}

    async def measure(name: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        before = spawn.spawned_total()
        result = await engine.call(method, params)
        counts[name] = processes_of(before)
        return result

    await measure("open", "open", {"path": str(repo)})
    first = (await measure("checkpoint", "checkpoint", {"path": str(repo)}))["checkpoint"]
    for index in range(20):
        (repo / "a.txt").write_text(f"a {index}\n")
        await engine.call("checkpoint", {"path": str(repo)})
    (repo / "b.txt").write_text("b changed\n")
    last = (await measure("checkpoint (changed)", "checkpoint", {"path": str(repo)}))["checkpoint"]
    await measure("checkpoint (unchanged)", "checkpoint", {"path": str(repo)})
    assert len((await measure("list", "list", {"path": str(repo)}))["checkpoints"]) == 23
    await measure("show", "show", {"checkpoint": first["id"][:7]})
    await measure("diff", "diff", {"from": first["id"], "to": last["id"], "patch": True, "path": str(repo)})
    await measure("diff worktree", "diff", {"from": first["id"], "path": str(repo)})
    await measure("restore dry run", "restore", {"checkpoint": first["id"], "path": str(repo), "dry_run": True})
    await measure("restore", "restore", {"checkpoint": first["id"], "path": str(repo)})
    await measure("revert", "revert", {"from": first["id"], "to": last["id"], "path": str(repo)})
    await measure("delete", "delete", {"checkpoints": [last["id"]], "path": str(repo)})
    await measure("gc", "gc", {"path": str(repo), "keep": 5})
    await measure("repair", "repair", {"path": str(repo)})

    assert counts["open"] == 1  # rev-parse for HEAD
    assert counts["list"] == 2  # the reader and for-each-ref, for 23 checkpoints
    assert counts["show"] == 1  # the reader
    assert counts["checkpoint (unchanged)"] <= 7  # b.txt, modified, goes in as a known entry
    assert counts["checkpoint (changed)"] <= 8
    assert counts["diff"] <= 3  # a reader per checkpoint and diff-tree
    assert counts["restore"] <= 10
    assert counts["delete"] <= 3 and counts["gc"] <= 4  # one hash-object for all the new pins
    assert git_readers() <= readers_before  # every reader ended with its request


async def test_every_started_git_is_counted_and_ended(tmp_path: Path) -> None:
    repo = sha256_repo(tmp_path / "r", {"a.txt": "a\n"})
    readers_before = git_readers()
    reader = GitRepository(repo / ".git")
    before = spawn.spawned_total()
    head = reader.references.get("refs/heads/main")
    assert head is not None and reader[head.target].type_str == "commit"
    assert processes_of(before) == 1 and len(git_readers() - readers_before) == 1
    del reader  # no reference cycle keeps it: the reader ends now
    assert git_readers() <= readers_before


# ---------------------------------------------------------------------------
# the repository object itself


def test_git_repository_reads_like_pygit2(tmp_path: Path) -> None:
    repo = sha256_repo(tmp_path / "r", {"a.txt": "a\n", "d/e/f.txt": "f\n"})
    (repo / "link").symlink_to("a.txt")
    commit_all(repo, "second")
    store = open_repository(str(repo / ".git"))
    assert isinstance(store, GitRepository) and store.hex_length == 64
    with store:
        head = git(repo, "rev-parse", "HEAD")
        commit = store[head]
        assert commit.type_str == "commit" and commit.message == "second\n"
        assert commit.parent_ids == [git(repo, "rev-parse", "HEAD~1")]
        tree = commit.peel("tree")
        assert tree.id == commit.tree_id == git(repo, "rev-parse", "HEAD^{tree}")
        assert sorted(entry.name for entry in tree) == ["a.txt", "d", "link"]
        assert tree["d/e/f.txt"].id == git(repo, "rev-parse", "HEAD:d/e/f.txt")
        assert tree["link"].filemode == 0o120000 and store[tree["link"].id].data == b"a.txt"
        assert "d/e" in tree and "d/x" not in tree
        with pytest.raises(KeyError):
            tree["d/e/missing"]
        assert store.revparse_single(head[:8]).id == head
        with pytest.raises(KeyError):
            store.revparse_single("f" * 12)
        with pytest.raises(ValueError):
            store["HEAD"]
        assert store.get("0" * 64) is None
        assert store.odb.read_header(tree["a.txt"].id)[1] == 2
        assert store.config["core.bare"] == "false"
        assert store.empty_tree_id == git(repo, "hash-object", "-t", "tree", "/dev/null")
        assert [ref for ref in store.references] == ["refs/heads/main"]



def test_a_git_without_batch_command_is_read_with_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = sha256_repo(tmp_path / "r", {"a.txt": "a\n"})
    head = git(repo, "rev-parse", "HEAD")
    real = shutil.which("git")
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        '  if [ "$arg" = --batch-command ]; then echo "error: unknown option \\`batch-command\'" >&2; exit 129; fi\n'
        "done\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    with GitRepository(repo / ".git") as older:
        assert older[head].message == "start\n"
        assert older.odb.read_header(head) == (older[head].type, len(older[head].data))
        assert older.revparse_single(head[:10]).id == head
        assert not older._command_mode


def test_head_is_read_by_git(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "--object-format=sha256", "-b", "trunk")
    assert read_head(str(repo / ".git"), str(repo)) == (None, "trunk")
    (repo / "a.txt").write_text("a\n")
    head = commit_all(repo, "first")
    assert read_head(str(repo / ".git"), str(repo)) == (head, "trunk")
    git(repo, "checkout", "-q", "--detach")
    assert read_head(str(repo / ".git"), str(repo)) == (head, None)


# ---------------------------------------------------------------------------
# the scenarios of the other test modules, on SHA-256 repositories


Scenario = tuple[Callable[..., Any], dict[str, Any]]

SCENARIOS: dict[str, Scenario] = {
    "restore round trip": (test_restore.test_round_trip_every_kind_of_change, {"kind": "git"}),
    "restore forth and back": (test_restore.test_restore_forth_and_back_between_checkpoints, {}),
    "crlf autocrlf": (test_restore.test_crlf_files_come_back_byte_identical, {"setup": "autocrlf"}),
    "crlf attributes": (test_restore.test_crlf_files_come_back_byte_identical, {"setup": "attributes"}),
    "attributes of the restore": (test_restore.test_attributes_changed_by_the_restore_apply_to_its_files, {}),
    "smudge filters": (test_restore.test_smudge_filters_run_and_a_failing_one_changes_nothing, {}),
    "folder became a link": (test_restore.test_folder_replaced_by_a_symlink_pointing_outside, {}),
    "link where a folder is": (test_restore.test_symlink_in_the_checkpoint_where_a_real_folder_now_is, {}),
    "hard links": (test_restore.test_hard_links_to_files_outside_are_replaced_never_written_through, {}),
    "older gitignore": (test_restore.test_older_gitignore_never_exposes_ignored_files, {}),
    "subfolder restore": (test_restore.test_subfolder_restore_leaves_siblings_and_parent_alone, {}),
    "head and index": (test_restore.test_head_branches_and_index_never_move, {}),
    "branch switch": (test_restore.test_branch_switch_and_detached_head_since_the_checkpoint, {}),
    "after git gc": (test_restore.test_checkpoints_restore_after_git_gc_and_a_new_engine, {}),
    "mtime and inode": (test_restore.test_identical_files_keep_mtime_and_inode, {}),
    "no identity": (test_restore.test_no_git_identity_anywhere, {"kind": "git"}),
    "dry run": (test_restore.test_dry_run_reports_and_changes_nothing, {}),
    "bad ids": (test_restore.test_bad_checkpoint_ids_fail_before_anything_is_touched, {}),
    "paths outside": (test_restore.test_paths_outside_the_worktree_are_refused, {}),
    "another worktree": (test_restore.test_restore_into_another_worktree, {}),
    "revert one turn": (test_revert.test_reverting_one_turn_keeps_the_other_agents_work, {}),
    "revert force": (test_revert.test_force_takes_back_a_path_both_agents_touched, {}),
    "revert default to": (test_revert.test_revert_without_to_uses_the_newest_checkpoint_of_the_session, {}),
    "revert idempotent": (test_revert.test_revert_is_idempotent_and_skips_what_already_matches, {}),
    "revert refusals": (test_revert.test_revert_refusals_change_nothing, {}),
    "real commit": (test_engine.test_checkpoint_is_a_real_commit_with_metadata, {}),
    "unchanged capture": (test_engine.test_unchanged_capture_reuses_the_tree_and_says_so, {}),
    "list and prefixes": (test_engine.test_list_show_and_prefixes, {}),
    "errors": (test_engine.test_errors_are_clear_and_change_nothing, {}),
    "user state": (test_engine.test_user_state_untouched, {}),
    "gc prune": (test_engine.test_checkpoints_survive_gc_prune_and_a_new_engine, {}),
    "concurrent sessions": (test_engine.test_concurrent_captures_across_sessions_lose_nothing, {}),
    "two engines one session": (test_engine.test_two_engines_writing_one_session_lose_nothing, {}),
    "delete and gc": (test_engine.test_delete_and_gc_keep_ids_of_the_rest, {}),
    "gc by age": (test_engine.test_gc_by_age, {}),
    "restore elsewhere refused": (test_engine.test_restore_refuses_another_worktree_unless_allowed, {}),
    "engine diff": (test_engine.test_diff_against_the_worktree_and_between_checkpoints, {}),
    "repair worktree move": (test_repair.test_git_worktree_move, {}),
    "repair linked mv": (test_repair.test_plain_mv_of_a_linked_worktree_then_repair, {}),
    "repair repository moved": (test_repair.test_whole_repository_moved_then_repair, {"repair_from": "main"}),
    "repair from linked": (test_repair.test_whole_repository_moved_then_repair, {"repair_from": "linked"}),
    "repair main worktree": (test_repair.test_moved_main_worktree_of_a_repository, {}),
    "repair by id": (test_repair.test_a_moved_worktree_known_to_the_engine_addressed_by_id, {}),
    "copy gets new id": (test_repair.test_a_copy_gets_a_new_id, {"kind": "git"}),
}


def repositories_under(root: Path) -> list[Path]:
    found = []
    for folder, dirs, _ in os.walk(root):
        if ".git" in dirs:
            found.append(Path(folder))
            dirs.remove(".git")
    return found


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_scenario_on_a_sha256_repository(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nursery: trio.Nursery,
    request: pytest.FixtureRequest,
) -> None:
    monkeypatch.setenv("GIT_DEFAULT_HASH", "sha256")
    scenario, fixed = SCENARIOS[name]
    engines: list[Engine] = []
    kwargs: dict[str, Any] = {}
    for parameter in inspect.signature(scenario).parameters:
        if parameter in fixed:
            kwargs[parameter] = fixed[parameter]
        elif parameter in ("engine", "watched_engine"):
            engines.append(Engine(nursery=nursery) if parameter == "watched_engine" else Engine())
            kwargs[parameter] = engines[-1]
        elif parameter == "tmp_path":
            kwargs[parameter] = tmp_path
        elif parameter == "monkeypatch":
            kwargs[parameter] = monkeypatch
        else:
            kwargs[parameter] = request.getfixturevalue(parameter)
    try:
        await scenario(**kwargs)
    finally:
        for engine in engines:
            await engine.aclose()
    repos = repositories_under(tmp_path)
    assert repos, "the scenario made no repository"
    for repo in repos:
        assert git(repo, "rev-parse", "--show-object-format") == "sha256", repo
