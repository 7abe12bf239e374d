"""Another local user gets nothing from snapshotd: not its repositories, not its socket.

(And when something fails unexpectedly, the error says where the details are.)

The tests run as root. Another user's files are made by ``chown`` to uid 65534;
processes of another user are children with privileges dropped by ``setpriv``.
Everything they share lives under a fresh world-writable folder in ``/tmp``
(pytest's own folders are private to root).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from daemon_helpers import answers, assert_one_error_line, child_env, cli, cli_process, wait_until
from repo_helpers import git, init_repo, write

from snapshotd.client.rpc import AsyncClient
from snapshotd.engine.core import Engine
from snapshotd.errors import SnapshotdError

OTHER_UID = 65534
DROP = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def chown_tree(path: Path, uid: int = OTHER_UID) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        os.lchown(dirpath, uid, uid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def plant_repository(parent: Path, marker: Path, *, object_format: str = "sha1") -> Path:
    """Another user's repository at ``parent/.git`` whose ``core.fsmonitor`` program writes ``marker``."""
    git(parent, "init", "-q", f"--object-format={object_format}", ".")
    script = parent / "fsmonitor.sh"
    write(script, f"#!/bin/sh\necho ran >> {marker}\nexit 1\n", mode=0o755)
    git(parent, "config", "core.fsmonitor", str(script))
    git(parent, "config", "core.untrackedCache", "false")
    chown_tree(parent / ".git")
    os.lchown(script, OTHER_UID, OTHER_UID)
    make_world_writable(parent / ".git")
    return parent / ".git"


def make_world_writable(path: Path) -> None:
    """What a careless or hostile owner does: everyone may write, so nothing stops a writer there."""
    for dirpath, _, filenames in os.walk(path):
        os.chmod(dirpath, 0o777)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o666)


async def checkpoint_refused(engine: Engine, path: Path) -> SnapshotdError:
    """Checkpointing ``path`` fails as untrusted, with git's remedy in its sentence."""
    with pytest.raises(SnapshotdError) as refused:
        await engine.call("checkpoint", {"path": str(path)})
    assert refused.value.kind == "untrusted", refused.value
    assert "git config --global --add safe.directory" in refused.value.message
    return refused.value


def object_files(git_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(git_dir)) for p in (git_dir / "objects").rglob("*") if p.is_file())


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
async def test_a_repository_planted_above_by_another_user_is_refused(
    engine: Engine, shared: Path, tmp_path: Path, object_format: str
) -> None:
    marker = tmp_path / "fsmonitor-ran"
    planted = plant_repository(shared, marker, object_format=object_format)
    project = shared / "myproject"
    write(project / "secret.txt", "mine\n", mode=0o600)
    objects_before = object_files(planted)
    refused = await checkpoint_refused(engine, project)
    message = refused.message
    assert f"git config --global --add safe.directory {shared}" in message
    assert f"uid {OTHER_UID}" in message
    assert not marker.exists(), "the other user's core.fsmonitor program ran"
    assert object_files(planted) == objects_before
    assert not (planted / "snapshotd").exists()


def test_the_command_line_names_the_owner_and_the_remedy(shared: Path, tmp_path: Path) -> None:
    marker = tmp_path / "fsmonitor-ran"
    plant_repository(shared, marker)
    project = shared / "myproject"
    write(project / "a.txt", "a\n")
    result = cli_process("--embedded", "checkpoint", project, code=None)
    line = assert_one_error_line(result, "safe.directory", str(shared), f"uid {OTHER_UID}")
    assert "unexpectedly" not in line
    assert not marker.exists()


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
async def test_safe_directory_in_the_users_own_config_allows_it(
    engine: Engine, shared: Path, tmp_path: Path, object_format: str
) -> None:
    marker = tmp_path / "fsmonitor-ran"
    plant_repository(shared, marker, object_format=object_format)
    git(tmp_path, "config", "--global", "--add", "safe.directory", str(shared))
    write(shared / "myproject" / "a.txt", "a\n")
    result = await engine.call("checkpoint", {"path": str(shared / "myproject")})
    assert result["checkpoint"]["worktree"].startswith("wt_")


async def test_safe_directory_in_the_repository_config_does_not_count(
    engine: Engine, shared: Path, tmp_path: Path
) -> None:
    planted = plant_repository(shared, tmp_path / "fsmonitor-ran")
    with open(planted / "config", "a") as config:
        config.write(f"[safe]\n\tdirectory = *\n\tdirectory = {shared}\n")
    write(shared / "myproject" / "a.txt", "a\n")
    await checkpoint_refused(engine, shared / "myproject")


async def test_an_empty_safe_directory_entry_clears_the_ones_before(
    engine: Engine, shared: Path, tmp_path: Path
) -> None:
    plant_repository(shared, tmp_path / "fsmonitor-ran")
    git(tmp_path, "config", "--global", "--add", "safe.directory", "*")
    git(tmp_path, "config", "--global", "--add", "safe.directory", "")
    write(shared / "myproject" / "a.txt", "a\n")
    await checkpoint_refused(engine, shared / "myproject")


async def test_root_trusts_the_user_sudo_names_as_git_does(
    engine: Engine, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = init_repo(shared / "repo", ("a.txt", "a\n"))
    expected = git(repo, "write-tree")
    chown_tree(repo)
    monkeypatch.setenv("SUDO_UID", str(OTHER_UID + 1))
    await checkpoint_refused(engine, repo)
    monkeypatch.setenv("SUDO_UID", str(OTHER_UID))
    result = await engine.call("checkpoint", {"path": str(repo)})
    assert result["checkpoint"]["tree"] == expected


def test_an_unprivileged_user_refuses_roots_repository_above(shared: Path) -> None:
    """The rule from the other side: uid 65534 checkpointing under a ``.git`` that root planted."""
    marker = shared / "fsmonitor-ran"
    plant_repository(shared, marker)
    chown_tree(shared / ".git", 0)
    os.lchown(shared / "fsmonitor.sh", 0, 0)
    home = shared / "home"
    project = shared / "myproject"
    write(project / "a.txt", "a\n")
    for folder in (home, project):
        chown_tree(folder)
    env = child_env(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), SNAPSHOTD_HOME=str(home / "sd"))
    env.pop("XDG_RUNTIME_DIR")
    proc = subprocess.run(
        [*DROP, sys.executable, "-m", "snapshotd", "--embedded", "checkpoint", str(project)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc
    assert "safe.directory" in proc.stderr and "uid 0" in proc.stderr, proc.stderr
    assert not marker.exists()


# --- snapshotd's own folders inside a repository ------------------------------------


def victim_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder of the user's with files, some named as snapshotd names its own."""
    victim = tmp_path / "victim"
    files = {
        "notes.txt": b"keep me\n",
        "cookie-1-2-abcdef": b"named like a cookie\n",
        "index-999999999-x": b"named like a stale index\n",
    }
    for name, data in files.items():
        write(victim / name, data)
    return victim, files


def folder_contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


async def test_a_symlinked_cookie_folder_is_never_emptied(watched_engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    victim, files = victim_folder(tmp_path)
    (repo / ".git" / "snapshotd").mkdir()
    (repo / ".git" / "snapshotd" / "cookies").symlink_to(victim)
    result = await watched_engine.call("checkpoint", {"path": str(repo)})
    assert result["checkpoint"]["tree"] == git(repo, "write-tree")
    assert folder_contents(victim) == files
    opened = await watched_engine.call("open", {"path": str(repo)})
    assert "cookies" in (opened["worktree"]["watch_error"] or ""), opened


async def test_another_users_cookie_folder_is_refused(watched_engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    cookies = repo / ".git" / "snapshotd" / "cookies"
    write(cookies / "cookie-9-9-planted", "x")
    chown_tree(cookies)
    await watched_engine.call("checkpoint", {"path": str(repo)})
    assert (cookies / "cookie-9-9-planted").exists()
    opened = await watched_engine.call("open", {"path": str(repo)})
    assert f"uid {OTHER_UID}" in (opened["worktree"]["watch_error"] or ""), opened


@pytest.mark.parametrize("folder", ["tmp", "journal"])
async def test_a_symlinked_temporary_or_journal_folder_is_refused(engine, tmp_path: Path, folder: str) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    victim, files = victim_folder(tmp_path)
    state = repo / ".git" / "snapshotd"
    if folder == "tmp":  # in place before the worktree is first opened, which clears stale indexes
        state.mkdir()
        method, params = "checkpoint", {"path": str(repo)}
    else:
        first = await engine.call("checkpoint", {"path": str(repo)})
        shutil.rmtree(state / folder, ignore_errors=True)
        method, params = "restore", {"checkpoint": first["checkpoint"]["id"], "yes": True}
    (state / folder).symlink_to(victim)
    write(repo / "a.txt", "changed\n")
    with pytest.raises(SnapshotdError) as refused:
        await engine.call(method, params)
    assert refused.value.kind == "untrusted"
    assert "symlink" in refused.value.message
    assert folder_contents(victim) == files
    assert (repo / "a.txt").read_text() == "changed\n"


# --- the socket: the command line talks only to this user's daemon -----------------

FAKE_DAEMON = r"""
import os, socket, sys
where, record = sys.argv[1], sys.argv[2]
if where.isdigit():
    server = socket.socket(fileno=int(where))
else:
    os.makedirs(os.path.dirname(where), mode=0o755, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(where)
    os.chmod(where, 0o666)
server.listen()
print("ready", flush=True)
server.settimeout(60)
with open(record, "ab") as out:
    while True:
        connection, _ = server.accept()
        connection.settimeout(2)
        try:
            data = connection.recv(65536)
        except TimeoutError:
            data = b""
        out.write(data)
        out.flush()
        if data:
            connection.sendall(b'{"jsonrpc": "2.0", "id": 1, "result": {"saved": true}}\n')
        connection.close()
"""


@contextmanager
def fake_daemon(where: str, record: Path, pass_fds: tuple[int, ...] = ()) -> Iterator[None]:
    """Another user's program listening on a socket, keeping what it receives in ``record``."""
    proc = subprocess.Popen(
        [*DROP, sys.executable, "-c", FAKE_DAEMON, where, str(record)],
        stdout=subprocess.PIPE,
        pass_fds=pass_fds,
        cwd="/",
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def received(record: Path) -> bytes:
    return record.read_bytes() if record.exists() else b""


def test_a_socket_folder_another_user_prepared_is_refused(shared: Path, tmp_path: Path) -> None:
    runtime = shared / "run"
    runtime.mkdir()
    os.chown(runtime, OTHER_UID, OTHER_UID)
    record = shared / "received"
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    with fake_daemon(str(runtime / "snapshotd" / "snapshotd.sock"), record):
        result = cli_process(
            "checkpoint", repo, "-m", "secret label", env=child_env(XDG_RUNTIME_DIR=str(runtime)), code=None
        )
    assert_one_error_line(result, "Refusing the socket folder", f"uid {OTHER_UID}")
    assert received(record) == b""
    assert sorted(os.listdir(runtime / "snapshotd")) == ["snapshotd.sock"]


async def test_a_listener_of_another_user_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    path = folder / "snapshotd.sock"
    record = Path(tempfile.mkdtemp(prefix="snapshotd-record-")) / "received"
    record.parent.chmod(0o1777)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        os.chmod(path, 0o666)
        # The other user calls listen(), so SO_PEERCRED names that user.
        with fake_daemon(str(server.fileno()), record, pass_fds=(server.fileno(),)):
            result = cli_process("checkpoint", tmp_path, env=child_env(path), code=None)
            with pytest.raises(PermissionError, match="another user"):
                async with AsyncClient.connect(str(path)) as client:
                    await client.call("ping")
    assert_one_error_line(result, "Refusing the daemon", f"uid {OTHER_UID}", "nothing was sent")
    assert received(record) == b""
    shutil.rmtree(record.parent)


def test_a_planted_log_symlink_is_not_followed(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    (runtime / "snapshotd").mkdir(parents=True, mode=0o700)
    runtime.chmod(0o700)
    target = write(tmp_path / "precious.txt", "precious\n", mode=0o644)
    (runtime / "snapshotd" / "snapshotd.log").symlink_to(target)
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    result = cli_process("checkpoint", repo, env=child_env(XDG_RUNTIME_DIR=str(runtime)), code=None)
    assert_one_error_line(result, "Refusing the log", "symlink")
    assert target.read_text() == "precious\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert not (runtime / "snapshotd" / "snapshotd.sock").exists()


def test_a_daemon_of_another_user_refuses_root(shared: Path) -> None:
    """SO_PEERCRED on the daemon's side: even root is not its user unless --allow-root."""
    home = shared / "home"
    home.mkdir()
    os.chown(home, OTHER_UID, OTHER_UID)
    path = home / "run" / "snapshotd.sock"
    env = child_env(HOME=str(home), SNAPSHOTD_HOME=str(home / "sd"), XDG_CONFIG_HOME=str(home / ".config"))
    proc = subprocess.Popen(
        [*DROP, sys.executable, "-m", "snapshotd", "serve", "--socket", str(path)],
        env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: answers(path), 30, "the other user's daemon to listen")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(path))
            sock.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n')
            reply = sock.recv(65536)
    finally:
        proc.terminate()
        proc.wait(15)
    assert b"uid 0 is refused" in reply, reply
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_the_autostarted_daemon_keeps_its_files_private(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    env = child_env(XDG_RUNTIME_DIR=str(runtime))
    first = cli_process("--json", "checkpoint", repo, env=env).json()
    write(repo / "a.txt", "b\n")
    cli_process("--json", "restore", first["checkpoint"]["id"], "--yes", cwd=repo, env=env)
    cli_process("stop", env=env)
    home = Path(os.environ["SNAPSHOTD_HOME"])
    state = repo / ".git" / "snapshotd"
    assert _mode(runtime / "snapshotd") == 0o700
    assert _mode(runtime / "snapshotd" / "snapshotd.log") == 0o600
    assert _mode(home) == 0o700
    assert _mode(home / "worktrees.json") == 0o600
    assert _mode(state / "cookies") == 0o700
    assert _mode(state / "journal") == 0o700


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- internal errors say where their details are -------------------------------------

_INTERNAL_MESSAGE = (
    "from snapshotd.server.dispatch import internal_error; "
    "print(internal_error('checkpoint', RuntimeError('x')).message)"
)


def _message_with_stderr_at(log: Path, **env: str) -> str:
    with open(log, "ab") as stderr:
        proc = subprocess.run(
            [sys.executable, "-c", _INTERNAL_MESSAGE],
            stderr=stderr, stdout=subprocess.PIPE, text=True, env=child_env(**env), check=True,
        )
    return proc.stdout.strip()


def test_an_internal_error_names_the_daemons_log_file(tmp_path: Path) -> None:
    log = tmp_path / "snapshotd.log"
    message = _message_with_stderr_at(log)
    assert message.endswith(f"its log has the details: {log}."), message
    info = log.stat()
    under_systemd = _message_with_stderr_at(log, JOURNAL_STREAM=f"{info.st_dev}:{info.st_ino}")
    assert "journalctl --user -u snapshotd" in under_systemd


def test_an_embedded_internal_error_keeps_its_traceback_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self, method, params=None, session=None):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(Engine, "call", broken)
    result = cli("--embedded", "checkpoint", tmp_path, code=None)
    log = Path(os.environ["SNAPSHOTD_HOME"]) / "embedded.log"
    assert_one_error_line(result, "injected fault", str(log))
    text = log.read_text()
    assert "Traceback" in text and "RuntimeError: injected fault" in text
    assert _mode(log) == 0o600


async def test_repair_runs_no_git_in_a_moved_repository_another_user_owns(engine, tmp_path: Path) -> None:
    main = init_repo(tmp_path / "project" / "main", ("m.txt", "m\n"))
    linked = tmp_path / "project" / "linked"
    git(main, "worktree", "add", "-q", "-b", "feature", str(linked))
    await engine.call("open", {"path": str(linked)})
    os.rename(tmp_path / "project", tmp_path / "renamed")
    chown_tree(tmp_path / "renamed")
    new_linked = tmp_path / "renamed" / "linked"
    link_before = (new_linked / ".git").read_text()
    with pytest.raises(SnapshotdError) as refused:
        await engine.call("repair", {"path": str(new_linked)})
    assert refused.value.kind == "untrusted"
    assert "safe.directory" in refused.value.message
    assert (new_linked / ".git").read_text() == link_before
