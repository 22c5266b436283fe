"""Load-balancing policies: which READY replica gets the next request.

A policy is a small in-memory object owned by one load balancer and used only from its event loop, so
nothing here locks. The load balancer tells a policy about the current targets (``set_targets``), asks it
for a target (``select``) and reports the start and end of every proxied request (``on_start`` /
``on_end``). Policies never do I/O and never look at a clock.

Two policies, selected by name with ``make_policy``:

``round_robin``
    Targets in turn. With targets A, B, C the choices are A, B, C, A, ...
``least_load``
    The target with the fewest requests in flight; ties go round-robin, so an idle set of targets is
    used evenly instead of always the first one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

ROUND_ROBIN = "round_robin"
LEAST_LOAD = "least_load"
POLICY_NAMES: tuple[str, ...] = (ROUND_ROBIN, LEAST_LOAD)


class Policy(Protocol):
    """How the load balancer picks a target. Used from one event loop only."""

    def set_targets(self, urls: Sequence[str]) -> None:
        """Replace the targets; in-flight counts of urls still present are kept, others are forgotten.

        Duplicates are ignored (the first occurrence sets the order).
        """
        ...

    def select(self, exclude: Collection[str] = ()) -> str | None:
        """The target for the next request, never one in ``exclude``; None when no target is eligible."""
        ...

    def on_start(self, url: str) -> None:
        """A request to ``url`` started. Unknown urls are ignored."""
        ...

    def on_end(self, url: str) -> None:
        """A request to ``url`` ended (answered or failed). Unknown urls are ignored."""
        ...


def _unique(urls: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(urls))


class RoundRobinPolicy:
    """Targets in turn, skipping excluded ones; the turn moves past the target chosen."""

    def __init__(self) -> None:
        self._targets: list[str] = []
        self._next = 0

    def set_targets(self, urls: Sequence[str]) -> None:
        self._targets = _unique(urls)
        # Keep the turn position: going from [A, B, C] with the turn at C (index 2) to [A, B] restarts at A
        # rather than raising IndexError or always favouring the first target after every change.
        self._next = self._next % len(self._targets) if self._targets else 0

    def select(self, exclude: Collection[str] = ()) -> str | None:
        targets = self._targets
        count = len(targets)
        start = self._next
        for offset in range(count):
            index = (start + offset) % count
            url = targets[index]
            if url not in exclude:
                self._next = (index + 1) % count
                return url
        return None

    def on_start(self, url: str) -> None:
        """Round robin does not look at load."""

    def on_end(self, url: str) -> None:
        """Round robin does not look at load."""


class LeastLoadPolicy:
    """The eligible target with the fewest requests in flight; ties are broken round-robin.

    Ties in turn: with A and B both idle, sequential requests go A, B, A, B. With A at 3 in flight and B
    at 1, every new request goes to B until B reaches 3 too.
    """

    def __init__(self) -> None:
        self._targets: list[str] = []
        self._in_flight: dict[str, int] = {}
        self._next = 0

    def set_targets(self, urls: Sequence[str]) -> None:
        self._targets = _unique(urls)
        self._in_flight = {url: self._in_flight.get(url, 0) for url in self._targets}
        self._next = self._next % len(self._targets) if self._targets else 0

    def select(self, exclude: Collection[str] = ()) -> str | None:
        targets = self._targets
        count = len(targets)
        in_flight = self._in_flight
        best_index = -1
        best_load = 0
        start = self._next
        for offset in range(count):
            index = (start + offset) % count
            url = targets[index]
            if url in exclude:
                continue
            load = in_flight[url]
            # Strictly less: among equal loads the first one from the turn position wins.
            if best_index < 0 or load < best_load:
                best_index = index
                best_load = load
        if best_index < 0:
            return None
        self._next = (best_index + 1) % count
        return targets[best_index]

    def on_start(self, url: str) -> None:
        if url in self._in_flight:
            self._in_flight[url] += 1

    def on_end(self, url: str) -> None:
        # Floor at 0: a url removed and re-added while its requests were in flight starts again at 0, and
        # the late ends of those requests must not drive it negative.
        load = self._in_flight.get(url)
        if load:
            self._in_flight[url] = load - 1

    def in_flight(self, url: str) -> int:
        """Requests in flight to ``url`` as this policy counts them; 0 for unknown urls."""
        return self._in_flight.get(url, 0)


def make_policy(name: str) -> Policy:
    """A fresh policy for ``name`` ("round_robin" or "least_load"), with no targets.

    Raises ValueError naming the known policies for any other name.
    """
    if name == ROUND_ROBIN:
        return RoundRobinPolicy()
    if name == LEAST_LOAD:
        return LeastLoadPolicy()
    known = ", ".join(POLICY_NAMES)
    raise ValueError(f"unknown load-balancing policy {name!r}; expected one of: {known}")
