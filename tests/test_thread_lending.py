"""A worker thread waiting for the disk lends its place in the thread limiter, and takes it back after."""

from __future__ import annotations

import threading

import trio

from snapshotd import threads
from snapshotd.threads import fair_limiter, thread_limiter, waiting_on_disk


async def test_threads_waiting_for_the_disk_leave_their_places_to_other_work():
    places = fair_limiter.total_tokens
    flushed = threading.Event()
    waiting = threading.Semaphore(0)

    def flush_wait() -> None:
        with waiting_on_disk():
            waiting.release()
            assert flushed.wait(20)

    async def waiter() -> None:
        await trio.to_thread.run_sync(flush_wait, limiter=thread_limiter)

    async with trio.open_nursery() as waiters:
        for _ in range(places):  # every place taken by a thread that then waits for the disk
            waiters.start_soon(waiter)
        for _ in range(places):
            await trio.to_thread.run_sync(waiting.acquire)
        with trio.fail_after(10):  # without the lending, this waits for a place until the flush ends
            assert await trio.to_thread.run_sync(sum, [1, 2], limiter=thread_limiter) == 3
        assert fair_limiter.total_tokens == 2 * places
        flushed.set()
    assert fair_limiter.total_tokens == places and fair_limiter.borrowed_tokens == 0


def test_off_a_trio_thread_nothing_is_lent():
    places = fair_limiter.total_tokens
    seen: list[int] = []

    def plain() -> None:
        with waiting_on_disk():
            seen.append(threads.fair_limiter.total_tokens)

    thread = threading.Thread(target=plain)
    thread.start()
    thread.join()
    assert seen == [places]
