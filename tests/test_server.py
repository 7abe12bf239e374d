"""The socket server, end to end, against an in-memory fake service."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import warnings
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from snapshotd.client.rpc import AsyncClient, Client, connect_or_none
from snapshotd.contract.framing import LineBuffer, encode_message, is_blank
from snapshotd.contract.peers import peer_allowed, peer_credentials
from snapshotd.errors import Busy, InternalError, InvalidRequest, MethodNotFound, NotFound
from snapshotd.server.binding import systemd_listen_fd
from snapshotd.server.dispatch import Session
from snapshotd.server.listener import serve

NODE = shutil.which("node")
TESTS = Path(__file__).parent
MiB = 1024 * 1024


class FakeService:
    """An in-memory service with methods that sleep, fail, stream and stop."""

    def __init__(self) -> None:
        self.active = 0
        self.cancelled = 0
        self.subscribers: dict[str, Session] = {}
        self.stopped = trio.Event()
        self._next_subscription = 0

    async def call(
        self, method: str, params: dict[str, Any], session: Session | None
    ) -> dict[str, Any]:
        self.active += 1
        try:
            return await self._call(method, params, session)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _call(
        self, method: str, params: dict[str, Any], session: Session | None
    ) -> dict[str, Any]:
        if method == "echo":
            return {"params": params}
        if method == "sleep":
            await trio.sleep(params["s"])
            return {"slept": params["s"]}
        if method == "boom":
            raise RuntimeError("kaboom")
        if method == "fail":
            raise NotFound("No checkpoint matches 'abc1234'.", ref="abc1234")
        if method == "subscribe":
            assert session is not None
            self._next_subscription += 1
            subscription = f"sub{self._next_subscription}"
            self.subscribers[subscription] = session
            session.on_close(lambda: self.subscribers.pop(subscription, None))
            return {"subscription": subscription}
        if method == "emit":
            count = params.get("count", 1)
            refused = 0
            for subscription, subscriber in list(self.subscribers.items()):
                for index in range(count):
                    sent = await subscriber.notify(
                        "changed",
                        {
                            "subscription": subscription,
                            "paths": params.get("paths", [f"file{index}"]),
                            "overflow": False,
                        },
                        fallback={"subscription": subscription, "dropped": True},
                    )
                    if not sent:
                        refused += 1
                        break
            return {"subscribers": len(self.subscribers), "refused": refused}
        if method == "shutdown":
            self.stopped.set()
            return {}
        raise MethodNotFound(f"There is no method {method!r}.")


@dataclass
class Daemon:
    service: FakeService
    path: str


async def start(nursery: trio.Nursery, path: Path | str, **options: Any) -> Daemon:
    service = FakeService()
    started = await nursery.start(partial(serve, service, str(path), **options))
    assert started == str(path)
    return Daemon(service, str(path))


@pytest.fixture
async def daemon(nursery: trio.Nursery, tmp_path: Path) -> Daemon:
    return await start(nursery, tmp_path / "run" / "snapshotd.sock")


class Raw:
    """A bare trio socket client that sends bytes and reads lines."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = LineBuffer(64 * MiB)
        self._lines: deque[bytes] = deque()

    @classmethod
    async def connect(cls, path: str) -> Raw:
        return cls(await trio.open_unix_socket(path))

    async def send(self, *messages: bytes | dict[str, Any]) -> None:
        data = b"".join(m if isinstance(m, bytes) else encode_message(m) for m in messages)
        await self.stream.send_all(data)

    async def line(self) -> bytes | None:
        """The next line, or None at end of stream."""
        while not self._lines:
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                return None
            self._lines.extend(self._buffer.feed(data))
        return self._lines.popleft()

    async def json(self) -> dict[str, Any]:
        line = await self.line()
        assert line is not None, "the server closed the connection"
        return json.loads(line)

    async def aclose(self) -> None:
        await self.stream.aclose()


def req(method: str, params: dict[str, Any] | None = None, id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def count_tasks() -> int:
    def walk(task: trio.lowlevel.Task) -> int:
        return 1 + sum(
            walk(child) for nursery in task.child_nurseries for child in nursery.child_tasks
        )

    return walk(trio.lowlevel.current_root_task())


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


async def eventually(predicate: Any, timeout: float = 5) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


# --------------------------------------------------------------------------
# The socket file.


async def test_socket_folder_is_0700_and_socket_0600(daemon: Daemon) -> None:
    folder = os.path.dirname(daemon.path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    info = os.lstat(daemon.path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600


async def test_socket_file_is_removed_on_exit(tmp_path: Path) -> None:
    path = tmp_path / "s" / "d.sock"
    async with trio.open_nursery() as nursery:
        await start(nursery, path)
        assert path.exists()
        nursery.cancel_scope.cancel()
    assert not path.exists()


async def test_unsafe_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    with pytest.raises(PermissionError, match="other users may write"):
        await serve(FakeService(), str(folder / "d.sock"))
    assert not (folder / "d.sock").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder owned by another uid needs root")
async def test_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        await serve(FakeService(), str(folder / "d.sock"))


async def test_stale_socket_is_replaced(nursery: trio.Nursery, tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    path = folder / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening: connecting is refused
    assert stat.S_ISSOCK(path.lstat().st_mode)
    daemon = await start(nursery, path)
    async with AsyncClient.connect(daemon.path) as client:
        assert await client.call("echo", a=1) == {"params": {"a": 1}}


async def test_live_daemon_is_not_replaced(daemon: Daemon) -> None:
    before = os.lstat(daemon.path)
    with pytest.raises(Busy, match="already serving"):
        await serve(FakeService(), daemon.path)
    after = os.lstat(daemon.path)
    assert (before.st_ino, before.st_dev) == (after.st_ino, after.st_dev)
    async with AsyncClient.connect(daemon.path) as client:
        assert await client.call("echo") == {"params": {}}


async def test_socket_someone_listens_on_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    path = folder / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(path))
        other.listen()
        with pytest.raises(Busy, match="already serving"):
            await serve(FakeService(), str(path))
        assert path.exists()


async def test_a_file_in_the_way_is_not_removed(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    path = folder / "d.sock"
    path.write_text("precious")
    with pytest.raises(FileExistsError, match="not a socket"):
        await serve(FakeService(), str(path))
    assert path.read_text() == "precious"


# --------------------------------------------------------------------------
# Peer credentials.


def test_peer_allowed_predicate() -> None:
    assert peer_allowed(1000, 1000)
    assert not peer_allowed(1001, 1000)
    assert not peer_allowed(0, 1000)
    assert peer_allowed(0, 1000, allow_root=True)
    assert not peer_allowed(1001, 1000, allow_root=True)
    assert peer_allowed(0, 0)


@pytest.mark.needs("peercred")
async def test_peer_credentials_of_a_real_connection(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(daemon.path)
        pid, uid, gid = peer_credentials(sock)
    assert (pid, uid, gid) == (os.getpid(), os.geteuid(), os.getegid())


def _connect_as_nobody(path: str, write_fd: int) -> None:
    """In a forked child: become uid 65534, connect, report what the daemon said."""
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(path)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        os.write(write_fd, data or b"<eof>")
    except BaseException as exc:
        os.write(write_fd, f"<child failed: {exc!r}>".encode())
    finally:
        os._exit(0)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


@pytest.mark.skipif(
    os.geteuid() != 0, reason="connecting as another uid needs root to setuid in a child"
)
@pytest.mark.needs("peercred")
async def test_other_uid_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    # The socket must be reachable by uid 65534 for the daemon's own check to
    # be what refuses it, so this loosens the modes that normally stop it.
    folder = tempfile.mkdtemp(prefix="snapshotd-peer-", dir="/tmp")
    try:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "d.sock")
        async with trio.open_nursery() as nursery:
            daemon = await start(nursery, path)
            os.chmod(path, 0o666)
            read_fd, write_fd = os.pipe()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.close(read_fd)
                _connect_as_nobody(path, write_fd)
            os.close(write_fd)
            with caplog.at_level(logging.WARNING), trio.fail_after(20):
                data = await trio.to_thread.run_sync(_read_all, read_fd)
                _, status = await trio.to_thread.run_sync(os.waitpid, pid, 0)
            assert status == 0
            response = json.loads(data.splitlines()[0])
            assert response["id"] is None
            assert response["error"]["code"] == -32600
            assert "uid 65534" in response["error"]["message"]
            assert daemon.service.active == 0
            assert any("refused" in record.getMessage() for record in caplog.records)
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------
# Systemd socket activation.


async def test_socket_activation_uses_the_passed_fd(nursery: trio.Nursery, tmp_path: Path) -> None:
    path = tmp_path / "activated.sock"
    pre = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pre.bind(str(path))
    pre.listen()
    fd = pre.detach()
    async with trio.open_nursery() as inner:
        daemon = await start(inner, path, listen_fd=fd)
        async with AsyncClient.connect(daemon.path) as client:
            assert await client.call("echo", via="systemd") == {"params": {"via": "systemd"}}
        inner.cancel_scope.cancel()
    assert path.exists(), "the socket file belongs to systemd and must stay"


async def test_socket_activation_refuses_a_non_unix_fd() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as inet:
        with pytest.raises(ValueError, match="not a Unix stream socket"):
            await serve(FakeService(), "/unused", listen_fd=inet.fileno())
        inet.getsockname()  # still open: the fd was left to its owner


def test_systemd_listen_fd_from_environment() -> None:
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "snapshotd"}
    assert systemd_listen_fd(env) == 3
    assert env == {}
    assert systemd_listen_fd({"LISTEN_PID": "1", "LISTEN_FDS": "1"}) is None
    assert systemd_listen_fd({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}) is None
    assert systemd_listen_fd({"LISTEN_PID": "x", "LISTEN_FDS": "1"}) is None
    assert systemd_listen_fd({}) is None


# --------------------------------------------------------------------------
# Bad input.


async def test_bad_messages_get_errors_and_the_connection_stays(daemon: Daemon) -> None:
    raw = await Raw.connect(daemon.path)
    cases: list[tuple[bytes, int, Any]] = [
        (b"{not json", -32700, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":"\xff"}}', -32700, None),
        (b"[1,2,3]", -32600, None),
        (b'{"jsonrpc":"2.0","id":2,"method":7}', -32600, 2),
        (b'{"jsonrpc":"2.0","id":3,"method":"echo","params":[1]}', -32600, 3),
        (b'{"jsonrpc":"2.0","id":false,"method":"echo"}', -32600, None),
        (b'{"jsonrpc":"2.0","id":4,"method":"no_such_method"}', -32601, 4),
        (b'{"jsonrpc":"2.0","id":5,"method":"boom"}', -32603, 5),
        (b'{"jsonrpc":"2.0","id":6,"method":"fail"}', -32000, 6),
    ]
    for line, code, request_id in cases:
        await raw.send(line + b"\n")
        response = await raw.json()
        assert response["error"]["code"] == code, line
        assert response["id"] == request_id
    await raw.send(b"\n  \n", req("echo", {"still": "here"}, id="last"))
    assert await raw.json() == {
        "jsonrpc": "2.0",
        "id": "last",
        "result": {"params": {"still": "here"}},
    }
    await raw.aclose()


async def test_handler_exception_is_an_internal_error_and_logged(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        async with AsyncClient.connect(daemon.path) as client:
            with pytest.raises(InternalError, match="RuntimeError") as excinfo:
                await client.call("boom")
            assert "\n" not in excinfo.value.message
            assert await client.call("echo") == {"params": {}}
    assert any(record.exc_info for record in caplog.records)


async def test_random_garbage(daemon: Daemon) -> None:
    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(garbage=st.binary(max_size=300) | st.lists(st.binary(max_size=40)).map(b"\n".join))
    def check(garbage: bytes) -> None:
        expected = sum(1 for line in garbage.split(b"\n") if not is_blank(line))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(daemon.path)
            sock.sendall(garbage + b"\n" + encode_message(req("echo", id="final")))
            buffer = LineBuffer()
            responses: list[dict[str, Any]] = []
            while len(responses) < expected + 1:
                data = sock.recv(65536)
                assert data, "the daemon closed the connection"
                responses.extend(json.loads(line) for line in buffer.feed(data))
        # Responses may come in any order; the echo is the only success.
        finals = [r for r in responses if r.get("id") == "final"]
        errors = [r for r in responses if r.get("id") != "final"]
        assert [r["result"] for r in finals] == [{"params": {}}]
        assert len(errors) == expected
        for response in errors:
            assert response["jsonrpc"] == "2.0"
            assert response["error"]["code"] in (-32700, -32600, -32601)

    with trio.fail_after(120):
        await trio.to_thread.run_sync(check)
    assert daemon.service.active == 0


async def test_long_line_is_refused_and_the_connection_closed(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    daemon = await start(nursery, tmp_path / "s" / "d.sock", line_limit=1000)
    raw = await Raw.connect(daemon.path)
    await raw.send(req("echo", id=1), b"x" * 1001 + b"\n", req("echo", id=2))
    # The request before the long line is still answered; nothing after it is read.
    responses = {r["id"]: r for r in (await raw.json(), await raw.json())}
    assert sorted(responses, key=str) == [1, None]
    assert responses[1]["result"] == {"params": {}}
    refused = responses[None]
    assert refused["error"]["code"] == -32600
    assert "longer than the limit of 1000 bytes" in refused["error"]["message"]
    assert await raw.line() is None
    await raw.aclose()
    async with AsyncClient.connect(daemon.path) as client:
        assert await client.call("echo") == {"params": {}}


async def test_64_mib_line_without_newline_keeps_memory_bounded(daemon: Daemon) -> None:
    chunk = b"x" * MiB
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        peak_field = "VmHWM"
    except OSError:
        peak_field = "VmRSS"
    baseline = status_kib("VmRSS")
    peak = baseline
    sent = 0

    async def watch_memory() -> None:
        nonlocal peak
        while True:
            peak = max(peak, status_kib("VmRSS"))
            await trio.sleep(0.005)

    raw = await Raw.connect(daemon.path)

    async def flood() -> None:
        nonlocal sent
        try:
            while sent < 64 * MiB:
                await raw.stream.send_all(chunk)
                sent += len(chunk)
        except trio.BrokenResourceError:
            pass

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_memory)
            nursery.start_soon(flood)
            refused = await raw.json()
            assert await raw.line() is None  # closed
            nursery.cancel_scope.cancel()
    await raw.aclose()
    peak = max(peak, status_kib(peak_field))
    assert refused["id"] is None
    assert refused["error"]["code"] == -32600
    assert 16 * MiB <= sent < 64 * MiB, "the daemon should stop reading soon after the limit"
    assert (peak - baseline) * 1024 < 100 * MiB, f"RSS grew by {(peak - baseline) // 1024} MiB"
    async with AsyncClient.connect(daemon.path) as client:
        assert await client.call("echo") == {"params": {}}


# --------------------------------------------------------------------------
# Concurrency.


async def test_pipelined_responses_come_back_out_of_order(daemon: Daemon) -> None:
    raw = await Raw.connect(daemon.path)
    await raw.send(req("sleep", {"s": 0.2}, id=1), req("echo", {"n": 2}, id=2))
    first, second = await raw.json(), await raw.json()
    assert first == {"jsonrpc": "2.0", "id": 2, "result": {"params": {"n": 2}}}
    assert second == {"jsonrpc": "2.0", "id": 1, "result": {"slept": 0.2}}
    await raw.aclose()


async def test_client_notifications_get_no_response(daemon: Daemon) -> None:
    raw = await Raw.connect(daemon.path)
    await raw.send(
        {"jsonrpc": "2.0", "method": "echo"},
        {"jsonrpc": "2.0", "method": "no_such_method"},
        req("echo", id="after"),
    )
    assert (await raw.json())["id"] == "after"
    await raw.aclose()


async def test_36_concurrent_clients(daemon: Daemon) -> None:
    results: dict[int, list[dict[str, Any]]] = {}

    async def one_client(index: int) -> None:
        async with AsyncClient.connect(daemon.path) as client, trio.open_nursery() as calls:
            out: list[dict[str, Any]] = [{}] * 5

            async def one_call(n: int) -> None:
                if n % 2:
                    await client.call("sleep", s=0.01 * n)
                out[n] = await client.call("echo", client=index, n=n)

            for n in range(5):
                calls.start_soon(one_call, n)
        results[index] = out

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for index in range(36):
                nursery.start_soon(one_client, index)
    assert sorted(results) == list(range(36))
    for index, out in results.items():
        assert out == [{"params": {"client": index, "n": n}} for n in range(5)]


async def test_abandoned_requests_leave_nothing_behind(daemon: Daemon) -> None:
    await trio.sleep(0.05)
    gc.collect()  # an earlier test's garbage closing its descriptors meanwhile is not this test's
    fds, tasks = open_fds(), count_tasks()
    raw = await Raw.connect(daemon.path)
    await raw.send(*(req("sleep", {"s": 60}, id=n) for n in range(200)))
    await eventually(lambda: daemon.service.active == 200)
    assert count_tasks() > tasks + 200
    await raw.aclose()
    await eventually(lambda: daemon.service.active == 0)
    assert daemon.service.cancelled == 200
    await eventually(lambda: open_fds() == fds and count_tasks() == tasks)


async def test_half_closed_client_still_gets_its_answers(daemon: Daemon) -> None:
    raw = await Raw.connect(daemon.path)
    await raw.send(req("sleep", {"s": 0.1}, id=1), req("echo", id=2))
    await raw.stream.send_eof()
    ids = {(await raw.json())["id"], (await raw.json())["id"]}
    assert ids == {1, 2}
    assert await raw.line() is None
    await raw.aclose()


async def test_last_line_without_newline_is_answered_after_half_close(daemon: Daemon) -> None:
    raw = await Raw.connect(daemon.path)
    await raw.send(encode_message(req("echo", id=9)).rstrip(b"\n"))
    await raw.stream.send_eof()
    assert (await raw.json())["id"] == 9
    await raw.aclose()


async def test_too_many_requests_in_flight_are_busy(nursery: trio.Nursery, tmp_path: Path) -> None:
    daemon = await start(nursery, tmp_path / "s" / "d.sock", max_in_flight=2)
    raw = await Raw.connect(daemon.path)
    await raw.send(*(req("sleep", {"s": 0.2}, id=n) for n in range(3)))
    busy = await raw.json()
    assert busy["id"] == 2
    assert busy["error"]["code"] == -32000
    assert busy["error"]["data"] == {"kind": "busy", "retry_after_ms": 50}
    assert {(await raw.json())["id"], (await raw.json())["id"]} == {0, 1}
    await raw.send(req("echo", id=3))
    assert (await raw.json())["id"] == 3
    await raw.aclose()


# --------------------------------------------------------------------------
# Notifications and sessions.


async def test_subscribe_notifications_and_close_callbacks(daemon: Daemon) -> None:
    async with AsyncClient.connect(daemon.path) as subscriber:
        subscription = (await subscriber.call("subscribe"))["subscription"]
        async with AsyncClient.connect(daemon.path) as other:
            assert await other.call("emit", count=3) == {"subscribers": 1, "refused": 0}
        notes = []
        with trio.fail_after(5):
            async for note in subscriber.notifications():
                notes.append(note)
                if len(notes) == 3:
                    break
        assert notes == [
            {
                "method": "changed",
                "params": {"subscription": subscription, "paths": [f"file{n}"], "overflow": False},
            }
            for n in range(3)
        ]
    await eventually(lambda: daemon.service.subscribers == {})


async def test_a_subscriber_that_does_not_read_gets_a_drop_notice_not_a_buffer(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = await start(nursery, tmp_path / "s" / "d.sock", notification_bytes=256 * 1024)
    raw = await Raw.connect(daemon.path)
    await raw.send(req("subscribe"))
    subscription = (await raw.json())["result"]["subscription"]
    big = ["p" * 1000] * 100  # about 100 KB a notification: 20 MB in all
    with caplog.at_level(logging.WARNING), trio.fail_after(10):
        async with AsyncClient.connect(daemon.path) as other:
            assert await other.call("emit", count=200, paths=big) == {"subscribers": 1, "refused": 1}
    assert any("notifications behind" in record.getMessage() for record in caplog.records)
    received = []
    with trio.fail_after(10):
        while not received or "dropped" not in received[-1]["params"]:
            received.append(await raw.json())
    assert received[-1] == {
        "jsonrpc": "2.0",
        "method": "changed",
        "params": {"subscription": subscription, "dropped": True},
    }
    assert len(received) < 200
    await raw.send(req("echo", {"still": "here"}, id=9))  # the connection itself stays
    assert (await raw.json())["result"] == {"params": {"still": "here"}}
    await raw.aclose()


async def test_shutdown_answers_before_the_daemon_stops(tmp_path: Path) -> None:
    path = tmp_path / "s" / "d.sock"
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            daemon = await start(nursery, path)
            raw = await Raw.connect(daemon.path)
            await raw.send(req("shutdown", id="bye"))
            await daemon.service.stopped.wait()
            nursery.cancel_scope.cancel()
        assert await raw.json() == {"jsonrpc": "2.0", "id": "bye", "result": {}}
        assert await raw.line() is None
        await raw.aclose()
    assert not path.exists()


# --------------------------------------------------------------------------
# The clients.


async def test_blocking_client(daemon: Daemon) -> None:
    def use() -> None:
        with Client(daemon.path, timeout=10) as client:
            assert client.call("echo", a=1) == {"params": {"a": 1}}
            assert client.call("echo", {"from": "abc"}, to="def") == {
                "params": {"from": "abc", "to": "def"}
            }
            with pytest.raises(NotFound) as excinfo:
                client.call("fail")
            assert excinfo.value.message == "No checkpoint matches 'abc1234'."
            assert excinfo.value.data == {"ref": "abc1234"}
            with pytest.raises(MethodNotFound):
                client.call("nope")
            assert client.call("echo", method="x") == {"params": {"method": "x"}}
        with pytest.raises(ConnectionError):
            client.call("echo")

    await trio.to_thread.run_sync(use)


async def test_blocking_client_uses_the_environment(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOTD_SOCKET", daemon.path)

    def use() -> dict[str, Any]:
        with Client() as client:
            return client.call("echo")

    assert await trio.to_thread.run_sync(use) == {"params": {}}


async def test_blocking_client_timeout(daemon: Daemon) -> None:
    def use() -> None:
        with Client(daemon.path, timeout=0.1) as client:
            with pytest.raises(TimeoutError):
                client.call("sleep", s=0.5)
            client._sock.settimeout(10)  # type: ignore[union-attr]
            # The late answer to the call that timed out is skipped.
            assert client.call("echo", n=2) == {"params": {"n": 2}}

    await trio.to_thread.run_sync(use)


async def test_connect_or_none(daemon: Daemon, tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing" / "here.sock")
    stale = str(tmp_path / "stale.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(stale)

    def probe() -> None:
        assert connect_or_none(missing) is None
        assert connect_or_none(stale) is None
        client = connect_or_none(daemon.path)
        assert client is not None
        with client:
            assert client.call("echo") == {"params": {}}

    await trio.to_thread.run_sync(probe)


async def test_async_client_pipelines_and_rebuilds_errors(daemon: Daemon) -> None:
    order: list[str] = []
    async with AsyncClient.connect(daemon.path) as client:

        async def slow() -> None:
            await client.call("sleep", s=0.2)
            order.append("slow")

        async def fast() -> None:
            await client.call("echo")
            order.append("fast")

        async def failing() -> None:
            with pytest.raises(NotFound) as excinfo:
                await client.call("fail")
            assert excinfo.value.data == {"ref": "abc1234"}
            order.append("failed")

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                await trio.sleep(0.01)
                nursery.start_soon(fast)
                nursery.start_soon(failing)
    assert order[-1] == "slow"
    assert sorted(order[:2]) == ["failed", "fast"]


async def test_async_client_errors_are_not_wrapped_in_groups(daemon: Daemon) -> None:
    with pytest.raises(NotFound):
        async with AsyncClient.connect(daemon.path) as client:
            await client.call("fail")


async def test_async_client_sees_the_connection_close(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    daemon = await start(nursery, tmp_path / "s" / "d.sock", line_limit=100)
    async with AsyncClient.connect(daemon.path) as client:
        with pytest.raises(InvalidRequest, match="longer than the limit"):
            await client.call("echo", padding="x" * 200)
        with pytest.raises(InvalidRequest):
            await client.call("echo")


async def test_async_client_connect_failure(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        async with AsyncClient.connect(str(tmp_path / "none.sock")):
            pass


# --------------------------------------------------------------------------
# A client in another language.


@pytest.mark.skipif(NODE is None, reason="node is not on PATH")
async def test_node_client_pipelines(daemon: Daemon) -> None:
    assert NODE is not None
    with trio.fail_after(30):
        done = await trio.run_process(
            [NODE, str(TESTS / "node_client.js"), daemon.path],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    responses = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["id"] for r in responses][-1] == 1
    by_id = {r["id"]: r for r in responses}
    assert by_id[1]["result"] == {"slept": 0.2}
    assert by_id[2]["result"] == {"params": {"text": "hello \u00e9\u2603"}}
    assert by_id[3]["error"]["code"] == -32601
