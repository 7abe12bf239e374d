"""snapshotd as the benchmark drives it: the embedded engine (cold) and a real daemon (warm).

* cold: one :class:`snapshotd.engine.core.Engine` in the benchmark's own process,
  without a nursery, so it never watches and every capture takes the cold
  path (copy of the user's index, one tagged ``ls-files``, hashing of what it
  names). Processes are ``stats.processes`` for a checkpoint, and the
  in-process spawn counter for restore and diff.
* warm: ``python -m snapshotd serve`` in its own process, reached over its
  socket with :class:`snapshotd.client.rpc.AsyncClient`. After the first
  (cold) capture of a worktree its watcher is live and captures take the warm
  path. Processes are ``stats.processes`` for a checkpoint, and the daemon's
  ``processes_started`` counter around a restore or diff.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psutil
import trio

from snapshotd.client.rpc import AsyncClient
from snapshotd.engine.core import Engine
from snapshotd.git import spawn

from .common import REPO_ROOT, WORK
from .methods import Method, Sample, ms_since
from .trees import Tree

DAEMON_START_TIMEOUT_S = 20.0


class Daemon:
    """A running ``snapshotd serve`` process and one connection to it."""

    def __init__(self, proc: subprocess.Popen[bytes], socket_path: str, client: AsyncClient) -> None:
        self.proc = proc
        self.socket_path = socket_path
        self.client = client
        self.pid = proc.pid
        self.ps = psutil.Process(proc.pid)

    async def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return await self.client.call(method, params, **kw)

    async def processes_started(self) -> int:
        status = await self.call("status")
        return int(status["counters"].get("processes_started", 0))

    def cpu_seconds(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def cpu_seconds_with_git(self) -> float:
        """:meth:`cpu_seconds` and its git processes': those reaped, and those still running (check-ignore)."""
        times = self.ps.cpu_times()
        live = 0.0
        for child in self.ps.children(recursive=True):
            try:
                child_times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            live += child_times.user + child_times.system
        return float(times.user + times.system + times.children_user + times.children_system + live)

    def system_cpu_seconds(self) -> float:
        """The kernel's share of :meth:`cpu_seconds` (file creation, fsync, inotify)."""
        return float(self.ps.cpu_times().system)

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def peak_rss(self) -> int:
        """VmHWM: the most resident memory the daemon has had since it started."""
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return self.rss()


@contextlib.asynccontextmanager
async def running_daemon(tag: str, *, fresh_home: bool = True, checkout: str | None = None) -> AsyncIterator[Daemon]:
    """Start a daemon with its own home under bench/work/, yield it, shut it down cleanly.

    ``checkout``: run that checkout's code (its own ``.venv`` if it has one) instead of this one's.
    """
    home = WORK / f"home-{tag}"
    if fresh_home and home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)  # snapshotd refuses a home others may read
    logs = WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    sock_dir = tempfile.mkdtemp(prefix="snapshotd-bench-")
    socket_path = os.path.join(sock_dir, "daemon.sock")
    env = dict(os.environ, SNAPSHOTD_HOME=str(home))
    env.pop("SNAPSHOTD_SOCKET", None)
    log = open(logs / f"daemon-{tag}.log", "wb")  # noqa: SIM115 - closed below
    python, cwd = sys.executable, str(REPO_ROOT)
    if checkout:
        cwd = os.path.abspath(checkout)
        own = os.path.join(cwd, ".venv", "bin", "python")
        python = own if os.path.exists(own) else python
        env["PYTHONPATH"] = cwd
    proc = subprocess.Popen(
        [python, "-m", "snapshotd", "serve", "--socket", socket_path],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
    )
    try:
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while not os.path.exists(socket_path):
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {proc.returncode}; see {logs}/daemon-{tag}.log")
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not create its socket in time")
            await trio.sleep(0.02)
        async with AsyncClient.connect(socket_path) as client:
            daemon = Daemon(proc, socket_path, client)
            await daemon.call("ping")
            try:
                yield daemon
            finally:
                with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await client.call("shutdown")
    finally:
        try:
            await trio.to_thread.run_sync(proc.wait, 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the benchmark dies, so no daemon outlives a killed run."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _sample_from_checkpoint(result: dict[str, Any], ms: float) -> Sample:
    stats = result["stats"]
    checkpoint = result["checkpoint"]
    return Sample(
        ms=ms,
        processes=int(stats["processes"]),
        tree=checkpoint["tree"],
        ref=checkpoint["id"],
        engine_ms=float(stats["ms"]),
        scan=stats["scan"],
        hashed=int(stats["hashed"]),
    )


class SnapshotdCold(Method):
    name = "snapshotd cold"
    family = "snapshotd"
    description = "embedded `Engine().call(\"checkpoint\", ...)`, no watcher: the cold path every time"
    can_restore = True
    can_diff = True
    session = "bench-cold"

    def __init__(self) -> None:
        self.engine = Engine(home=WORK / "home-embedded")

    async def capture(self, tree: Tree) -> Sample:
        start = time.perf_counter()
        result = await self.engine.call("checkpoint", {"path": tree.path, "session": self.session})
        return _sample_from_checkpoint(result, ms_since(start))

    async def restore(self, tree: Tree, ref: str, paths: Sequence[str] | None) -> Sample:
        params: dict[str, Any] = {"checkpoint": ref, "path": tree.path}
        if paths is not None:
            params["paths"] = list(paths)
        before = spawn.spawned_total()
        start = time.perf_counter()
        result = await self.engine.call("restore", params)
        ms = ms_since(start)
        return Sample(ms=ms, processes=spawn.spawned_total() - before,
                      extra={"written": len(result["written"]), "deleted": len(result["deleted"])})

    async def diff(self, tree: Tree, old: str, new: str) -> Sample:
        before = spawn.spawned_total()
        start = time.perf_counter()
        result = await self.engine.call("diff", {"from": old, "to": new, "patch": True, "path": tree.path})
        ms = ms_since(start)
        return Sample(ms=ms, processes=spawn.spawned_total() - before, files=len(result["files"]))

    async def drop_session(self, tree: Tree) -> None:
        with contextlib.suppress(Exception):
            await self.engine.call("delete", {"path": tree.path, "session": self.session})

    async def aclose(self) -> None:
        await self.engine.aclose()


class SnapshotdWarm(Method):
    name = "snapshotd warm"
    family = "snapshotd"
    description = "`checkpoint` through the daemon's socket; watcher live, so the warm path"
    can_restore = True
    can_diff = True
    session = "bench-warm"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def capture(self, tree: Tree) -> Sample:
        start = time.perf_counter()
        result = await self.daemon.call("checkpoint", path=tree.path, session=self.session)
        return _sample_from_checkpoint(result, ms_since(start))

    async def restore(self, tree: Tree, ref: str, paths: Sequence[str] | None) -> Sample:
        params: dict[str, Any] = {"checkpoint": ref, "path": tree.path}
        if paths is not None:
            params["paths"] = list(paths)
        before = await self.daemon.processes_started()
        start = time.perf_counter()
        result = await self.daemon.call("restore", params)
        ms = ms_since(start)
        after = await self.daemon.processes_started()
        return Sample(ms=ms, processes=after - before,
                      extra={"written": len(result["written"]), "deleted": len(result["deleted"])})

    async def diff(self, tree: Tree, old: str, new: str) -> Sample:
        before = await self.daemon.processes_started()
        start = time.perf_counter()
        result = await self.daemon.call("diff", {"from": old, "to": new, "patch": True, "path": tree.path})
        ms = ms_since(start)
        after = await self.daemon.processes_started()
        return Sample(ms=ms, processes=after - before, files=len(result["files"]))

    async def drop_session(self, tree: Tree) -> None:
        with contextlib.suppress(Exception):
            await self.daemon.call("delete", path=tree.path, session=self.session)
