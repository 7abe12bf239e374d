"""One session's live checkpoints, oldest first, as read from one head pin (see :mod:`.index`)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from snapshotd.store.pins import Pin


@dataclass
class SessionIndex:
    """One session's live checkpoints, oldest first, as read from the pin ``head``."""

    head: str | None = None
    pins: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    position: dict[str, int] = field(default_factory=dict)  # checkpoint id -> index in the lists
    pin_position: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pins)

    def truncate(self, keep: int) -> None:
        """Forget every entry above the oldest ``keep`` (what a rewrite replaced)."""
        for index in range(keep, len(self.pins)):
            del self.position[self.checkpoints[index]]
            del self.pin_position[self.pins[index]]
        del self.pins[keep:], self.checkpoints[keep:], self.seqs[keep:]

    def append(self, pin: str, checkpoint: str, seq: int) -> None:
        self.position[checkpoint] = len(self.pins)
        self.pin_position[pin] = len(self.pins)
        self.pins.append(pin)
        self.checkpoints.append(checkpoint)
        self.seqs.append(seq)

    def newest(self, count: int | None) -> list[str]:
        """The ids of the newest ``count`` checkpoints (all when None), newest first."""
        start = 0 if count is None else max(0, len(self.checkpoints) - count)
        return self.checkpoints[start:][::-1]

    def past_newest(self, keep: int) -> list[str]:
        """The ids of every checkpoint but the newest ``keep``, newest first."""
        return self.checkpoints[: max(0, len(self.checkpoints) - keep)][::-1]

    def at_seq(self, seq: int) -> str | None:
        index = bisect_left(self.seqs, seq)
        return self.checkpoints[index] if index < len(self.seqs) and self.seqs[index] == seq else None

    def pin_objects(self, start: int) -> list[Pin]:
        """Pins from ``start`` up, newest first, as :func:`read_pin` would give them (``last_seq`` = seq)."""
        out = []
        for index in range(len(self.pins) - 1, start - 1, -1):
            previous = self.pins[index - 1] if index > 0 else None
            out.append(Pin(self.pins[index], self.checkpoints[index], previous, self.seqs[index], self.seqs[index]))
        return out
