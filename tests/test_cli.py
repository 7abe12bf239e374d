"""The command line as people and scripts use it: real processes against a real daemon."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import pytest
from daemon_helpers import (
    Daemon,
    answers,
    assert_json_error,
    assert_one_error_line,
    child_env,
    cli,
    cli_many,
    cli_process,
    log_problems,
    ping,
    process_gone,
    wait_until,
)
from oracle import oracle_tree
from repo_helpers import git, git_bytes, init_repo, worktree_listing, write
from terminal_helpers import at_a_terminal

from snapshotd import facilities
from snapshotd.cli.main import main as cli_main
from snapshotd.errors import SnapshotdError

CHECKPOINT_KEYS = {
    "id", "tree", "parent", "worktree", "session", "label", "seq", "created_at", "base", "changed", "host",
}
WORKTREE_KEYS = {"id", "path", "kind", "git_dir", "common_dir", "head", "branch", "watching", "watch_error",
                 "presence", "problem", "watched_folders", "unwatched_ignored"}
FILE_CHANGE_KEYS = {
    "path", "old_path", "status", "old_mode", "new_mode", "old_oid", "new_oid",
    "binary", "additions", "deletions", "old_size", "new_size",
}

# The contract's command-line table: every one of these must stay.
CONTRACT_OPTIONS: dict[str, list[str]] = {
    "serve": ["--socket"],
    "checkpoint": ["-m", "--session"],
    "list": ["--session", "--limit"],
    "show": [],
    "diff": ["--stat", "--name-status", "--patch"],
    "restore": ["--dry-run", "--into"],
    "revert": ["--dry-run", "--force"],
    "delete": ["--session"],
    "gc": ["--keep"],
    "repair": [],
    "status": [],
    "stop": [],
}


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(
        tmp_path / "repo",
        ("a.txt", "alpha\n"),
        ("src/b.py", "print('b')\n"),
        ("docs/readme.md", "# readme\n"),
        (".gitignore", "*.log\n"),
    )


def checkpoint(repo: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    """Run ``snapshotd checkpoint --json`` and check the result's shape."""
    result = cli("checkpoint", "--json", str(repo), *args, env=env).json()
    assert set(result) == {"checkpoint", "stats"}
    assert set(result["checkpoint"]) == CHECKPOINT_KEYS
    return result


# --------------------------------------------------------------------------
# checkpoint, list, show


def test_checkpoint_list_and_show(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    write(repo / "untracked.txt", "new\n")
    write(repo / "build.log", "ignored\n")

    # The watcher confirms itself with a cookie file; on a busy machine that
    # can take a while, and until then captures are (correctly) full scans.
    # Without inotify (SNAPSHOTD_DISABLE, macOS) every capture is one.
    warm = facilities.available("inotify")
    wait_until(
        lambda: not warm or cli("open", "--json", repo, env=env).json()["worktree"]["watching"],
        30,
        "the daemon to watch the worktree",
        interval=0.1,
    )
    # No PATH: the worktree holding the current folder, even from a subfolder.
    first = cli("checkpoint", "--json", "-m", "first", "--session", "s1", cwd=repo / "src", env=env).json()
    cp1 = first["checkpoint"]
    assert cp1["tree"] == oracle_tree(repo)
    assert cp1["worktree"].startswith("wt_")
    assert (cp1["session"], cp1["label"], cp1["seq"], cp1["parent"]) == ("s1", "first", 1, None)
    assert cp1["base"] == head and cp1["changed"] is True
    assert set(first["stats"]) >= {"ms", "processes", "scan", "hashed", "skipped"}
    # A checkpoint is a real commit of that tree.
    assert git(repo, "cat-file", "-t", cp1["id"]) == "commit"
    assert git(repo, "rev-parse", f"{cp1['id']}^{{tree}}") == cp1["tree"]
    assert "build.log" not in git(repo, "ls-tree", "-r", "--name-only", cp1["id"])

    # Nothing changed: the warm path answers from the watcher, with no process.
    second = cli("--json", "checkpoint", "--session", "s1", repo, env=env).json()
    cp2 = second["checkpoint"]
    why = {k: v for k, v in cli("status", "--json", env=env).json()["counters"].items() if "cold" in k or "watch" in k}
    assert second["stats"]["scan"] == ("watch" if warm else "full"), f"{second['stats']}; counters: {why}"
    assert second["stats"]["processes"] == 0 or not warm, second
    assert cp2["tree"] == cp1["tree"] and cp2["changed"] is False
    assert (cp2["parent"], cp2["seq"]) == (cp1["id"], 2)

    write(repo / "a.txt", "alpha, edited\n")
    human = cli("checkpoint", "-m", "third label", "--session", "s2", repo, env=env)
    assert "third label" in human.stdout and "s2" in human.stdout
    assert " scan" in human.stdout

    listed = cli("list", "--json", repo, env=env).json()
    assert set(listed) == {"checkpoints"}
    cps = listed["checkpoints"]
    assert [cp["id"] for cp in cps[1:]] == [cp2["id"], cp1["id"]], "newest first"
    cp3 = cps[0]
    assert (cp3["label"], cp3["session"]) == ("third label", "s2")
    assert cp3["tree"] == oracle_tree(repo)
    assert cp3["id"][:12] in human.stdout

    text = cli("list", repo, env=env).stdout
    lines = text.splitlines()
    assert len(lines) == 3
    for line, cp in zip(lines, cps, strict=True):
        assert line.startswith(cp["id"][:12])
    assert "first" in lines[2] and "(unchanged)" in lines[1]

    only = cli("list", "--json", "--session", "s1", "--limit", "1", repo, env=env).json()
    assert [cp["id"] for cp in only["checkpoints"]] == [cp2["id"]]
    assert cli("list", "--json", "--session", "nobody", repo, env=env).json() == {"checkpoints": []}
    assert cli("list", "--session", "nobody", repo, env=env).stdout.strip() == "no checkpoints"

    shown = cli("show", "--json", cp1["id"][:7], env=env).json()
    assert shown == {"checkpoint": cp1}
    shown_text = cli("show", cp1["id"], env=env).stdout
    assert cp1["id"] in shown_text and cp1["tree"] in shown_text and "first" in shown_text
    assert cp1["worktree"] in shown_text


# --------------------------------------------------------------------------
# diff


def test_diff_formats_and_paths(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp1 = checkpoint(repo, env, "--session", "d")["checkpoint"]["id"]
    write(repo / "a.txt", "alpha\nmore\n")
    write(repo / "c.txt", "c\n")
    (repo / "src" / "b.py").unlink()
    cp2 = checkpoint(repo, env, "--session", "d")["checkpoint"]["id"]
    git_says = {
        line.split("\t")[1]: line.split("\t")[0]
        for line in git(repo, "diff", "--name-status", "--no-renames", cp1, cp2).splitlines()
    }
    assert git_says == {"a.txt": "M", "c.txt": "A", "src/b.py": "D"}

    (default, name_status, stat_, patch, as_json, patch_json, between, limited, from_sub) = [
        cli(*args, cwd=repo / "docs", env=env)
        for args in [
            ["diff", cp1],
            ["diff", cp1, "--name-status"],
            ["diff", cp1, "--stat"],
            ["diff", cp1, "--patch"],
            ["diff", "--json", cp1],
            ["diff", "--json", "--patch", cp1],
            ["diff", "--json", cp1, cp2],
            ["diff", "--json", cp1, cp2, "--", "../c.txt", "../src"],
            ["diff", "--json", cp1, "--", "../c.txt"],
        ]
    ]
    assert default.stdout == name_status.stdout
    assert sorted(default.stdout.splitlines()) == ["A  c.txt", "D  src/b.py", "M  a.txt"]

    assert stat_.stdout == git_bytes(repo, "diff", "--stat", cp1, cp2).decode()  # the worktree holds cp2
    both = cli("diff", cp1, cp2, "--stat", "-p", cwd=repo / "docs", env=env).stdout
    assert both == git_bytes(repo, "diff", "--stat", "-p", cp1, cp2).decode()  # the stat, a blank line, the patch
    assert cli("diff", cp1, "--stat", "--patch", "--name-status", cwd=repo / "docs", env=env).stdout == default.stdout
    # A word before '--' that is on disk nowhere is refused, as git refuses it (a misspelt reference).
    refused = cli("diff", cp1, cp2, "nonexist", cwd=repo, env=env, code=2)
    assert "'nonexist' is neither a checkpoint nor a path here; put a path that is not on disk after '--'." in refused.stderr
    assert cli("diff", cp1, cp2, "--", "nonexist", cwd=repo, env=env).stdout == "no changes\n"
    cli("diff", cp1, "nonexist.txt", cwd=repo, env=env, code=2)  # in TO's place too
    assert cli("diff", cp1, "a.txt", cwd=repo, env=env).stdout == "M  a.txt\n"  # a path there: TO is the worktree
    assert cli("diff", cp1, cp2, "-U1", cwd=repo, env=env).stdout == git_bytes(repo, "diff", "-U1", cp1, cp2).decode()
    # Counts past what the wire carries mean all, as in git: not an error naming a wire parameter.
    whole = cli("diff", cp1, cp2, "-U", "99999999999", "-p", cwd=repo, env=env).stdout
    assert whole == git_bytes(repo, "diff", "-U99999999999", cp1, cp2).decode()
    assert cli("list", "--limit", "99999999999999", cwd=repo, env=env).stdout.count("\n") >= 2
    assert "nothing to delete" in cli("gc", "--dry-run", "--older-than", "5000w", "--keep", "99999999999", cwd=repo, env=env).stdout

    assert "diff --git a/a.txt b/a.txt" in patch.stdout
    assert "+more" in patch.stdout.splitlines()
    assert "-print('b')" in patch.stdout.splitlines()

    files = as_json.json()["files"]
    assert {f["path"]: f["status"] for f in files} == {
        "a.txt": "modified", "c.txt": "added", "src/b.py": "deleted",
    }
    for change in files:
        assert set(change) == FILE_CHANGE_KEYS
    assert "patch" not in as_json.json()
    with_patch = patch_json.json()
    assert with_patch["files"] == files and "+more" in with_patch["patch"]
    assert between.json()["files"] == files  # the worktree has not changed since cp2

    # Everything after `--` is a path, never TO.
    assert {f["path"] for f in limited.json()["files"]} == {"c.txt", "src/b.py"}
    assert [f["path"] for f in from_sub.json()["files"]] == ["c.txt"]
    sub_relative = cli_process("diff", "--json", cp1, "--", "b.py", cwd=repo / "src", env=env).json()
    assert [f["path"] for f in sub_relative["files"]] == ["src/b.py"]

    unchanged = cli("diff", cp2, cwd=repo, env=env)
    assert unchanged.stdout.strip() == "no changes"


def test_output_of_file_names_that_are_not_utf8(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env)["checkpoint"]["id"]
    raw = os.fsencode(repo) + b"/caf\xe9.txt"
    with open(raw, "wb") as fh:
        fh.write(b"x\n")
    as_json, human = cli_many([["diff", "--json", cp], ["diff", cp]], cwd=repo, env=env)
    assert as_json.code == 0 and human.code == 0, f"{as_json}\n{human}"
    as_json.stdout.encode("utf-8")  # valid UTF-8: the odd byte is escaped
    [change] = as_json.json()["files"]
    assert os.fsencode(change["path"]) == b"caf\xe9.txt"
    # People see the name as git quotes it (core.quotePath): the odd byte in octal.
    assert human.stdout == 'A  "caf\\351.txt"\n'


# --------------------------------------------------------------------------
# restore and revert


def test_restore_dry_run_paths_and_everything(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env, "--session", "r")["checkpoint"]
    write(repo / "a.txt", "changed\n")
    write(repo / "new.txt", "created since\n")
    (repo / "src" / "b.py").unlink()
    write(repo / "keep.log", "ignored files are never touched\n")
    before = worktree_listing(repo)

    dry = cli("restore", "--json", cp["id"][:10], "--dry-run", cwd=repo, env=env).json()
    assert dry["safety_checkpoint"] is None
    assert sorted(dry["written"]) == ["a.txt", "src/b.py"]
    assert dry["deleted"] == ["new.txt"]
    assert worktree_listing(repo) == before, "a dry run changed the worktree"
    dry_text = cli("restore", cp["id"], "--dry-run", cwd=repo, env=env).stdout
    assert "would write 2 files, would delete 1 file" in dry_text
    assert "W  a.txt" in dry_text and "D  new.txt" in dry_text
    assert worktree_listing(repo) == before

    one = cli("restore", "--json", cp["id"], "a.txt", "--yes", cwd=repo, env=env).json()
    assert (one["written"], one["deleted"]) == (["a.txt"], [])
    safety = one["safety_checkpoint"]
    assert set(safety) == CHECKPOINT_KEYS
    assert safety["label"] == f"before restore {cp['id'][:12]}"
    assert (repo / "a.txt").read_text() == "alpha\n"
    assert (repo / "new.txt").exists() and not (repo / "src" / "b.py").exists()

    everything = cli("restore", cp["id"], "--yes", cwd=repo / "docs", env=env)
    assert "W  src/b.py" in everything.stdout and "D  new.txt" in everything.stdout
    assert "undo with: snapshotd restore " in everything.stdout
    assert oracle_tree(repo) == cp["tree"]
    assert (repo / "keep.log").read_text() == "ignored files are never touched\n"

    # The safety checkpoint undoes the restore.
    undo_id = everything.stdout.rsplit("undo with: snapshotd restore ", 1)[1].split()[0]
    undone = cli("restore", "--json", undo_id, "--yes", env=env, cwd=repo).json()
    assert "new.txt" in undone["written"]
    assert (repo / "new.txt").read_text() == "created since\n"

    # Run in another worktree, a restore or revert of this one's checkpoint, even by id, acts on nothing.
    linked = repo.parent / "linked"
    git(repo, "worktree", "add", "-q", str(linked))
    before_both = worktree_listing(repo), worktree_listing(linked)
    for command in (["restore", undo_id, "--yes"], ["revert", cp["id"], undo_id, "--yes"]):
        refused = cli(*command, cwd=linked / "src", env=env, code=1)
        assert f"belongs to the worktree at {repo}, not to the one at {linked}" in refused.stderr, refused.stderr
    assert (worktree_listing(repo), worktree_listing(linked)) == before_both

    # --into: another worktree of the same repository gets the checkpoint's content.
    into = cli("restore", "--json", undo_id, "--into", linked, "--yes", env=env).json()
    assert "new.txt" in into["written"]
    assert into["safety_checkpoint"]["worktree"] != safety["worktree"]
    assert oracle_tree(linked) == cli("show", "--json", undo_id, env=env).json()["checkpoint"]["tree"]


def test_revert_one_turn_and_its_conflicts(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    before_turn = checkpoint(repo, env, "--session", "agent")["checkpoint"]["id"]
    write(repo / "a.txt", "agent's edit\n")
    write(repo / "agent-new.txt", "made by the agent\n")
    after_turn = checkpoint(repo, env, "--session", "agent")["checkpoint"]["id"]
    write(repo / "docs" / "readme.md", "someone else's work\n")

    reverted = cli("revert", "--json", before_turn, after_turn, "--yes", cwd=repo, env=env).json()
    assert set(reverted) >= {"safety_checkpoint", "written", "deleted", "conflicts"}
    assert reverted["written"] == ["a.txt"] and reverted["deleted"] == ["agent-new.txt"]
    assert reverted["conflicts"] == []
    assert (repo / "a.txt").read_text() == "alpha\n"
    assert (repo / "docs" / "readme.md").read_text() == "someone else's work\n"

    # Another turn; someone edits the same file afterwards: a conflict, left alone.
    turn2_start = checkpoint(repo, env, "--session", "agent")["checkpoint"]["id"]
    write(repo / "a.txt", "agent again\n")
    checkpoint(repo, env, "--session", "agent")
    write(repo / "a.txt", "a person edits after the agent\n")
    dry = cli("revert", "--json", turn2_start, "--dry-run", cwd=repo, env=env, code=1).json()
    assert [c["path"] for c in dry["conflicts"]] == ["a.txt"] and dry["written"] == []
    # A path left unreverted is a failure, human and JSON alike, naming it, why, and --force.
    human = cli("revert", turn2_start, "--yes", cwd=repo, env=env, code=1)
    assert "!  a.txt: changed since the checkpoint" in human.stdout
    [error] = human.stderr.splitlines()
    assert error.startswith("error: 1 path left unreverted: a.txt (changed since the checkpoint)")
    assert "--force" in error
    as_json = cli("revert", "--json", turn2_start, "--yes", cwd=repo, env=env, code=1).json()
    assert as_json["conflicts"] == [{"path": "a.txt", "reason": "changed since the checkpoint"}]
    assert (repo / "a.txt").read_text() == "a person edits after the agent\n"

    forced = cli("revert", "--json", turn2_start, "--force", "--yes", "--", "a.txt", cwd=repo, env=env).json()
    assert forced["written"] == ["a.txt"]
    assert (repo / "a.txt").read_text() == "alpha\n"


def test_restore_at_a_terminal_shows_the_plan_and_asks(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env)["checkpoint"]
    write(repo / "a.txt", "changed\n")
    before = worktree_listing(repo)

    code, screen = at_a_terminal(["restore", cp["id"]], b"n\n", env, repo)
    assert code == 0, screen
    assert "would write 1 file, would delete 0 files" in screen and "a.txt" in screen and "Go ahead?" in screen
    assert "\x1b[" in screen, "no colour on a terminal"
    assert worktree_listing(repo) == before, "answering no changed the worktree"

    code, screen = at_a_terminal(["restore", cp["id"]], b"y\n", env, repo)
    assert code == 0, screen
    assert "undo with: snapshotd restore" in screen
    assert (repo / "a.txt").read_text() == "alpha\n"

    # --yes does not ask, even at a terminal.
    write(repo / "a.txt", "changed again\n")
    code, screen = at_a_terminal(["restore", cp["id"], "--yes"], b"", env, repo)
    assert code == 0 and "Go ahead?" not in screen, screen
    assert (repo / "a.txt").read_text() == "alpha\n"


def test_the_prompt_is_asked_when_stdout_is_a_pipe(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env)["checkpoint"]
    write(repo / "a.txt", "changed\n")

    # `snapshotd restore ID | cat` at a terminal: stdin is the terminal, so it asks (on stderr).
    read_end, write_end = os.pipe()
    try:
        code, screen = at_a_terminal(["restore", cp["id"]], b"n\n", env, repo, stdout=write_end)
    finally:
        os.close(write_end)
        os.close(read_end)
    assert code == 0 and "Go ahead?" in screen and "a.txt" in screen, screen
    assert (repo / "a.txt").read_text() == "changed\n", "it wrote without asking"

    # --json at a terminal asks too; the answer yes lets it run.
    code, screen = at_a_terminal(["restore", "--json", cp["id"]], b"y\n", env, repo, stdout=subprocess.DEVNULL)
    assert code == 0 and "Go ahead?" in screen, screen
    assert (repo / "a.txt").read_text() == "alpha\n"


def test_destructive_commands_refuse_without_a_terminal_unless_yes(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    first = checkpoint(repo, env, "--session", "s")["checkpoint"]["id"]
    write(repo / "a.txt", "changed\n")
    second = checkpoint(repo, env, "--session", "s")["checkpoint"]["id"]
    write(repo / "a.txt", "changed again\n")
    before = worktree_listing(repo)
    runs = [
        ["restore", first],
        ["revert", first, second],
        ["delete", first],
        ["delete", "--session", "s", str(repo)],
        ["gc", str(repo), "--keep", "0"],
    ]
    for args in runs:
        refused = cli(*args, cwd=repo, env=env, code=1)
        assert_one_error_line(refused, "stdin is not a terminal", "--yes")
    assert worktree_listing(repo) == before
    listed = cli("list", "--json", repo, env=env).json()["checkpoints"]
    assert {cp["id"] for cp in listed} >= {first, second}
    # A dry run changes nothing, so it needs no --yes.
    assert cli("restore", "--json", first, "--dry-run", cwd=repo, env=env).json()["written"] == ["a.txt"]


def test_undo_puts_back_the_last_restore_and_twice_is_a_redo(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    assert_one_error_line(cli("undo", repo, env=env, code=1), "no restore or revert to undo")
    cp = checkpoint(repo, env)["checkpoint"]
    write(repo / "a.txt", "the newest edit\n")
    write(repo / "new.txt", "made since\n")
    cli("restore", cp["id"], "--yes", cwd=repo, env=env)
    assert (repo / "a.txt").read_text() == "alpha\n" and not (repo / "new.txt").exists()

    refused = cli("undo", cwd=repo, env=env, code=1)
    assert "--yes" in refused.stderr and (repo / "a.txt").read_text() == "alpha\n"
    undone = cli("undo", "--json", "--yes", cwd=repo / "src", env=env).json()
    assert undone["written"] == ["a.txt", "new.txt"]
    assert (repo / "a.txt").read_text() == "the newest edit\n" and (repo / "new.txt").read_text() == "made since\n"

    redone = cli("undo", repo, "--yes", env=env)
    assert "W  a.txt" in redone.stdout and "D  new.txt" in redone.stdout
    assert (repo / "a.txt").read_text() == "alpha\n" and not (repo / "new.txt").exists()


def test_delete_asksat_a_terminal(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env)["checkpoint"]["id"]
    code, screen = at_a_terminal(["delete", cp], b"n\n", env, repo, prompt=b"Delete 1 checkpoint?")
    assert code == 0 and "Delete 1 checkpoint?" in screen, screen
    assert [c["id"] for c in cli("list", "--json", repo, env=env).json()["checkpoints"]] == [cp]
    code, screen = at_a_terminal(["delete", cp], b"y\n", env, repo, prompt=b"Delete 1 checkpoint?")
    assert code == 0 and "deleted 1 checkpoint" in screen, screen


# --------------------------------------------------------------------------
# delete, gc, repair, status, open, worktrees


def test_a_bad_reference_is_told_before_the_missing_yes(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    checkpoint(repo, env, "--session", "s1")
    checkpoint(repo, env, "--session", "s1")
    for word in ("nosuchpath", "#99999999999999999999"):  # a path that matches nothing, a seq past any
        refused = cli("revert", "#1", "#2", word, "--dry-run", cwd=repo, env=env, code=2)
        assert f"{word!r} is neither a checkpoint nor a path here" in refused.stderr, refused
    refused = cli("restore", "nosuch@", cwd=repo, env=env, code=1)  # stdin is no terminal here
    assert refused.stderr.startswith("error: ") and "nosuch" in refused.stderr and "--yes" not in refused.stderr, refused
    asked = cli("restore", "s1@", cwd=repo, env=env, code=1)
    assert "pass --yes (-y) to go ahead" in asked.stderr, asked


def test_delete_and_gc(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    s1 = [checkpoint(repo, env, "--session", "s1")["checkpoint"]["id"] for _ in range(3)]
    s2 = [checkpoint(repo, env, "--session", "s2")["checkpoint"]["id"] for _ in range(2)]
    s3 = [checkpoint(repo, env, "--session", "s3")["checkpoint"]["id"] for _ in range(3)]

    assert cli("delete", "--json", s1[0][:9], "--yes", env=env).json() == {"deleted": 1}
    assert cli("delete", "--json", "--session", "s2", repo, "-y", env=env).json() == {"deleted": 2}
    text = cli("delete", "--session", "s3", "-C", repo, "--yes", env=env).stdout
    assert text.strip() == "deleted 3 checkpoints"
    again = cli("delete", "--session", "s3", "-C", repo, "--yes", env=env, code=1)
    assert again.stderr.startswith(f"error: The worktree at {repo} has no checkpoint in the session 's3';"), again
    remaining = [cp["id"] for cp in cli("list", "--json", repo, env=env).json()["checkpoints"]]
    assert sorted(remaining) == sorted(s1[1:])
    assert not set(remaining) & set(s2 + s3)

    s4 = [checkpoint(repo, env, "--session", "s4")["checkpoint"]["id"] for _ in range(3)]
    assert cli("gc", "--json", repo, "--keep", "1", "--yes", env=env).json() == {"deleted": 3, "freed_bytes": 0}
    kept = {cp["id"] for cp in cli("list", "--json", repo, env=env).json()["checkpoints"]}
    assert kept == {s1[-1], s4[-1]}
    assert cli("gc", repo, "--keep", "1", "--yes", env=env).stdout.strip() == "deleted 0 checkpoints"


def test_open_worktrees_status_and_repair(
    daemon: Daemon, env: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    opened = cli("open", "--json", repo / "src", env=env).json()
    wt = opened["worktree"]
    assert set(wt) == WORKTREE_KEYS
    assert (wt["path"], wt["kind"], wt["branch"]) == (str(repo), "git", "main")
    assert wt["head"] == git(repo, "rev-parse", "HEAD")
    assert cli("open", "--json", repo, env=env).json() == opened, "open is idempotent"
    opened_text = cli("open", repo, env=env).stdout
    assert wt["id"] in opened_text and str(repo) in opened_text

    plain = tmp_path / "plain"
    write(plain / "notes.txt", "not a git worktree\n")
    plain_cp = checkpoint(plain, env)["checkpoint"]
    assert plain_cp["tree"] == oracle_tree(plain)

    write(repo / ".gitignore", "node_modules/\n")
    write(repo / "node_modules" / "left" / "out.js", "a package\n")
    cli("verify", repo, env=env)  # the watcher has heard of both
    listed = cli("worktrees", "--json", env=env).json()
    by_path = {w["path"]: w for w in listed["worktrees"]}
    assert set(by_path) == {str(repo), str(plain)}
    assert by_path[str(plain)]["kind"] == "plain" and by_path[str(plain)]["id"] == plain_cp["worktree"]
    listed_text = cli("worktrees", env=env).stdout
    assert wt["id"] in listed_text and str(plain) in listed_text
    if by_path[str(repo)]["watching"]:
        assert by_path[str(repo)]["unwatched_ignored"] == ["node_modules"]
        assert by_path[str(repo)]["watched_folders"] >= 1
        assert "not watched, as git ignores them: node_modules" in listed_text
    else:  # no inotify (SNAPSHOTD_DISABLE): nothing is watched, nor said to be
        assert (by_path[str(repo)]["watched_folders"], by_path[str(repo)]["unwatched_ignored"]) == (None, [])
        assert "watching" not in listed_text

    status = cli("status", "--json", env=env).json()
    assert {"worktrees", "counters"} <= set(status)
    assert {w["id"] for w in status["worktrees"]} == {wt["id"], plain_cp["worktree"]}
    assert isinstance(status["counters"], dict)
    status_text = cli("status", env=env).stdout
    assert f"pid {daemon.pid}" in status_text and wt["id"] in status_text and str(repo) in status_text

    assert cli("repair", "--json", env=env).json() == {"moved": [], "mended": [], "gone": []}
    assert cli("repair", env=env).stdout.strip() == "nothing moved"

    cp = checkpoint(repo, env, "--session", "m")["checkpoint"]
    moved_to = tmp_path / "moved-repo"
    os.rename(repo, moved_to)
    repaired = cli("repair", "--json", moved_to, env=env).json()
    assert repaired == {"moved": [{"worktree": wt["id"], "from": str(repo), "to": str(moved_to)}], "mended": [], "gone": []}
    after = cli("list", "--json", moved_to, env=env).json()["checkpoints"]
    assert [c["id"] for c in after] == [cp["id"]] and after[0]["worktree"] == wt["id"]
    assert checkpoint(moved_to, env, "--session", "m")["checkpoint"]["worktree"] == wt["id"]


# --------------------------------------------------------------------------
# Errors and usage


PROCESS_SAMPLE = (0, 1, 9)


def test_a_plain_folder_is_a_worktree_from_its_first_checkpoint_and_names_it_from_inside(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    write(plain / "sub" / "a.txt", "a\n")
    for command in (["list"], ["diff", "--stat", "@"], ["log"], ["verify"]):  # a read makes no worktree there
        refused = cli(*command, cwd=plain / "sub", env=env, code=1)
        assert f"{plain / 'sub'} is in no worktree" in refused.stderr, (command, refused.stderr)
    assert cli("status", "--json", env=env).json()["worktrees"] == []
    made = checkpoint(plain, env, "--force")["checkpoint"]
    listed = cli("list", "--json", cwd=plain / "sub", env=env).json()["checkpoints"]  # inside it: the same worktree
    assert [c["id"] for c in listed] == [made["id"]]
    assert [wt["path"] for wt in cli("status", "--json", env=env).json()["worktrees"]] == [str(plain)]


def test_errors_are_one_line_or_json_and_usage_errors_exit_2(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    runs = [
        ["show", "1234567"],
        ["show", "--json", "1234567"],
        ["--json", "list", "/no/such/folder"],
        ["list", "/no/such/folder"],
        ["restore", "--json", "abcdef1", "--yes"],
        ["diff", "--json", "abcdef1"],
        ["checkpoint", "--json", "--session", "bad\tsession"],
        ["--socket", "/proc/no-such/s.sock", "list"],
        ["--socket", "/proc/no-such/s.sock", "--json", "list"],
        # usage errors
        ["list", "--limit", "-1"],
        ["no-such-command"],
        ["show"],
        ["delete"],
        ["delete", "--session", "s", "a", "b"],
        ["diff", "--stat"],
        ["--embedded", "stop"],
        ["checkpoint", "--no-such-option"],
    ]
    results = [cli(*args, cwd=repo, env=env, code=None) for args in runs]
    # The same runs as real processes give the same exit status and output.
    as_processes = cli_many([runs[i] for i in PROCESS_SAMPLE], cwd=repo, env=env)
    for i, process in zip(PROCESS_SAMPLE, as_processes, strict=True):
        assert (process.code, process.stdout) == (results[i].code, results[i].stdout), str(process)
        assert process.stderr.splitlines()[-1:] == results[i].stderr.splitlines()[-1:], str(process)
    (show_h, show_j, list_j, list_h, restore_j, diff_j, session_j, socket_h, socket_j, *usage) = results

    assert_one_error_line(show_h, "No checkpoint matches '1234567'")
    assert assert_json_error(show_j, kind="not_found", code=-32000)["message"].startswith("No checkpoint")
    assert_json_error(list_j, kind="not_found")
    assert_one_error_line(list_h, "/no/such/folder")
    assert_json_error(restore_j, kind="not_found")
    assert_json_error(diff_j, kind="not_found")
    assert (session_j.code, session_j.stdout) == (2, "") and "Invalid value for '--session'" in session_j.stderr  # click's
    assert_one_error_line(socket_h, "/proc/no-such/s.sock")
    assert_json_error(socket_j)
    for result in usage:
        assert result.code == 2, str(result)
        assert "Traceback" not in result.stderr and result.stdout == "", str(result)
        assert "Usage:" in result.stderr or "Error:" in result.stderr, str(result)
    assert ping(daemon.socket)["pid"] == daemon.pid


# --------------------------------------------------------------------------
# --embedded and the daemon share one store


def test_embedded_and_daemon_see_the_same_checkpoints(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    embedded = cli("--embedded", "checkpoint", "--json", "-m", "in-process", "--session", "e", repo, env=env).json()
    cp_e = embedded["checkpoint"]
    assert cp_e["tree"] == oracle_tree(repo)
    assert embedded["stats"]["scan"] == "full"

    write(repo / "a.txt", "changed by the user\n")
    cp_d = checkpoint(repo, env, "-m", "daemon", "--session", "e")["checkpoint"]
    assert cp_d["tree"] == oracle_tree(repo)
    assert (cp_d["parent"], cp_d["seq"], cp_d["worktree"]) == (cp_e["id"], 2, cp_e["worktree"])

    via_daemon, via_embedded = cli_many(
        [["list", "--json", repo], ["--embedded", "list", "--json", repo]], env=env
    )
    assert via_daemon.code == 0 and via_embedded.code == 0
    assert via_daemon.json() == via_embedded.json()
    assert [cp["id"] for cp in via_daemon.json()["checkpoints"]] == [cp_d["id"], cp_e["id"]]

    shown = [cli(*prefix, "show", "--json", cp_d["id"][:8], env=env).json() for prefix in ([], ["--embedded"])]
    assert shown[0] == shown[1] == {"checkpoint": cp_d}
    diffs = [
        cli(*prefix, "diff", "--json", cp_e["id"], cp_d["id"], env=env).json()
        for prefix in ([], ["--embedded"])
    ]
    assert diffs[0] == diffs[1] and [f["path"] for f in diffs[0]["files"]] == ["a.txt"]
    again = cli("--embedded", "checkpoint", "--json", "--session", "e", repo, env=env).json()
    assert again["checkpoint"]["changed"] is False and again["checkpoint"]["tree"] == cp_d["tree"]


# --------------------------------------------------------------------------
# Starting a daemon on demand


def test_a_command_starts_a_daemon_when_none_runs(repo: Path, tmp_path: Path) -> None:
    # The default socket: $XDG_RUNTIME_DIR/snapshotd/snapshotd.sock (conftest isolates it).
    env = child_env()
    sock = Path(os.environ["XDG_RUNTIME_DIR"]) / "snapshotd" / "snapshotd.sock"
    assert not sock.exists()
    pid = None
    try:
        first = cli_process("checkpoint", "--json", "--session", "auto", repo, env=env).json()
        assert first["checkpoint"]["tree"] == oracle_tree(repo)
        assert answers(sock)
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o700
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        pid = ping(sock)["pid"]
        assert pid != os.getpid()

        # The next commands reuse it instead of starting another.
        status = cli("status", "--json", env=env).json()
        assert status["pid"] == pid
        listed = cli("list", "--json", repo, env=env).json()["checkpoints"]
        assert [cp["id"] for cp in listed] == [first["checkpoint"]["id"]]
        assert cli("ping", env=env).stdout.startswith("snapshotd ")
        log = sock.parent / "snapshotd.log"
        assert "listening on" in log.read_text()

        assert cli_process("stop", env=env).stdout.strip() == f"stopped the daemon on {sock}"
        assert not answers(sock) and not sock.exists()
        wait_until(lambda: process_gone(pid), 10, f"the daemon {pid} to exit")
        assert not log_problems(log.read_text()), log.read_text()
    finally:
        if pid is not None and not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_commands_racing_to_start_a_daemon_share_one(repo: Path, tmp_path: Path) -> None:
    sock = tmp_path / "race" / "s.sock"
    env = child_env(sock)
    pids: set[int] = set()
    try:
        results = cli_many([["ping", "--json"], ["ping", "--json"], ["list", "--json", repo]], env=env)
        for result in results:
            assert result.code == 0, str(result)
        pids = {r.json()["pid"] for r in results[:2]}
        assert len(pids) == 1, f"several daemons answered: {pids}"
        [pid] = pids
        assert ping(sock)["pid"] == pid
        cli("stop", env=env)
        wait_until(lambda: process_gone(pid), 10, f"the daemon {pid} to exit")
        log = (sock.parent / "snapshotd.log").read_text()
        # Losers of the race stop at once with one clear line; nothing else goes wrong.
        assert "Traceback" not in log, log
        # A loser still starting when the winner stopped was ended by the command that started it.
        assert _stop_late_starters(sock) == []
    finally:
        for pid in pids:
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
        _stop_late_starters(sock)


def _stop_late_starters(sock: Path) -> list[int]:
    """Stop whatever still answers on the path until it stays silent for 3 s; their pids.

    No daemon outlives the test, even when the launcher fails to end a racer
    that would take the path after the winner stopped.
    """
    stopped: list[int] = []
    quiet_since = time.monotonic()
    deadline = quiet_since + 15
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 3:
        try:
            late = ping(sock, timeout=2)["pid"]
        except (OSError, ConnectionError, SnapshotdError):
            time.sleep(0.1)
            continue
        os.kill(late, signal.SIGTERM)
        stopped.append(late)
        wait_until(lambda pid=late: process_gone(pid), 10, f"the late daemon {late} to exit")
        quiet_since = time.monotonic()
    return stopped


def test_a_socket_folder_others_may_write_is_refused_before_a_start(repo: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the daemon and its clients refuse a socket folder others may write to
    env = child_env(shared / "s.sock")
    human = cli_process("list", repo, env=env, code=1)
    assert_one_error_line(human, "Refusing the socket folder", "other users may write")
    assert os.listdir(shared) == []
    assert_json_error(cli("--json", "list", repo, env=env, code=1))


def test_a_daemon_that_cannot_start_is_reported(repo: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    env = child_env(folder / "s.sock", SNAPSHOTD_MAX_CONNECTIONS="bogus")  # only the daemon reads it, and refuses it
    human = cli_process("list", repo, env=env, code=1)
    line = assert_one_error_line(human, "could not start", str(folder / "snapshotd.log"))
    assert "exit status 1" in line
    assert "SNAPSHOTD_MAX_CONNECTIONS must be a whole number" in (folder / "snapshotd.log").read_text()
    assert_json_error(cli("--json", "list", repo, env=env, code=1))


def _fake_daemon(path: Path, reply: bytes | None) -> threading.Thread:
    """A listener that reads one request and answers ``reply`` (or nothing), then hangs up."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)

    def serve_one() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                if reply is not None:
                    conn.sendall(reply)

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (None, "was lost before it replied"),
        (b"this is not json\n", "not valid JSON"),
        (b'{"jsonrpc":"2.0","id":1,"result":[]}\n', "result is not an object"),
    ],
    ids=["hangs-up", "garbage", "bad-result"],
)
def test_a_broken_daemon_gives_one_error_line(
    tmp_path: Path, reply: bytes | None, expected: str
) -> None:
    folder = tmp_path / "fake"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    thread = _fake_daemon(path, reply)
    result = cli("--socket", path, "status", code=1)
    thread.join(5)
    assert_one_error_line(result, expected)

    thread = _fake_daemon(path.with_name("j.sock"), reply)
    as_json = cli("--socket", path.with_name("j.sock"), "--json", "status", code=1)
    thread.join(5)
    assert expected in assert_json_error(as_json)["message"]


# --------------------------------------------------------------------------
# Help


def _long_names(command: click.Command) -> list[str]:
    names = []
    for param in command.params:
        if isinstance(param, click.Option):
            names += [opt for opt in param.opts + param.secondary_opts]
    return names


def test_help_of_the_program_and_every_command() -> None:
    commands = sorted(cli_main.commands)
    for name, options in CONTRACT_OPTIONS.items():
        assert name in commands, f"the contract's command {name!r} is missing"
        assert set(options) <= set(_long_names(cli_main.commands[name])), name
    assert {"--socket", "--embedded", "--json"} <= set(_long_names(cli_main))
    for name in commands:
        if name not in ("serve", "hook", "mcp", "completion"):  # nothing for people (hook), MCP, a shell script
            assert "--json" in _long_names(cli_main.commands[name]), f"{name} takes no --json"

    # As a real process: the module entry point and the installed script.
    top = cli_process("--help")
    for name in commands:
        assert name in top.stdout, f"`snapshotd --help` does not list {name}"
    for option in _long_names(cli_main):
        assert option in top.stdout
    for name in commands:
        result = cli(name, "--help")
        assert result.stdout.startswith(f"Usage: snapshotd {name} "), str(result)
        for option in _long_names(cli_main.commands[name]):
            assert option in result.stdout, f"`snapshotd {name} --help` does not mention {option}"
    script = Path(sys.executable).parent / "snapshotd"
    if script.exists():
        proc = subprocess.run(
            [str(script), "checkpoint", "--help"], capture_output=True, text=True, env=child_env(), check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == cli("checkpoint", "--help").stdout
