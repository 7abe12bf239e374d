"""The one rule "may git convert a file's content": snapshotd.git.attributes.may_convert, against git.

Capture and restore used to answer this each in its own way, and they
disagreed: restore ignored ``core.autocrlf=input`` and ``core.eol`` and read
``GIT_ATTR_NOSYSTEM=0`` as "no system file"; capture ignored the system
attributes file; restore also counted ``~/.config/git/attributes`` where git,
with ``XDG_CONFIG_HOME`` set elsewhere, never reads it. Each case is checked
here against git itself: where git converts, the rule must say so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pygit2
import pytest

from snapshotd.git.attributes import may_convert

ROOT = Path(__file__).resolve().parents[1]
CRLF = b"one\r\ntwo\r\n"


def git(cwd: Path, *args: str, data: bytes | None = None) -> bytes:
    """Run git in ``cwd``; its output."""
    return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, check=True).stdout


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private home and config home, with no system config and no system attributes."""
    home = tmp_path / "home"
    (home / "xdg" / "git").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_ATTR_NOSYSTEM", "1")
    return home


def new_repo(tmp_path: Path) -> Path:
    """An empty git repository."""
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    return wt


def git_converts(wt: Path) -> bool:
    """Whether git records CRLF content of ``a.txt`` as another blob than its raw bytes."""
    cleaned = git(wt, "hash-object", "--stdin", "--path=a.txt", data=CRLF).strip()
    raw = git(wt, "hash-object", "--stdin", "--no-filters", data=CRLF).strip()
    return cleaned != raw


def rule(wt: Path) -> bool:
    """The rule's answer for ``wt``, with no ``.gitattributes`` in the worktree."""
    repo = pygit2.Repository(str(wt))
    return may_convert(repo.config, repo.path)


def test_nothing_set_means_no_conversion(tmp_path: Path, home: Path) -> None:
    wt = new_repo(tmp_path)
    assert not git_converts(wt)
    assert rule(wt) is False


@pytest.mark.parametrize("value", ["true", "input"])
def test_autocrlf_true_or_input_converts(tmp_path: Path, home: Path, value: str) -> None:
    # restore's old rule said "no" for input: git records CRLF files as LF.
    wt = new_repo(tmp_path)
    git(wt, "config", "core.autocrlf", value)
    assert git_converts(wt)
    assert rule(wt) is True


def test_core_eol_counts(tmp_path: Path, home: Path) -> None:
    # restore's old rule ignored core.eol; with any text attribute it decides the line endings.
    wt = new_repo(tmp_path)
    git(wt, "config", "core.eol", "crlf")
    assert rule(wt) is True
    assert may_convert(pygit2.Repository(str(wt)).config, str(wt / ".git"), worktree_attributes=True)


@pytest.mark.parametrize("where", ["info", "xdg", "attributes_file"])
def test_attributes_files_outside_the_worktree_count(tmp_path: Path, home: Path, where: str) -> None:
    wt = new_repo(tmp_path)
    if where == "info":
        target = wt / ".git" / "info" / "attributes"
        target.parent.mkdir(exist_ok=True)
    elif where == "xdg":
        target = home / "xdg" / "git" / "attributes"
    else:
        target = home / "my-attributes"
        git(wt, "config", "core.attributesFile", str(target))
    target.write_text("*.txt text eol=lf\n")
    assert git_converts(wt)
    assert rule(wt) is True


def test_a_file_git_never_reads_does_not_count(tmp_path: Path, home: Path) -> None:
    # With XDG_CONFIG_HOME set elsewhere git ignores ~/.config/git/attributes;
    # restore's old rule still counted it.
    wt = new_repo(tmp_path)
    unread = home / ".config" / "git" / "attributes"
    unread.parent.mkdir(parents=True)
    unread.write_text("*.txt text eol=lf\n")
    assert not git_converts(wt)
    assert rule(wt) is False


# ---------------------------------------------------------------------------
# the system attributes file, in a mount namespace of its own


_SYSTEM_CHILD = r"""
import json, os, subprocess, sys
from snapshotd.git.attributes import may_convert
from snapshotd.git.repository import open_repository

args = json.loads(sys.argv[1])
wt = args["wt"]
repo = open_repository(os.path.join(wt, ".git"))
def hash_of(*flags):
    return subprocess.run(["git", "hash-object", "--stdin", *flags], cwd=wt, input=b"one\r\ntwo\r\n",
                          capture_output=True, check=True).stdout
result = {
    "rule": may_convert(repo.config, repo.path),
    "git": hash_of("--path=a.txt") != hash_of("--no-filters"),
}
if args.get("restore"):
    from snapshotd.restore.plan import Plan
    from snapshotd.restore.prepared import apply_plan
    from snapshotd.restore.stage import GitCheckout
    from snapshotd.restore.trees import Entry
    blob = str(repo.revparse_single("HEAD:a.txt").id)
    apply_plan(repo, wt, Plan(writes=[("a.txt", Entry(blob, 0o100644))]), args["journal"],
               GitCheckout(git_dir=repo.path))
    with open(os.path.join(wt, "a.txt"), "rb") as handle:
        result["restored"] = handle.read().hex()
    subprocess.run(["git", "checkout", "--", "a.txt"], cwd=args["oracle"], check=True)
    with open(os.path.join(args["oracle"], "a.txt"), "rb") as handle:
        result["git_checkout"] = handle.read().hex()
print(json.dumps(result))
"""


def with_system_attributes(
    tmp_path: Path, text: str, env: dict[str, str], args: dict | str, child: str = _SYSTEM_CHILD
) -> dict:
    """Run ``child`` with ``text`` as ``/etc/gitattributes``, seen only inside its own mount namespace."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to give a child its own /etc")
    etc = tmp_path / "etc"
    shutil.copytree("/etc", etc, symlinks=True)
    (etc / "gitattributes").write_text(text)
    command = [
        "unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc && exec "$@"', str(etc),
        sys.executable, "-c", child, args if isinstance(args, str) else json.dumps(args),
    ]
    child_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "SNAPSHOTD_HOME": str(tmp_path / "snapshotd-home"),
    }
    child_env.pop("GIT_ATTR_NOSYSTEM", None)
    child_env.update(env)
    done = subprocess.run(command, capture_output=True, env=child_env, cwd=ROOT)
    if done.returncode != 0 and b"mount" in done.stderr and b"Permission denied" in done.stderr:
        pytest.skip("this machine gives no mount namespace")
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


@pytest.mark.parametrize(("nosystem", "read"), [(None, True), ("0", True), ("false", True), ("1", False)])
def test_the_system_attributes_file_counts_unless_git_attr_nosystem(
    tmp_path: Path, home: Path, nosystem: str | None, read: bool
) -> None:
    # capture's old rule never looked at the system file; restore's read "0" as "skip it".
    wt = new_repo(tmp_path)
    env = {} if nosystem is None else {"GIT_ATTR_NOSYSTEM": nosystem}
    result = with_system_attributes(tmp_path, "*.txt text eol=lf\n", env, {"wt": str(wt)})
    assert result == {"rule": read, "git": read}


def test_a_restore_writes_what_git_checkout_writes_under_the_system_attributes(tmp_path: Path, home: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "a.txt").write_bytes(b"one\ntwo\n")
    git(wt, "add", "a.txt")
    git(wt, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "a")
    oracle = tmp_path / "oracle"
    git(tmp_path, "clone", "-q", str(wt), str(oracle))
    (wt / "a.txt").unlink()
    (oracle / "a.txt").unlink()
    args = {"wt": str(wt), "restore": True, "journal": str(tmp_path / "journal"), "oracle": str(oracle)}
    result = with_system_attributes(tmp_path, "*.txt text eol=crlf\n", {"GIT_ATTR_NOSYSTEM": "0"}, args)
    assert bytes.fromhex(result["git_checkout"]) == CRLF
    assert bytes.fromhex(result["restored"]) == bytes.fromhex(result["git_checkout"])


_CAPTURE_CHILD = r"""
import json, os, sys
import trio
from oracle import oracle_tree
from snapshotd.engine.core import Engine

wt = sys.argv[1]

async def checkpoint():
    return await Engine().call("checkpoint", {"path": wt})

print(json.dumps({"git": oracle_tree(wt), "ours": trio.run(checkpoint)["checkpoint"]["tree"]}))
"""


def test_a_capture_hashes_as_git_does_under_the_system_attributes(tmp_path: Path, home: Path) -> None:
    # capture's old rule never looked at the system file: it stored the CRLF bytes git converts.
    wt = new_repo(tmp_path)
    (wt / "a.txt").write_bytes(CRLF)
    trees = with_system_attributes(tmp_path, "*.txt text eol=lf\n", {}, str(wt), child=_CAPTURE_CHILD)
    assert git(wt, "cat-file", "-p", f"{trees['git']}:a.txt") == b"one\ntwo\n"
    assert trees["ours"] == trees["git"]


# (value as written in .git/config, None: the name alone) -> git's reading, seen through what `git add` does.
AUTOCRLF_VALUES = [None, "", "true", "TRUE", "yes", "On", "1", "2", "1k", "0x10", "0", "false", "No", "off", "input",
                   "Input", '"input"', "input ; a comment", "maybe", "010", "1_0"]


@pytest.mark.parametrize("value", AUTOCRLF_VALUES)
def test_core_autocrlf_is_read_as_git_reads_it(tmp_path: Path, home: Path, value: str | None) -> None:
    from snapshotd.git.attributes import autocrlf

    git(tmp_path, "init", "-q")
    with open(tmp_path / ".git" / "config", "a") as config:
        config.write("[core]\n\tautocrlf\n" if value is None else f"[core]\n\tautocrlf = {value}\n")
    (tmp_path / "f.txt").write_bytes(CRLF)
    added = subprocess.run(["git", "add", "f.txt"], cwd=tmp_path, capture_output=True, check=False)
    if added.returncode != 0:
        gits = None  # git refuses the value
    else:
        blob = git(tmp_path, "cat-file", "blob", ":f.txt")
        gits = "converts" if blob == b"one\ntwo\n" else "keeps"
    ours = autocrlf(pygit2.Repository(str(tmp_path)).config)
    if ours is None:
        assert value in ("maybe", "010", "1_0"), value  # left to git: refused, or a number only git reads
        return
    assert gits == ("keeps" if ours == "false" else "converts"), (value, ours)


def test_included_config_files_are_found_as_git_resolves_them(tmp_path: Path, home: Path) -> None:
    from snapshotd.git.config import included_files

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").write_text('[include]\n\tpath = "c" # relative to a/\n[core]\n\tpath = not-an-include\n')
    (tmp_path / "a" / "c").write_text(f"[include]\n\tpath = {tmp_path / 'top'}\n")  # a cycle ends
    (tmp_path / "top").write_text(
        '[include] path = a/b\n[includeIf "gitdir:/nowhere/"]\n\tPath = ~/only-if\n[section "include"]\n\tpath = no\n'
    )
    assert sorted(included_files(str(tmp_path / "top"))) == sorted(
        [str(tmp_path / "a" / "b"), str(home / "only-if"), str(tmp_path / "a" / "c"), str(tmp_path / "top")]
    )
    assert included_files(str(tmp_path / "missing")) == []


def test_an_include_of_a_fifo_or_a_device_is_not_read(tmp_path: Path, home: Path) -> None:
    import threading

    from snapshotd.git.config import included_files

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "top").write_text(f"[include]\n\tpath = {tmp_path / 'fifo'}\n[include]\n\tpath = /dev/zero\n")
    found: list[list[str]] = []
    reader = threading.Thread(target=lambda: found.append(included_files(str(tmp_path / "top"))), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading the includes waited on the FIFO"
    assert found == [[str(tmp_path / "fifo"), "/dev/zero"]]  # named, for their stat data, never read
