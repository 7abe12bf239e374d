"""Findings of a first use of the command line, each held by a test (issue 21).

`shutdown` is `stop`; `delete` and `gc` list what they would delete before
asking; without a terminal the refusal is one error (JSON under --json); a
declined question says nothing changed; `show` says yes or no; labels with
control characters stay on their line; `list --limit 0` lists nothing
without claiming there is nothing; `undo --dry-run`; ages as people write
them; the man page's synopsis has every command and its -y.
"""

from __future__ import annotations

import re
import shutil
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
    cli_process,
)
from repo_helpers import git, init_repo, worktree_listing, write
from terminal_helpers import at_a_terminal

from snapshotd.cli.main import main as cli_main
from snapshotd.wording import plural

MAN_PAGE = Path(__file__).resolve().parent.parent / "man" / "snapshotd.1"


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))


def checkpoint(repo: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    return cli("checkpoint", "--json", str(repo), *args, env=env).json()["checkpoint"]


def ids(repo: Path, env: dict[str, str]) -> list[str]:
    return [cp["id"] for cp in cli("list", "--json", repo, env=env).json()["checkpoints"]]


def test_shutdown_is_stop_and_says_whether_a_daemon_ran(daemon: Daemon, sock: Path, env: dict[str, str]) -> None:
    stopped = cli_process("shutdown", env=env)
    assert stopped.stdout.strip() == f"stopped the daemon on {sock}"
    assert daemon.wait() == 0 and not answers(sock)
    again = cli_process("shutdown", env=env)
    assert again.stdout.strip() == f"no daemon was running on {sock}"
    assert not sock.exists(), "shutdown must not start a daemon"


def test_delete_at_a_terminal_lists_what_it_would_delete_and_a_no_says_nothing_changed(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    one = checkpoint(repo, env, "-m", "first label", "--session", "s")
    two = checkpoint(repo, env, "-m", "second label", "--session", "s")
    code, screen = at_a_terminal(["delete", one["id"][:9], "s@"], b"n\n", env, repo, prompt=b"Delete 2 checkpoints?")
    assert code == 0, screen
    listing, question = screen.split("Delete 2 checkpoints?")
    assert one["id"][:12] in listing and "first label" in listing and two["id"][:12] in listing, screen
    assert "nothing changed" in question, screen
    assert sorted(ids(repo, env)) == sorted([one["id"], two["id"]])
    prompt = b"Delete 2 checkpoints of session 's'?"
    code, screen = at_a_terminal(["delete", "--session", "s"], b"y\n", env, repo, prompt=prompt)
    assert code == 0 and "second label" in screen.split("Delete 2")[0] and "deleted 2 checkpoints" in screen, screen
    assert ids(repo, env) == []


def test_gc_at_a_terminal_lists_what_it_would_delete(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    made = [checkpoint(repo, env, "--session", "s")["id"] for _ in range(3)]
    code, screen = at_a_terminal(["gc", "--keep", "1"], b"n\n", env, repo, prompt=b"Delete 2 checkpoints?")
    assert code == 0, screen
    listing = screen.split("Delete 2 checkpoints?")[0]
    assert f"would delete 2 checkpoints of session s in {repo}" in listing, screen
    assert made[0][:12] in listing and made[1][:12] in listing and made[2][:12] not in listing, screen
    assert "nothing changed" in screen and sorted(ids(repo, env)) == sorted(made)


def test_without_a_terminal_the_refusal_is_one_error_or_json(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env)["id"]
    write(repo / "a.txt", "changed\n")
    before = worktree_listing(repo)
    for args in (["restore", cp], ["delete", cp], ["gc"], ["revert", cp]):
        assert_one_error_line(cli(*args, cwd=repo, env=env, code=1), "stdin is not a terminal", "--yes")
        error = assert_json_error(cli(*args, "--json", cwd=repo, env=env, code=1), kind="needs_force")
        assert "--yes" in error["message"]
    assert worktree_listing(repo) == before and ids(repo, env) == [cp]


def test_a_declined_restore_says_nothing_changed(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env)["id"]
    write(repo / "a.txt", "changed\n")
    code, screen = at_a_terminal(["restore", cp], b"n\n", env, repo)
    assert code == 0 and "nothing changed" in screen.split("Go ahead?")[1], screen
    assert (repo / "a.txt").read_text() == "changed\n"


def test_show_says_yes_or_no_and_labels_stay_on_their_line(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    first = checkpoint(repo, env, "-m", "two\nlines and \x1b[31mred")
    second = checkpoint(repo, env, "-m", "plain")
    shown = cli("show", first["id"], env=env).stdout
    assert re.search(r"^Changed:\s+yes$", shown, re.M) and "True" not in shown, shown
    assert re.search(r"^Changed:\s+no \(the same tree", cli("show", second["id"], env=env).stdout, re.M)
    assert re.search(r"^Label:\s+two\\nlines and \\x1b\[31mred$", shown, re.M), shown
    lines = cli("list", repo, env=env).stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith(first["id"][:12]), lines
    assert "\x1b" not in "".join(lines)


def test_list_limit_0_lists_nothing_and_does_not_say_there_is_nothing(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    checkpoint(repo, env)
    assert cli("list", "--limit", "0", repo, env=env).stdout == ""
    assert cli("list", "--session", "nobody", repo, env=env).stdout.strip() == "no checkpoints"


def test_undo_dry_run_reports_and_changes_nothing(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cp = checkpoint(repo, env)["id"]
    write(repo / "a.txt", "the newest edit\n")
    cli("restore", cp, "--yes", cwd=repo, env=env)
    planned = cli("undo", "--dry-run", "--json", cwd=repo, env=env).json()
    assert planned["written"] == ["a.txt"] and planned["safety_checkpoint"] is None
    assert "would write 1" in cli("undo", "--dry-run", cwd=repo, env=env).stdout
    assert (repo / "a.txt").read_text() == "alpha\n"


def test_older_than_takes_ages_as_people_write_them(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    for _ in range(2):
        checkpoint(repo, env, "--session", "s")
    for age in ("12h", "1d", "2w", "1h30m", "90"):
        assert cli("gc", "--json", "--older-than", age, "--yes", repo, env=env).json()["deleted"] == 0
    time.sleep(1.1)  # the cut-off is to the second
    assert cli("gc", "--json", "--older-than", "0m", "--yes", repo, env=env).json()["deleted"] == 2
    refused = cli("gc", "--older-than", "1x", "--yes", repo, env=env, code=2)
    assert "'1x' is not an age" in refused.stderr and "12h" in refused.stderr


def test_a_session_name_the_daemon_would_refuse_is_a_usage_error(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    for args in (["checkpoint", "--session", ""], ["list", "--session", "a\tb"], ["log", "--session", "x" * 201]):
        refused = cli(*args, str(repo), env=env, code=2)
        assert "Invalid value for '--session'" in refused.stderr and "is not a session name" in refused.stderr
    assert cli("list", "--json", str(repo), env=env).json() == {"checkpoints": []}  # nothing was recorded


def test_every_session_name_of_up_to_200_characters_records_and_lists(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    names = ["x" * 124, "x" * 125, "会" * 42, "会" * 200, "\U0001f600" * 200]  # past a file name's 255 bytes in hex
    for name in names:
        made = cli("checkpoint", "--json", "--session", name, str(repo), env=env).json()["checkpoint"]
        assert made["session"] == name
        [listed] = cli("list", "--json", "--session", name, str(repo), env=env).json()["checkpoints"]
        assert listed["id"] == made["id"]
        assert cli("resolve", "--session", name, "@", cwd=repo, env=env).stdout.strip() == made["id"]


def test_the_daemon_s_own_sessions_are_not_recorded_in_by_a_client(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    refused = cli("checkpoint", "--session", "snapshotd:safety", "-m", "fake", str(repo), env=env, code=1)
    assert "are the daemon's own" in refused.stderr
    assert cli("list", "--json", "--session", "snapshotd:safety", str(repo), env=env).json() == {"checkpoints": []}


def _synopsis() -> dict[str, str]:
    """Each command's block of the man page's SYNOPSIS, by name."""
    text = MAN_PAGE.read_text()
    section = text[text.index(".SH SYNOPSIS") : text.index(".SH DESCRIPTION")]
    blocks: dict[str, str] = {}
    for name, body in re.findall(r'^\.SY "snapshotd ([\w-]+)"\n(.*?)^\.YS', section, re.M | re.S):
        blocks[name] = blocks.get(name, "") + body
    return blocks


def test_the_man_pages_synopsis_has_every_command_and_its_yes_and_dry_run() -> None:
    blocks = _synopsis()
    assert isinstance(cli_main, click.Group)
    for name, command in cli_main.commands.items():
        assert name in blocks, f"snapshotd {name} is not in the SYNOPSIS of {MAN_PAGE.name}"
        options = {option for param in command.params for option in getattr(param, "opts", [])}
        for flag, roff in (("-y", r"\-y"), ("--dry-run", r"\-\-dry\-run")):
            if flag in options:
                assert roff in blocks[name], f"the SYNOPSIS of snapshotd {name} lacks {flag}"


def test_safety_labels_name_checkpoints_by_12_digits_and_list_keeps_its_columns(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    first = cli("checkpoint", "--json", "--session", "s", str(repo), env=env).json()["checkpoint"]
    write(repo / "a.txt", "beta\n")
    second = cli("checkpoint", "--json", "--session", "s", str(repo), env=env).json()["checkpoint"]
    cli("revert", first["id"], second["id"], "--yes", cwd=repo, env=env)
    cli("restore", second["id"], "--yes", cwd=repo, env=env)
    safety = cli("list", "--json", "--session", "snapshotd:safety", str(repo), env=env).json()["checkpoints"]
    assert [cp["label"] for cp in safety] == [
        f"before restore {second['id'][:12]}",
        f"before revert {first['id'][:12]}..{second['id'][:12]}",
    ]
    lines = cli("list", str(repo), env=env).stdout.splitlines()
    labels = ["before restore", "before revert", "", ""]
    starts = {line.index(label) for line, label in zip(lines, labels, strict=True) if label}
    assert len(starts) == 1, lines  # every label starts in the same column, after the longest session
    assert all(line == line.rstrip() for line in lines), lines  # and a line with none ends at its session


def test_diff_of_an_id_against_its_worktree_works_from_any_folder(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    other = init_repo(tmp_path / "other", ("o.txt", "o\n"))
    cp = checkpoint(repo, env)
    write(repo / "a.txt", "changed\n")
    for folder in (tmp_path, other):  # a plain folder, and another repository
        assert cli("diff", cp["id"][:12], cwd=folder, env=env).stdout.splitlines() == ["M  a.txt"]
    assert cli("diff", cp["id"], cwd=repo, env=env).stdout.splitlines() == ["M  a.txt"]


def test_errors_and_counts_read_as_sentences(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    """A session's name keeps its case, counts take their plural, and each refusal says what to do."""
    cli("checkpoint", "--session", "MyBot", str(repo), env=env)
    short = cli("diff", "MyBot@~2", "@", cwd=repo, env=env, code=1)
    assert_one_error_line(short, f"Session 'MyBot' of the worktree {repo} has 1 checkpoint, so none is 2", "`snapshotd list`")
    assert "wt_" not in short.stderr
    assert "`snapshotd list` shows its sessions" in cli("show", "nobody@", cwd=repo, env=env, code=1).stderr
    assert "`snapshotd list` shows the seqs" in cli("show", "#9", cwd=repo, env=env, code=1).stderr
    assert "`snapshotd list` shows the checkpoints" in cli("show", "1234567", cwd=repo, env=env, code=1).stderr
    cli("checkpoint", str(repo), env=env)
    cli("checkpoint", str(repo), env=env)
    dry = cli("gc", "--keep", "1", "--dry-run", cwd=repo, env=env).stdout
    assert f"would delete 1 checkpoint of the default session in {repo}" in dry, dry
    made = cli("checkpoint", str(repo), env=env).stdout
    assert re.search(r", (1 process|\d+ processes), \d+ ms$", made.strip()), made
    assert plural(2, "process") == "2 processes" and plural(1, "process") == "1 process"
    assert plural(3, "file") == "3 files"


def test_a_restore_into_another_repository_names_both_and_what_to_do(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    other = init_repo(tmp_path / "other", ("o.txt", "o\n"))
    cp = checkpoint(repo, env)
    refused = cli_process("restore", cp["id"], "--into", str(other), "--yes", cwd=repo, env=env, code=1)
    assert_one_error_line(refused, f"Checkpoint {cp['id'][:12]} is stored in the repository of {repo}", str(other),
                          "git worktree add")
    assert (other / "o.txt").read_text() == "o\n" and not (other / "a.txt").exists()


def test_lines_without_a_label_end_where_their_text_does(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    """No trailing spaces after the session; ``(unchanged)`` stands where the label would."""
    first = cli("checkpoint", str(repo), env=env).stdout.splitlines()[0]
    again = cli("checkpoint", str(repo), env=env).stdout.splitlines()[0]
    listed = cli("list", str(repo), env=env).stdout.splitlines()
    for line in (first, again, *listed):
        assert line == line.rstrip(), repr(line)
    assert first.endswith("  -") and again.endswith("  -            (unchanged)")
    assert listed == [again, first]
    far = cli("show", "@~999", cwd=repo, env=env, code=1)
    assert_one_error_line(far, f"The default session of the worktree {repo} has 2 checkpoints, so none is 999")


def test_restoring_a_deleted_submodule_says_git_fills_its_folder(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    """A checkpoint holds a submodule's commit, not its files: the restore makes its folder and names git's step."""
    sub = init_repo(repo / "sub", ("inner.txt", "inside\n"))
    git(repo, "add", "sub")
    git(repo, "commit", "-q", "-m", "a submodule")
    cp = checkpoint(repo, env)
    shutil.rmtree(sub)
    preview = cli("restore", cp["id"], "--dry-run", cwd=repo, env=env).stdout.splitlines()
    assert preview[0] == (
        "S  sub: submodule: would make its folder only (a checkpoint holds no submodule's files); "
        "'git submodule update --init -- sub' checks it out"
    )
    assert preview[1] == "would write 0 files, would delete 0 files, would make 1 submodule folder"
    done = cli("restore", cp["id"], "--yes", cwd=repo, env=env)
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    assert any(line.startswith("S  sub: submodule: made its folder only") for line in lines), done
    assert not any(line.startswith("W  sub") for line in lines), done
    assert any(line.startswith("wrote 0 files, deleted 0 files, made 1 submodule folder") for line in lines), done
    assert sub.is_dir() and list(sub.iterdir()) == []
    result = cli("restore", cp["id"], "--dry-run", "--json", cwd=repo, env=env).json()
    assert (result["written"], result.get("submodules")) == ([], None)  # the folder with its gitlink is the checkpoint's
