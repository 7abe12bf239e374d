"""The one limiter for worker threads: blocking work (pygit2, hashing, file I/O) runs behind it.

Every stage hands its blocking calls to ``trio.to_thread.run_sync(...,
limiter=thread_limiter)``, so the trio loop stays responsive and the threads
stay within the machine's cores (at least two).
"""

from __future__ import annotations

import os

import trio

thread_limiter = trio.CapacityLimiter(max(2, len(os.sched_getaffinity(0))))
