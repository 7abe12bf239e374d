"""push and fetch between two "machines" (two clones, two SNAPSHOTD_HOMEs, two daemons) through real remotes.

The remotes are a ``git daemon --enable=receive-pack`` on 127.0.0.1 and a
``file://`` bare repository. What must hold: A's checkpoint restores on B
byte for byte; pushes from A and B at once lose nothing; a push after a gc
on A replaces what A pushed; only ``refs/snapshotd/*`` ever changes on the
remote, and only ``refs/snapshotd-remote/*`` here.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import call, child_env, start_daemon
from repo_helpers import git, user_refs, write
from transfer_helpers import Machine, free_port, git_daemon, machine, remote_refs

from snapshotd.errors import SnapshotdError


def _seed(bare: Path, scratch: Path) -> None:
    """A bare repository holding one commit on main (tracked.txt, gone.txt)."""
    git(bare.parent, "init", "-q", "--bare", str(bare))
    seed = scratch / "seed"
    git(scratch, "init", "-q", str(seed))
    write(seed / "tracked.txt", "first\n")
    write(seed / "gone.txt", "to be deleted\n")
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "-m", "seed")
    git(seed, "push", "-q", str(bare), "HEAD:refs/heads/main")


def _content(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root`` but .git: kind, mode and bytes (the link's target for a link)."""
    found: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (Path(folder) == root and d == ".git")]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            else:
                found[rel] = ("file", path.stat().st_mode & 0o777, path.read_bytes())
    return found


def _error(machine_: Machine, method: str, **params: Any) -> SnapshotdError:
    with pytest.raises(SnapshotdError) as caught:
        machine_.call(method, **params)
    return caught.value


def test_a_checkpoint_pushed_by_a_restores_on_b_byte_for_byte_through_git_daemon(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    _seed(served / "shared.git", tmp_path)
    with git_daemon(served) as base_url:
        url = f"{base_url}/shared.git"
        with machine(tmp_path, "a", url) as a, machine(tmp_path, "b", url) as b:
            # A's own branch and tag, which a push must never send (push.followTags asks for tags).
            git(a.repo, "branch", "feature")
            git(a.repo, "tag", "v1")
            git(a.repo, "config", "push.followTags", "true")
            write(a.repo / "tracked.txt", "changed on A\r\n")
            (a.repo / "gone.txt").unlink()
            write(a.repo / "bin.dat", bytes(range(256)) * 3 + b"\0\r\n")
            write(a.repo / "run.sh", "#!/bin/sh\necho hi\n", mode=0o755)
            write(a.repo / "deep" / "er" / "note.md", "deep\n")
            os.symlink("tracked.txt", a.repo / "link")
            made = a.call("checkpoint", session="agent", label="turn 1")["checkpoint"]
            before = remote_refs(url, tmp_path)

            pushed = a.cli("push", "--json").json()  # the branch's upstream, origin
            assert pushed["remote"] == "origin" and pushed["pushed"] == sorted(a.local_refs())
            after = remote_refs(url, tmp_path)
            changed = {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
            assert changed == set(a.local_refs()), "only the worktree's checkpoint refs move"
            assert all(after[name] == oid for name, oid in a.local_refs().items())
            assert a.call("push")["up_to_date"] == sorted(a.local_refs())

            # B fetches with a mirror refspec configured: still nothing but refs/snapshotd-remote/ moves.
            git(b.repo, "config", "--add", "remote.origin.fetch", "+refs/*:refs/*")
            b_refs, b_files = user_refs(b.repo), _content(b.repo)
            fetched = b.cli("fetch", "--json").json()
            assert fetched["fetched"] == [
                "refs/snapshotd-remote/origin/" + name.removeprefix("refs/snapshotd/") for name in sorted(a.local_refs())
            ]
            assert user_refs(b.repo) == b_refs and not b.local_refs()
            listed = b.call("list", remote=True)["checkpoints"]
            assert [(cp["id"], cp["remote"], cp["worktree"], cp["host"]) for cp in listed] == [
                (made["id"], "origin", made["worktree"], "machine-a")
            ]
            assert f"origin machine-a {made['worktree']}" in b.cli("list", "--remote", "origin").stdout
            assert b.call("show", checkpoint=made["id"][:10])["checkpoint"]["remote"] == "origin"
            files = {f["path"]: f["status"] for f in b.call("diff", **{"from": made["id"], "to": "worktree"})["files"]}
            assert files["bin.dat"] == "deleted" and files["gone.txt"] == "added"

            assert b.call("resolve", checkpoint="agent@{origin}")["checkpoint"]["id"] == made["id"]
            assert b.call("resolve", checkpoint="@{origin}")["checkpoint"]["id"] == made["id"]
            short = _error(b, "resolve", checkpoint="agent@{origin}~1")
            assert short.kind == "not_found" and "Session 'agent' fetched from origin holds 1 checkpoint, so" in short.message
            shown = b.cli("show", "agent@{origin}").stdout
            assert made["id"] in shown and f"{made['worktree']} (fetched from origin, taken on machine-a)" in shown

            refused = _error(b, "restore", checkpoint=made["id"])
            assert refused.kind == "worktree_mismatch" and "allow_other_worktree" in refused.message
            assert "fetched from the remote origin" in refused.message
            assert _content(b.repo) == b_files, "a refused restore changes nothing"
            restored = b.call("restore", checkpoint=made["id"], allow_other_worktree=True)
            assert restored["safety_checkpoint"] is not None
            assert _content(b.repo) == _content(a.repo)
            assert user_refs(b.repo) == b_refs


def test_the_newest_session_fetched_is_never_the_safety_checkpoints(tmp_path: Path) -> None:
    bare = tmp_path / "remote.git"
    _seed(bare, tmp_path)
    url = bare.as_uri()
    with machine(tmp_path, "a", url) as a, machine(tmp_path, "b", url) as b:
        write(a.repo / "tracked.txt", "turn 1\n")
        made = a.call("checkpoint", session="agent", label="turn 1")["checkpoint"]
        write(a.repo / "tracked.txt", "after the turn\n")
        safety = a.call("restore", checkpoint=made["id"])["safety_checkpoint"]  # newer than the turn
        a.call("push")
        b.call("fetch")
        assert b.call("resolve", checkpoint="@{origin}")["checkpoint"]["id"] == made["id"]
        assert b.call("resolve", checkpoint="snapshotd:safety@{origin}")["checkpoint"]["id"] == safety["id"]


def test_pushes_from_a_and_b_at_once_lose_nothing_and_a_push_after_gc_replaces_a_s(tmp_path: Path) -> None:
    bare = tmp_path / "remote.git"
    _seed(bare, tmp_path)
    url = bare.as_uri()
    with machine(tmp_path, "a", url) as a, machine(tmp_path, "b", url) as b:
        failures: list[BaseException] = []

        def work(one: Machine) -> None:
            try:
                for turn in range(3):
                    for session in ("s1", "s2"):
                        write(one.repo / f"{session}.txt", f"{one.name} {turn}\n")
                        one.call("checkpoint", session=session)
                    one.call("push")
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(one,)) for one in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        on_remote = {name: oid for name, oid in remote_refs(url, tmp_path).items() if name.startswith("refs/snapshotd/")}
        assert on_remote == a.local_refs() | b.local_refs()
        assert len(on_remote) == 4

        # A drops all but the newest checkpoint of each session: its refs no longer descend from what it pushed.
        pushed_before_gc = a.local_refs()
        assert a.call("gc", keep=1)["deleted"] == 4
        git(a.repo, "gc", "-q", "--prune=now")
        assert a.local_refs() != pushed_before_gc
        assert sorted(a.call("push")["pushed"]) == sorted(a.local_refs())
        on_remote = {name: oid for name, oid in remote_refs(url, tmp_path).items() if name.startswith("refs/snapshotd/")}
        assert on_remote == a.local_refs() | b.local_refs()
        b.call("fetch")
        from_a = [cp for cp in b.call("list", remote="origin")["checkpoints"] if cp.get("remote")]
        assert sorted(cp["id"] for cp in from_a) == sorted(
            cp["id"] for cp in a.call("list")["checkpoints"]
        )


def test_a_push_over_another_machine_s_update_is_refused_until_fetched_and_forced(tmp_path: Path) -> None:
    bare = tmp_path / "remote.git"
    _seed(bare, tmp_path)
    url = bare.as_uri()
    with machine(tmp_path, "a", url) as a:
        a.call("checkpoint", session="s")
        a.call("push")
        # A copy of the clone (same worktree id, same record of the last push) on another machine.
        copy = tmp_path / "a2"
        shutil.copytree(a.repo, copy, symlinks=True)
        home2 = tmp_path / "a2-home"
        daemon2 = start_daemon(tmp_path / "a2-run" / "s.sock", tmp_path / "a2.log", env=child_env(SNAPSHOTD_HOME=str(home2)))
        try:
            a2 = Machine("a2", copy, home2, daemon2)
            write(a.repo / "f.txt", "from a\n")
            from_a = a.call("checkpoint", session="s")["checkpoint"]
            a.call("push")
            write(a2.repo / "f.txt", "from a2\n")
            a2.call("checkpoint", session="s")
            remote_before = remote_refs(url, tmp_path)

            refused = _error(a2, "push")
            assert refused.kind == "git_error" and refused.data["reason"] == "rejected"
            assert "snapshotd fetch" in refused.message and "stale info" in refused.message
            assert remote_refs(url, tmp_path) == remote_before, "a refused push changes nothing"
            line = a2.cli("push", code=1).stderr
            assert line.count("\n") == 1 and "changed since this machine last pushed" in line

            a2.call("fetch")
            assert from_a["id"] in [cp["id"] for cp in a2.call("list", remote=True)["checkpoints"]]
            assert a2.call("push", force=True)["pushed"] == sorted(a2.local_refs())
            assert {n: o for n, o in remote_refs(url, tmp_path).items() if n.startswith("refs/snapshotd/")} == a2.local_refs()
        finally:
            daemon2.kill()


def test_each_failure_of_a_remote_is_one_sentence(tmp_path: Path, daemon: Any) -> None:
    upstream = tmp_path / "upstream.git"
    _seed(upstream, tmp_path)
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", upstream.as_uri(), str(other))
    write(other / "tracked.txt", "second\n")
    git(other, "commit", "-q", "-am", "second")
    git(other, "push", "-q", "origin", "HEAD:main")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", upstream.as_uri(), str(shallow))
    write(shallow / "tracked.txt", "work\n")
    here = {"path": str(shallow)}
    call(daemon.socket, "checkpoint", here)

    def failure(**params: Any) -> SnapshotdError:
        with pytest.raises(SnapshotdError) as caught:
            call(daemon.socket, "push", {**here, **params})
        assert "\n" not in caught.value.message and caught.value.message.endswith(".")
        return caught.value

    closed = failure(remote=f"git://127.0.0.1:{free_port()}/nothing.git")
    assert closed.data["reason"] == "unreachable" and "cannot be reached" in closed.message
    missing = failure(remote=(tmp_path / "no-such.git").as_uri())
    assert missing.data["reason"] == "unreachable"
    empty = tmp_path / "empty.git"
    git(tmp_path, "init", "-q", "--bare", str(empty))
    base = failure(remote=empty.as_uri())
    assert base.data["reason"] == "missing_base" and "shallow" in base.message
    assert remote_refs(empty.as_uri(), tmp_path) == {}
    assert failure(remote="nosuchremote").kind == "not_found"
    assert failure(remote=f"--receive-pack=touch {tmp_path / 'ran'}").code == -32602  # never an option of git's
    assert not (tmp_path / "ran").exists()
    lonely = tmp_path / "lonely"
    git(tmp_path, "init", "-q", str(lonely))
    with pytest.raises(SnapshotdError) as caught:
        call(daemon.socket, "push", {"path": str(lonely)})
    assert caught.value.kind == "not_found" and "snapshotd.remote" in caught.value.message


def test_a_plain_folder_pushes_its_own_store_to_a_url_and_keeps_it(tmp_path: Path, daemon: Any) -> None:
    bare = tmp_path / "plain.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    folder, other = tmp_path / "notes", tmp_path / "elsewhere"
    write(folder / "a.txt", "plain\n")
    other.mkdir()
    made = call(daemon.socket, "checkpoint", {"path": str(folder)})["checkpoint"]
    with pytest.raises(SnapshotdError) as caught:
        call(daemon.socket, "push", {"path": str(folder)})
    assert caught.value.kind == "not_found" and "give REMOTE (a URL) once" in caught.value.message
    first = call(daemon.socket, "push", {"path": str(folder), "remote": bare.as_uri()})
    assert first["pushed"] == [f"refs/snapshotd/{made['worktree']}/default"]
    assert set(remote_refs(bare.as_uri(), tmp_path)) == set(first["pushed"])
    write(folder / "a.txt", "plain, later\n")
    later = call(daemon.socket, "checkpoint", {"path": str(folder)})["checkpoint"]
    assert call(daemon.socket, "push", {"path": str(folder)})["remote"] == bare.as_uri()  # the URL it kept
    call(daemon.socket, "fetch", {"path": str(other), "remote": bare.as_uri()})
    listed = call(daemon.socket, "list", {"path": str(other), "remote": bare.as_uri()})["checkpoints"]
    assert [cp["id"] for cp in listed] == [later["id"], made["id"]]
    call(daemon.socket, "restore", {"checkpoint": later["id"], "path": str(other), "allow_other_worktree": True})
    assert (other / "a.txt").read_bytes() == b"plain, later\n"


def test_a_remote_reference_parses_and_a_session_with_a_colon_is_still_a_session() -> None:
    from snapshotd.contract.refs import RemoteHead, SessionHead, parse_ref

    assert parse_ref("agent@{origin}~2") == RemoteHead("agent@{origin}~2", "origin", parse_ref("agent@").session, 2)
    assert isinstance(parse_ref("@{origin}"), RemoteHead) and parse_ref("@{origin}~").back == 1
    assert isinstance(parse_ref("snapshotd:safety@~1"), SessionHead)


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        ("git@host: Permission denied (publickey).\nfatal: Could not read from remote repository.", "auth"),
        ("remote: Invalid username or password.\nfatal: Authentication failed for 'https://h/r.git/'", "auth"),
        ("fatal: could not read Username for 'https://h': terminal prompts disabled", "auth"),
        ("fatal: unable to access 'https://h/r.git/': Could not resolve host: h", "unreachable"),
        ("ssh: connect to host h port 22: Connection refused\nfatal: Could not read from remote repository.", "unreachable"),
    ],
)
def test_git_s_words_for_a_credential_or_a_network_failure_name_the_case(stderr: str, reason: str) -> None:
    from snapshotd.errors import transfer_error

    error = transfer_error("pushed", "origin", stderr)
    assert error.data["reason"] == reason and "origin" in error.message and "\n" not in error.message


async def test_a_push_whose_git_dies_without_a_report_asks_the_remote_what_it_holds(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapshotd.git import transport
    from snapshotd.git.child import Completed

    bare = tmp_path / "remote.git"
    _seed(bare, tmp_path)
    repo = tmp_path / "clone"
    git(tmp_path, "clone", "-q", bare.as_uri(), str(repo))
    here = {"path": str(repo)}
    real = transport.run_git_completed
    mode = {"push": "run"}

    async def sigpipe_after_push(target: Any, args: list[str], **options: Any) -> Completed:
        """git push ended by SIGPIPE (as send-pack is when receive-pack hangs up first): run it or not, no report."""
        if args[0] != "push" or mode["push"] == "real":
            return await real(target, args, **options)
        if mode["push"] == "run":
            await real(target, args, **options)
        return Completed(("git", *args), -13, b"", b"")

    monkeypatch.setattr(transport, "run_git_completed", sigpipe_after_push)
    await engine.call("checkpoint", here)
    result = await engine.call("push", here)  # the remote took it: a success
    refs = {n: o for n, o in remote_refs(bare.as_uri(), tmp_path).items() if n.startswith("refs/snapshotd/")}
    assert result["pushed"] == sorted(refs) and len(refs) == 1
    (name, value), = refs.items()

    git(tmp_path, "--git-dir", str(bare), "update-ref", name, git(tmp_path, "--git-dir", str(bare), "rev-parse", "main"))
    await engine.call("checkpoint", here)
    mode["push"] = "skip"  # another machine moved the ref, and git dies before it says so
    with pytest.raises(SnapshotdError) as caught:
        await engine.call("push", here)
    assert caught.value.data["reason"] == "rejected" and "snapshotd fetch" in caught.value.message
    mode["push"] = "skip"
    git(tmp_path, "--git-dir", str(bare), "update-ref", name, value)
    with pytest.raises(SnapshotdError) as caught:  # the remote holds the old value: the push did not take
        await engine.call("push", here)
    assert caught.value.data["reason"] == "failed" and "SIGPIPE" in caught.value.message
    assert value == remote_refs(bare.as_uri(), tmp_path)[name]
