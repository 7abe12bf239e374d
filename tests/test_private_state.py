"""snapshotd's own files are private by construction: its home, ``.git/snapshotd``, the id, ``tmp/``.

Each test is a way another user got at them: a home in a folder that user can
write (or one the victim made readable), a FIFO or a symlink planted where
snapshotd keeps its files, a umask of 000 that left them world-writable. The
tests run as root; the other user is uid 65534 (:mod:`test_other_users`),
its files chowned to it and its processes started through ``setpriv``.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from daemon_helpers import Daemon, assert_one_error_line, call, child_env, cli_process
from repo_helpers import git, init_repo, write
from test_other_users import DROP, OTHER_UID, chown_tree

from snapshotd.errors import SnapshotdError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- row 4: SNAPSHOTD_HOME --------------------------------------------------------------


def test_a_home_inside_a_folder_another_user_owns_is_refused(shared: Path, tmp_path: Path) -> None:
    theirs = shared / "theirs"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    folder = write(tmp_path / "plain" / "secret.txt", "mine\n", mode=0o600).parent
    home = theirs / "sd"
    result = cli_process("--embedded", "checkpoint", folder, env=child_env(SNAPSHOTD_HOME=str(home)), code=None)
    assert_one_error_line(result, f"will not use its home {home}", f"belongs to uid {OTHER_UID}")
    assert listing(theirs) == [], "something was written under the other user's folder"


def test_a_home_others_may_read_or_write_is_refused_with_the_remedy(tmp_path: Path) -> None:
    home = tmp_path / "sd"
    home.mkdir()
    home.chmod(0o755)
    folder = write(tmp_path / "plain" / "secret.txt", "mine\n", mode=0o600).parent
    result = cli_process("--embedded", "checkpoint", folder, env=child_env(SNAPSHOTD_HOME=str(home)), code=None)
    assert_one_error_line(result, f"will not use its home {home}", "mode 0755", f"chmod 700 {home}")
    assert listing(home) == []


def test_a_home_under_a_group_writable_folder_is_refused(tmp_path: Path) -> None:
    """The issue's shared worktree folder (2775, a shared group): any member could swap the home's folder."""
    group_folder = tmp_path / "srv"
    group_folder.mkdir()
    os.chown(group_folder, 0, OTHER_UID)
    group_folder.chmod(0o2775)
    folder = write(tmp_path / "plain" / "a.txt", "a\n").parent
    home = group_folder / "sd"
    result = cli_process("--embedded", "checkpoint", folder, env=child_env(SNAPSHOTD_HOME=str(home)), code=None)
    assert_one_error_line(result, f"group {OTHER_UID} may write to {group_folder}")
    assert listing(home) == []


def test_a_home_in_a_sticky_shared_folder_is_made_private(shared: Path, tmp_path: Path) -> None:
    home = shared / "mine" / "sd"
    folder = write(tmp_path / "plain" / "a.txt", "a\n").parent
    cli_process("--embedded", "checkpoint", folder, env=child_env(SNAPSHOTD_HOME=str(home)))
    assert mode_of(home) == 0o700
    assert mode_of(home / "repos") == 0o700
    assert subprocess.run([*DROP, "ls", str(home.parent)], capture_output=True, check=False).returncode == 0
    peek = subprocess.run([*DROP, "ls", str(home)], capture_output=True, text=True, check=False)
    assert peek.returncode != 0, peek.stdout


# --- row 8: a FIFO where the id is kept --------------------------------------------------


@pytest.mark.parametrize("planted_by", ["a hostile tree", "another user"])
def test_a_fifo_as_the_id_is_refused_and_blocks_no_one(daemon: Daemon, tmp_path: Path, planted_by: str) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    state = repo / ".git" / "snapshotd"
    state.mkdir(mode=0o700)
    os.mkfifo(state / "id")
    if planted_by == "another user":
        chown_tree(state)
    for _ in range(3):  # each used to hold one of the daemon's worker threads for good
        with pytest.raises(SnapshotdError) as refused:
            call(daemon.socket, "checkpoint", {"path": str(repo)})
        message = refused.value.message
        if planted_by == "another user":
            assert f"uid {OTHER_UID}" in message, message
        else:
            assert f"{state / 'id'}" in message and "FIFO" in message, message
    other = init_repo(tmp_path / "other", ("b.txt", "b\n"))
    saved = call(daemon.socket, "checkpoint", {"path": str(other)})
    assert saved["checkpoint"]["tree"] == git(other, "write-tree")
    assert stat.S_ISFIFO(os.lstat(state / "id").st_mode)


def test_a_fifo_in_the_journal_folder_does_not_hold_the_worktrees_opening(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    journal = repo / ".git" / "snapshotd" / "journal"
    journal.mkdir(parents=True, mode=0o700)
    for name in ("apply-0123abcd.journal", ".journal-tmp-1-2"):
        os.mkfifo(journal / name)
    saved = cli_process("--embedded", "--json", "checkpoint", repo).json()
    assert saved["checkpoint"]["tree"] == git(repo, "write-tree")
    assert stat.S_ISFIFO(os.lstat(journal / "apply-0123abcd.journal").st_mode)


# --- row 9: .git/snapshotd a symlink ---------------------------------------------------------


def test_nothing_is_written_through_a_symlinked_state_folder(shared: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = repo / ".git" / "snapshotd"
    link.symlink_to(elsewhere)
    os.lchown(link, OTHER_UID, OTHER_UID)
    result = cli_process("--embedded", "checkpoint", repo, code=None)
    assert_one_error_line(result, "symlink")
    assert listing(elsewhere) == [], "files were created through the link before it was refused"


# --- row 10 and issue 16: umask 000 -----------------------------------------------------------


def test_under_umask_000_nothing_snapshotd_makes_is_writable_by_others(shared: Path, tmp_path: Path) -> None:
    repo = shared / "repo"
    init_repo(repo, ("a.txt", "a\n"))
    plain = write(shared / "plain" / "b.txt", "b\n").parent
    home = shared / "home" / "sd"
    before = set(listing(repo / ".git"))
    env = child_env(SNAPSHOTD_HOME=str(home))
    for target in (repo, plain):
        write(target / "new.txt", "new\n")
        proc = subprocess.run(
            ["sh", "-c", 'umask 000 && exec "$@"', "sh", *_snapshotd("--embedded", "checkpoint", str(target))],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )
        assert proc.returncode == 0, proc.stderr
    state = repo / ".git" / "snapshotd"
    assert (mode_of(state), mode_of(state / "id"), mode_of(state / "tmp")) == (0o700, 0o600, 0o700)
    assert (mode_of(home), mode_of(home / "repos")) == (0o700, 0o700)
    made = [repo / ".git" / name for name in set(listing(repo / ".git")) - before]
    assert made, "the checkpoint wrote nothing into the repository"
    writable = [str(path) for path in made + list(home.parent.rglob("*")) if mode_of(path) & 0o002 and not path.is_symlink()]
    assert writable == []
    reach = subprocess.run([*DROP, "test", "-r", str(repo / ".git" / "HEAD")], check=False)
    assert reach.returncode == 0, "the other user cannot reach the repository at all, so the test shows nothing"
    overwrite = subprocess.run([*DROP, "sh", "-c", f"echo wt_0000 > {state / 'id'}"], capture_output=True, check=False)
    assert overwrite.returncode != 0
    assert (state / "id").read_text().startswith("wt_") and "wt_0000" not in (state / "id").read_text()


def test_a_state_folder_made_0755_by_an_earlier_version_is_made_private(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    state = repo / ".git" / "snapshotd"
    (state / "tmp").mkdir(parents=True)
    for folder in (state, state / "tmp"):
        folder.chmod(0o755)
    cli_process("--embedded", "checkpoint", repo)
    assert (mode_of(state), mode_of(state / "tmp")) == (0o700, 0o700)


def _snapshotd(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "snapshotd", *args]
