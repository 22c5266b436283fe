"""Requests per service version and status class, per second: what the canary judge reads.

``VersionCounter`` is an ``OutcomeSink`` (``lb.outcomes``): each finished attempt to a replica whose version
the load balancer knows adds one to (version, second, class), class ``2xx`` ... ``5xx`` by the replica's
status, or ``failed`` for an attempt that got no response (``outcomes.find_status_class``, as the metrics).
Answers the load balancer made itself (503, 502, 429, 401) belong to no version and are not counted here;
neither is an attempt the client abandoned first (``Failure.ABORTED``), which says nothing of the replica.
``flush_every`` writes the completed seconds to the store about once a second, as request counts are
written; rows add up, so several load balancers sum.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from skyserve_lite.clock import Clock
from skyserve_lite.lb.outcomes import Failure, Outcome, find_status_class

log = logging.getLogger(__name__)

CountKey = tuple[int, int, str]  # (version, second, status class)
FLUSH_SECONDS = 1.0
# Seconds kept in memory while the store cannot be written, then the oldest are dropped: 5 minutes is more
# than a bake window, and bounds what a load balancer holds at ~5 classes x 2 versions x 300 s rows.
MAX_UNFLUSHED_SECONDS = 300


class VersionCounter:
    """An ``OutcomeSink`` counting attempts per (version, second, status class); ``take_completed`` hands over
    the seconds that are over. Used from the load balancer's event loop only."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._counts: dict[CountKey, int] = {}

    def record(self, outcome: Outcome) -> None:
        version = outcome.version
        if version is None or outcome.failure is Failure.ABORTED:
            return
        key = (version, int(self._clock.now()), find_status_class(outcome.status))
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def take_completed(self, now_second: int | None = None) -> dict[CountKey, int]:
        """The counts of seconds before ``now_second`` (every count when None), forgotten here."""
        if now_second is None:
            taken, self._counts = self._counts, {}
            return taken
        taken = {key: n for key, n in self._counts.items() if key[1] < now_second}
        if taken:
            self._counts = {key: n for key, n in self._counts.items() if key[1] >= now_second}
        return taken

    def put_back(self, counts: Mapping[CountKey, int]) -> None:
        """Counts a write failed to store, for the next flush; those older than ``MAX_UNFLUSHED_SECONDS``
        before now are dropped."""
        oldest = int(self._clock.now()) - MAX_UNFLUSHED_SECONDS
        for key, n in counts.items():
            if key[1] >= oldest:
                self._counts[key] = self._counts.get(key, 0) + n

    async def flush(self, write: Callable[[Mapping[CountKey, int]], None], *, everything: bool = False) -> None:
        """Write the completed seconds (all of them with ``everything``) with ``write`` on a worker thread;
        what fails to be written is kept for the next flush."""
        counts = self.take_completed(None if everything else int(self._clock.now()))
        if not counts:
            return
        try:
            await asyncio.to_thread(write, counts)
        except Exception:
            self.put_back(counts)
            raise

    async def flush_every(self, write: Callable[[Mapping[CountKey, int]], None],
                          seconds: float = FLUSH_SECONDS) -> None:
        """Flush every ``seconds`` until cancelled (the caller flushes ``everything`` once after)."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.flush(write)
            except Exception:  # the store is busy or gone for a moment: kept, the next flush retries
                log.warning("could not store per-version request counts; retrying", exc_info=True)
