"""What a load balancer counts for Prometheus, and how it hands it to the controller host's exporter.

``LbMetrics`` is an ``OutcomeSink`` (``lb.outcomes``): per outcome it adds one to a plain dict and, for an
attempt that got a response, one to a latency bucket; no lock, no string built, no prometheus-client object
touched on the request path. ``take_snapshot`` copies the totals with what the load balancer knows at that
moment (requests in flight per replica, requests held, retries, ejections) into an ``LbSnapshot``;
``publish_every`` writes it about once a second, when it changed, to ``metrics_path(home, service)``
(``$SKY_LITE_HOME/metrics/lb/<service>.json``, replaced atomically; the file's format is ``lb.metrics_file``,
whose names this module re-exports). The controller's exporter
(``controller.metrics``) reads those files when Prometheus scrapes, so the load balancers open no port of
their own and several of them on one host need no shared memory: see docs/architecture.md, "Metrics".

Totals count from the load balancer's start; a restarted one starts again from 0, which Prometheus' rate()
reads as a counter reset. A replica's series go ``FORGET_SECONDS`` after it left the targets with nothing in
flight, so that a service whose replicas come and go keeps a bounded set of labels.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Protocol

from skyserve_lite.lb.metrics_file import (
    LATENCY_BUCKETS,
    LatencyRow,
    LbSnapshot,
    metrics_dir,
    metrics_path,
    read_snapshot,
    read_snapshots,
    write_snapshot,
)
from skyserve_lite.lb.outcomes import STATUS_CLASSES, Outcome

__all__ = [
    "FORGET_SECONDS",
    "LATENCY_BUCKETS",
    "PUBLISH_SECONDS",
    "LatencyRow",
    "LbMetrics",
    "LbSnapshot",
    "LoadSource",
    "metrics_dir",
    "metrics_path",
    "read_snapshot",
    "read_snapshots",
    "write_snapshot",
]

log = logging.getLogger(__name__)

# How often the snapshot is written when it changed: Prometheus scrapes every 15 s or so, and one small file
# written a second per busy service is nothing next to its requests (an idle service writes nothing).
PUBLISH_SECONDS: Final = 1.0

# A replica's series are dropped once it has been neither a target nor busy for this long: long enough for
# several scrapes to read its last counts (Prometheus scrapes every 15-60 s), short enough that a service
# whose replicas churn (autoscaling, updates) keeps a bounded set of labels.
FORGET_SECONDS: Final = 600.0

# (version or None, replica url or None, status class "2xx" ... "5xx")
RequestKey = tuple[int | None, str | None, str]
# (version or None, replica url or None, Failure value)
FailureKey = tuple[int | None, str | None, str]


class LoadSource(Protocol):
    """What ``take_snapshot`` reads of the load balancer (``LoadBalancer`` is one)."""

    retries: int
    ejections: int

    @property
    def waiting(self) -> int: ...

    @property
    def ejected(self) -> frozenset[str]: ...

    def in_flight(self) -> tuple[tuple[str, int], ...]: ...


class LbMetrics:
    """Totals of the outcomes of one load balancer. ``record`` runs on its event loop, per outcome."""

    def __init__(self, service: str, worker: int | None = None) -> None:
        self.service = service
        self.worker = worker  # which worker of several (``lb.workers``), or None
        self._requests: dict[RequestKey, int] = {}
        self._failures: dict[FailureKey, int] = {}
        # (version, replica url) -> bucket counts, +Inf last; and the sum of the seconds
        self._latency: dict[tuple[int | None, str], list[int]] = {}
        self._latency_sum: dict[tuple[int | None, str], float] = {}
        self._gone_since: dict[str, float] = {}  # replica url -> when it was first seen gone

    def record(self, outcome: Outcome) -> None:
        status = outcome.status
        if status is None:
            key = (outcome.version, outcome.replica, outcome.failure.value if outcome.failure else "unknown")
            failures = self._failures
            failures[key] = failures.get(key, 0) + 1
            return
        request = (outcome.version, outcome.replica, STATUS_CLASSES[status // 100])  # find_status_class's table
        requests = self._requests
        requests[request] = requests.get(request, 0) + 1
        replica = outcome.replica
        if replica is None:  # the load balancer's own answers: no replica's latency
            return
        where = (outcome.version, replica)
        buckets = self._latency.get(where)
        if buckets is None:
            buckets = self._latency[where] = [0] * (len(LATENCY_BUCKETS) + 1)
            self._latency_sum[where] = 0.0
        seconds = outcome.seconds
        buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self._latency_sum[where] += seconds

    def take_snapshot(self, lb: LoadSource, pid: int, now: float) -> LbSnapshot:
        """The totals so far with ``lb``'s load now, as a value (the counters keep counting)."""
        return LbSnapshot(
            service=self.service, pid=pid, written_at=now,
            requests=tuple((v, r, c, n) for (v, r, c), n in sorted(self._requests.items(), key=_order)),
            failures=tuple((v, r, f, n) for (v, r, f), n in sorted(self._failures.items(), key=_order)),
            latency=tuple(LatencyRow(v, r, tuple(b), self._latency_sum[(v, r)])
                          for (v, r), b in sorted(self._latency.items(), key=_order)),
            in_flight=lb.in_flight(), waiting=lb.waiting, retries=lb.retries, ejections=lb.ejections,
            ejected=len(lb.ejected), worker=self.worker,
        )

    def forget_gone(self, live: Iterable[str], now: float, after_seconds: float = FORGET_SECONDS) -> None:
        """Drop the series of the replicas that have not been in ``live`` (the load balancer's targets and
        busy urls) for ``after_seconds``; a replica back in ``live`` meanwhile keeps them."""
        live = set(live)
        seen = {r for _, r, _ in self._requests if r is not None} | {r for _, r, _ in self._failures if r is not None}
        seen |= {r for _, r in self._latency}
        gone_since = {url: self._gone_since.get(url, now) for url in seen if url not in live}
        forget = {url for url, since in gone_since.items() if now - since >= after_seconds}
        self._gone_since = {url: since for url, since in gone_since.items() if url not in forget}
        if not forget:
            return
        self._requests = {key: n for key, n in self._requests.items() if key[1] not in forget}
        self._failures = {key: n for key, n in self._failures.items() if key[1] not in forget}
        self._latency = {key: b for key, b in self._latency.items() if key[1] not in forget}
        self._latency_sum = {key: t for key, t in self._latency_sum.items() if key[1] not in forget}

    async def publish_every(self, lb: LoadSource, path: Path, clock: _Now, pid: int | None = None,
                            seconds: float = PUBLISH_SECONDS) -> None:
        """Write the snapshot to ``path`` every ``seconds`` when it changed (a worker thread writes), until
        cancelled. A write that fails is logged once per problem and tried again on the next round."""
        pid = os.getpid() if pid is None else pid
        last: LbSnapshot | None = None
        problem: str | None = None
        while True:
            now = clock()
            self.forget_gone((url for url, _ in lb.in_flight()), now)
            snapshot = self.take_snapshot(lb, pid, now)
            if last is None or _counts_of(snapshot) != _counts_of(last):
                try:
                    await asyncio.to_thread(write_snapshot, path, snapshot)
                except OSError as exc:
                    if str(exc) != problem:
                        problem = str(exc)
                        log.warning("service %s: cannot write its metrics to %s: %s", self.service, path, exc)
                else:
                    last, problem = snapshot, None
            await asyncio.sleep(seconds)


class _Now(Protocol):
    def __call__(self) -> float: ...


def _order(item: tuple[tuple[object, ...], object]) -> tuple[str, ...]:
    """A stable order for keys holding None: as strings, None first."""
    return tuple("" if part is None else str(part) for part in item[0])


def _counts_of(snapshot: LbSnapshot) -> tuple[object, ...]:
    """Everything but the time it was taken."""
    return (snapshot.requests, snapshot.failures, snapshot.latency, snapshot.in_flight, snapshot.waiting,
            snapshot.retries, snapshot.ejections, snapshot.ejected)
