"""Injected time: production code asks a ``Clock``; tests hand in a ``FakeClock``."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (wall time, comparable across processes)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; polling loops wait through this so tests can run them without waiting."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def sleep(self, seconds: float) -> None:
        """Moves the clock instead of waiting; ``sleeps`` records each wait."""
        self.sleeps.append(seconds)
        self.advance(seconds)


def format_timestamp(epoch: float | None) -> str | None:
    """ISO-8601 UTC with a ``Z``, whole seconds: ``2026-01-01T00:00:00Z``."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
