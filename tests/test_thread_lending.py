"""A worker thread waiting for the disk lends its place in the thread limiter, and takes it back after."""

from __future__ import annotations

import functools
import threading

import trio
import trio.testing

from snapshotd.threads import fair_limiter, thread_limiter


async def test_threads_waiting_for_the_disk_leave_their_places_to_other_work():
    places = fair_limiter.places
    flushed = threading.Event()
    waiting = threading.Semaphore(0)

    def flush_wait() -> None:
        with fair_limiter.waiting_on_disk():
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
    await trio.testing.wait_all_tasks_blocked()  # the places taken back, asked of the loop without waiting
    assert fair_limiter.total_tokens == places and fair_limiter.borrowed_tokens == 0


async def test_a_thread_beyond_the_places_ends_before_another_starts():
    """Taken back while a thread it let in still runs: the next job waits until a thread ends."""
    places = fair_limiter.places
    release_flush, release_work = threading.Event(), threading.Event()
    started = threading.Semaphore(0)
    ran: list[str] = []

    def flush_wait() -> None:
        with fair_limiter.waiting_on_disk():
            started.release()
            assert release_flush.wait(20)

    def work(name: str) -> None:
        started.release()
        ran.append(name)
        assert release_work.wait(20)

    in_thread = functools.partial(trio.to_thread.run_sync, limiter=thread_limiter)
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as flushes:
            for _ in range(places):
                flushes.start_soon(in_thread, flush_wait)
            for _ in range(places):
                await trio.to_thread.run_sync(started.acquire)
            for index in range(places):  # let in by the places lent
                nursery.start_soon(in_thread, work, f"lent {index}")
            for _ in range(places):
                await trio.to_thread.run_sync(started.acquire)
            release_flush.set()  # the flushes end: their places are taken back while the lent ones still work
        nursery.start_soon(in_thread, work, "after")
        await trio.testing.wait_all_tasks_blocked()
        assert fair_limiter.borrowed_tokens == places and "after" not in ran
        release_work.set()
    assert ran[-1] == "after" and fair_limiter.total_tokens == places and fair_limiter.borrowed_tokens == 0


def test_off_a_trio_run_nothing_is_lent():
    places = fair_limiter.total_tokens
    seen: list[int] = []

    def plain() -> None:
        with fair_limiter.waiting_on_disk():
            seen.append(fair_limiter.total_tokens)

    thread = threading.Thread(target=plain)
    thread.start()
    thread.join()
    assert seen == [places]
