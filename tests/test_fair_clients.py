"""One client's pipeline of heavy requests, read or not, never starves another client (a real daemon on a real socket).

A connection runs a few requests at once and the rest of its pipeline waits
its turn, so another client's checkpoint waits behind a few of the hog's
diffs in the worker threads' queue, not behind all of them; and a client that
never reads its replies gets no more work done than its budget can hold.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from daemon_helpers import Daemon, ping
from repo_helpers import init_repo, write

from snapshotd.client.rpc import Client
from snapshotd.contract.framing import encode_message

PIPELINE = 60


def request(method: str, params: dict[str, Any], request_id: int) -> bytes:
    return encode_message({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def two_checkpoints(sock: Path, repo: Path, lines: int) -> tuple[str, str]:
    """A checkpoint before and one after a file of ``lines`` lines was added: their diff has a big patch."""
    with Client(str(sock), timeout=60) as client:
        before = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
        write(repo / "big.txt", "".join(f"line {n:07d} of a file that makes a big patch\n" for n in range(lines)))
        after = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
    return before, after


def test_a_pipeline_of_big_diffs_does_not_starve_another_clients_checkpoint(
    daemon: Daemon, sock: Path, tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    other = init_repo(tmp_path / "other", ("a.txt", "a\n"))
    before, after = two_checkpoints(sock, repo, 8_000)
    with Client(str(sock), timeout=60) as client:
        client.call("checkpoint", {"path": str(other)})  # opened and watched before the hog starts
    arrivals: list[float] = []

    def read_all(conn: socket.socket) -> None:
        with conn.makefile("rb") as replies:
            for _ in range(PIPELINE):
                reply = json.loads(replies.readline())
                assert "result" in reply, reply
                arrivals.append(time.monotonic())

    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.connect(str(sock))
    reader = threading.Thread(target=read_all, args=(hog,))
    reader.start()
    hog.sendall(b"".join(
        request("diff", {"from": before, "to": after, "patch": True}, n) for n in range(PIPELINE)
    ))
    time.sleep(0.1)
    write(other / "b.txt", "b\n")
    with Client(str(sock), timeout=120) as client:
        done = client.call("checkpoint", {"path": str(other)})
    finished = time.monotonic()
    assert done["checkpoint"]["changed"]
    reader.join(120)
    hog.close()
    assert len(arrivals) == PIPELINE
    ahead = sum(1 for arrival in arrivals if arrival < finished)
    assert ahead < PIPELINE // 2, f"the checkpoint finished after {ahead} of the hog's {PIPELINE} diffs"


def status_counter(sock: Path, name: str) -> int:
    with Client(str(sock), timeout=60) as client:
        return int(client.call("status")["counters"].get(name, 0))


def test_a_client_that_reads_late_gets_every_reply_and_meanwhile_little_is_computed(
    daemon: Daemon, sock: Path, tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    before, after = two_checkpoints(sock, repo, 70_000)  # a patch of about 3.6 MB, made by git: one process a diff
    started = status_counter(sock, "processes_started")
    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.connect(str(sock))
    hog.sendall(b"".join(
        request("diff", {"from": before, "to": after, "patch": True}, n) for n in range(40)
    ))
    time.sleep(4)
    made = status_counter(sock, "processes_started") - started
    time.sleep(1)
    assert status_counter(sock, "processes_started") - started == made  # nothing more while the replies lie unread
    assert 1 <= made <= 16, f"{made} of 40 diffs were made for a client that read nothing (16 MiB hold 4)"
    assert ping(sock)["pid"] == daemon.pid
    kinds = []
    with hog.makefile("rb") as replies:
        for _ in range(40):
            reply = json.loads(replies.readline())
            kinds.append("result" if "result" in reply else reply["error"]["data"]["kind"])
    hog.close()
    assert kinds == ["result"] * 40  # read late, but read: nothing was refused as busy
