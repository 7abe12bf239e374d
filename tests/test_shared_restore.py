"""In a shared worktree, a neighbour cannot reach a restore's scratch space.

The tests run as root (the victim, the engine in this process); the
attacker is uid 65534 (``setpriv``) and may write in the worktree's root (a
group-writable shared worktree). It watches the root with inotify and, the
moment a restore's backup folder (``.snapshotd-tmp-*``) appears there,
renames a folder of the victim's onto its name, or exchanges it with a
folder of its own whose every new entry it reads and replaces. Backups now
live in the user's private journal folder, so none of that reaches them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from repo_helpers import git, init_repo, write
from test_other_users import DROP, OTHER_UID

from snapshotd.engine.core import Engine
from snapshotd.errors import FilesystemError, SnapshotdError
from snapshotd.restore.apply import Applier

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")

RENAMER = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
root = sys.argv[1]
fd = libc.inotify_init1(0)
libc.inotify_add_watch(fd, root.encode(), 0x100)  # IN_CREATE
sys.stdout.write("ready\n")
sys.stdout.flush()
while True:
    data = os.read(fd, 65536)
    offset = 0
    while offset < len(data):
        wd, mask, cookie, size = struct.unpack_from("iIII", data, offset)
        name = data[offset + 16 : offset + 16 + size].rstrip(b"\0").decode()
        offset += 16 + size
        if name.startswith(".snapshotd-tmp-") and mask & 0x40000000:  # IN_ISDIR
            try:
                os.rename(os.path.join(root, "secure"), os.path.join(root, name))
            except OSError:
                pass
"""

# Told each backup folder's name as it is made (the test stands in for a fast
# enough watcher), it exchanges the folder with one of its own, then reads
# every backup put there and replaces it with a file of its own.
EXCHANGER = r"""
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
root = sys.argv[1]

def steal(target, turn):
    end = time.monotonic() + 2
    seen = set()
    while time.monotonic() < end:
        try:
            names = os.listdir(target)
        except OSError:
            return
        for slot in set(names) - seen:
            seen.add(slot)
            try:
                with open(os.path.join(target, slot), "rb") as handle:
                    kept = handle.read()
                with open(os.path.join(root, f"read-{turn}-{slot}"), "wb") as handle:
                    handle.write(kept)
                ours = os.path.join(root, f"ours-{turn}-{slot}")
                with open(ours, "w") as handle:
                    handle.write("the attacker's\n")
                os.rename(ours, os.path.join(target, slot))
            except OSError:
                pass

sys.stdout.write("ready\n")
sys.stdout.flush()
for turn, line in enumerate(sys.stdin):
    target = os.path.join(root, line.strip())
    loot = os.path.join(root, f"loot-{turn}")
    os.mkdir(loot, 0o777)
    libc.renameat2(-100, loot.encode(), -100, target.encode(), 2)  # RENAME_EXCHANGE
    threading.Thread(target=steal, args=(target, turn), daemon=True).start()
    sys.stdout.write("done\n")
    sys.stdout.flush()
"""


@contextmanager
def attacker(program: str, root: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [*DROP, sys.executable, "-c", program, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def shared_worktree(shared: Path) -> Path:
    """The victim's repository with a root anyone may write to (a group-writable shared worktree)."""
    repo = init_repo(shared / "victim", ("a.txt", "a at first\n"), ("priv/notes.txt", "private notes\n"))
    repo.chmod(0o777)
    (repo / "priv").chmod(0o700)
    return repo


async def test_a_folder_renamed_to_the_backup_folders_name_is_never_emptied(engine: Engine, shared: Path) -> None:
    repo = shared_worktree(shared)
    write(repo / ".gitignore", "secure/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore")
    secure = {f"secure/key{n}": f"key {n}\n" for n in range(3)}
    for path, text in secure.items():
        write(repo / path, text)
    first = (await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"]
    with attacker(RENAMER, repo):
        for turn in range(10):
            write(repo / "a.txt", f"edit {turn}\n")
            await engine.call("restore", {"checkpoint": first["id"], "path": str(repo)})
            assert (repo / "a.txt").read_text() == "a at first\n"
            for path, text in secure.items():
                assert (repo / path).read_text() == text, f"{path} lost in restore {turn}"


async def test_a_folder_exchanged_for_the_backup_folder_gets_nothing_and_changes_no_rollback(
    engine: Engine, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = shared_worktree(shared)
    first = (await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"]
    real_write = Applier.write

    def failing_last(self, path, entry, temp, link):  # a later step fails: everything is rolled back
        if path == "priv/notes.txt":
            time.sleep(0.3)  # a slow step: the neighbour has had its time
            raise FilesystemError("The disk refused a write (injected).")
        return real_write(self, path, entry, temp, link)

    real_mkdir = os.mkdir

    def mkdir(name, mode=0o777, *, dir_fd=None):  # the attacker's timing, not its act
        real_mkdir(name, mode, dir_fd=dir_fd)
        if isinstance(name, str) and name.startswith(".snapshotd-tmp-"):
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(name.encode() + b"\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == b"done\n"

    monkeypatch.setattr(os, "mkdir", mkdir)
    with attacker(EXCHANGER, repo) as proc:
        for turn in range(12):
            write(repo / "a.txt", f"edit {turn}\n")
            write(repo / "priv" / "notes.txt", f"private notes, edit {turn}\n")
            failing = turn % 2 == 1
            if failing:
                monkeypatch.setattr(Applier, "write", failing_last)
            try:
                await engine.call("restore", {"checkpoint": first["id"], "path": str(repo)})
            except SnapshotdError as exc:
                assert failing, exc.message
                assert "Nothing was changed" in exc.message, exc.message
                assert (repo / "priv" / "notes.txt").read_text() == f"private notes, edit {turn}\n"
                assert (repo / "a.txt").read_text() == f"edit {turn}\n"
            else:
                assert not failing
                assert (repo / "priv" / "notes.txt").read_text() == "private notes\n"
            finally:
                monkeypatch.setattr(Applier, "write", real_write)
    read = [p.read_bytes() for p in repo.iterdir() if p.name.startswith("read-")]
    assert not any(b"private notes" in data for data in read), "the victim's private file reached the attacker"
    assert all(p.stat().st_uid != OTHER_UID for p in (repo / "priv").iterdir())
