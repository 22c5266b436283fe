"""Load-balancing policies: which READY replica gets the next request.

A policy is a small in-memory object owned by one load balancer and used only from its event loop, so
nothing here locks. The load balancer tells a policy about the current targets (``set_targets``) and asks it
for a target (``select``). Load is not the policy's own: the load balancer counts the requests in flight per
url in one ``InFlight`` (it reports the same counts to the autoscaler) and hands it to the policies that look
at load. Nothing here does I/O or looks at a clock.

Two policies, selected by name with ``make_policy``:

``round_robin``
    Targets in turn. With targets A, B, C the choices are A, B, C, A, ...
``least_load``
    The target with the fewest requests in flight; ties go round-robin, so an idle set of targets is
    used evenly instead of always the first one.
``instance_aware_least_load[:ACCELERATOR=RATE,...]``
    ``least_load`` with each target's load measured against its capacity: the rate of the accelerator it
    runs on (``target_qps_per_replica: {A100: 5, L4: 2}``), so an A100 replica takes about 5 requests for
    every 2 an L4 replica takes. A target whose accelerator has no rate counts at the smallest rate.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

ROUND_ROBIN = "round_robin"
LEAST_LOAD = "least_load"
INSTANCE_AWARE = "instance_aware_least_load"
POLICY_NAMES: tuple[str, ...] = (ROUND_ROBIN, LEAST_LOAD, INSTANCE_AWARE)


class Policy(Protocol):
    """How the load balancer picks a target. Used from one event loop only."""

    def set_targets(self, urls: Sequence[str], accelerators: Sequence[str | None] = ()) -> None:
        """Replace the targets (with the accelerators each runs on, in order, where known). Duplicates are
        ignored (the first occurrence sets the order)."""
        ...

    def select(self, exclude: Collection[str] = ()) -> str | None:
        """The target for the next request, never one in ``exclude``; None when no target is eligible."""
        ...


class InFlight:
    """Requests in flight per replica url: ``start`` when a request to a url begins, ``end`` when it is over.

    The counts are exact, whatever the targets do: a url taken out of the targets keeps its count while its
    requests run (a draining replica still has them, and a url that comes back goes on from there), and is
    forgotten once it is neither a target nor busy. Every ``end`` must pair with an earlier ``start`` of the
    same url on the same object; an ``end`` of a url at 0 is ignored.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._targets: frozenset[str] = frozenset()

    def set_targets(self, urls: Collection[str]) -> None:
        """Report a count for every url of ``urls`` from now on, 0 when idle; forget idle urls not in it."""
        self._targets = frozenset(urls)
        counts = {url: n for url, n in self._counts.items() if n > 0}
        for url in self._targets:
            counts.setdefault(url, 0)
        self._counts = counts

    def start(self, url: str) -> None:
        counts = self._counts
        counts[url] = counts.get(url, 0) + 1

    def end(self, url: str) -> None:
        counts = self._counts
        n = counts.get(url, 0)
        if n > 1 or (n == 1 and url in self._targets):
            counts[url] = n - 1
        elif n == 1:
            del counts[url]

    def get(self, url: str) -> int:
        """Requests in flight to ``url``; 0 for a url never started or forgotten."""
        return self._counts.get(url, 0)

    def snapshot(self) -> tuple[tuple[str, int], ...]:
        """``((url, count), ...)`` sorted by url: every target (0 when idle) and every other busy url."""
        return tuple(sorted(self._counts.items()))


def _unique(urls: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(urls))


class _Rotation:
    """The target list and the turn position both policies keep."""

    def __init__(self) -> None:
        self._targets: list[str] = []
        self._next = 0

    def set_targets(self, urls: Sequence[str], accelerators: Sequence[str | None] = ()) -> None:
        self._targets = _unique(urls)
        # Keep the turn position: going from [A, B, C] with the turn at C (index 2) to [A, B] restarts at A
        # rather than raising IndexError or always favouring the first target after every change.
        self._next = self._next % len(self._targets) if self._targets else 0


class RoundRobinPolicy(_Rotation):
    """Targets in turn, skipping excluded ones; the turn moves past the target chosen."""

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


class LeastLoadPolicy(_Rotation):
    """The eligible target with the fewest requests in flight in ``in_flight``; ties are broken round-robin.

    Ties in turn: with A and B both idle, sequential requests go A, B, A, B. With A at 3 in flight and B
    at 1, every new request goes to B until B reaches 3 too.
    """

    def __init__(self, in_flight: InFlight) -> None:
        super().__init__()
        self._in_flight = in_flight

    def _score(self, url: str) -> float:
        """What the policy minimizes: the requests in flight."""
        return self._in_flight.get(url)

    def select(self, exclude: Collection[str] = ()) -> str | None:
        targets = self._targets
        count = len(targets)
        score_of = self._score
        best_index = -1
        best = 0.0
        start = self._next
        for offset in range(count):
            index = (start + offset) % count
            url = targets[index]
            if url in exclude:
                continue
            score = score_of(url)
            # Strictly less: among equal scores the first one from the turn position wins.
            if best_index < 0 or score < best:
                best_index, best = index, score
        if best_index < 0:
            return None
        self._next = (best_index + 1) % count
        return targets[best_index]


class InstanceAwareLeastLoadPolicy(LeastLoadPolicy):
    """The eligible target with the least load for its capacity, ``(in flight + 1) / rate``; ties
    round-robin. Counting the request to be sent (+1) makes idle targets fill by capacity: with an A100 at
    rate 5 and an L4 at 2, both idle, the first requests go A100, A100, L4, A100, ... rather than in turn."""

    def __init__(self, in_flight: InFlight, rates: Mapping[str, float]) -> None:
        super().__init__(in_flight)
        self._rates = {name.lower(): rate for name, rate in rates.items()}
        self._default = min(self._rates.values(), default=1.0)
        self._capacity: dict[str, float] = {}

    def set_targets(self, urls: Sequence[str], accelerators: Sequence[str | None] = ()) -> None:
        super().set_targets(urls)
        named = dict(zip(urls, accelerators, strict=False))
        self._capacity = {url: self._rate_of(named.get(url)) for url in self._targets}

    def _rate_of(self, accelerator: str | None) -> float:
        name = (accelerator or "").rpartition(":")[0] or (accelerator or "")
        return self._rates.get(name.lower(), self._default)

    def _score(self, url: str) -> float:
        return (self._in_flight.get(url) + 1) / self._capacity.get(url, self._default)


def parse_rates(text: str) -> dict[str, float]:
    """``a100=5,l4=2`` -> ``{"a100": 5.0, "l4": 2.0}``; ValueError for anything else."""
    rates: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        name, equals, rate = item.partition("=")
        value = float(rate) if equals else 0.0
        if not name or not equals or not value > 0:
            raise ValueError(f"bad accelerator rate {item!r} (expected NAME=RATE with RATE > 0)")
        rates[name] = value
    return rates


def make_policy(name: str, in_flight: InFlight) -> Policy:
    """A fresh policy for ``name`` ("round_robin", "least_load", or "instance_aware_least_load" with its
    rates after a ':'), with no targets, reading load from ``in_flight`` if it looks at load.

    Raises ValueError naming the known policies for any other name.
    """
    if name == ROUND_ROBIN:
        return RoundRobinPolicy()
    if name == LEAST_LOAD:
        return LeastLoadPolicy(in_flight)
    base, _, rates = name.partition(":")
    if base == INSTANCE_AWARE:
        return InstanceAwareLeastLoadPolicy(in_flight, parse_rates(rates))
    known = ", ".join(POLICY_NAMES)
    raise ValueError(f"unknown load-balancing policy {name!r}; expected one of: {known}")
