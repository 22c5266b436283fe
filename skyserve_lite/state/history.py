"""A service's last hour, a point per minute: its request rate and its replica counts. Values and pure
arithmetic; the store reads and writes the rows, `serve status NAME` draws them as sparklines.

Two sources: the load balancer's per-second request counts (kept ``REQUEST_COUNTS_KEEP_SECONDS``, enough
for the hour), and the replica samples the controller's executor writes on the first pass of each minute
(``ReplicaSample``; samples older than ``HISTORY_MINUTES`` are dropped as new ones are written).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyserve_lite.clock import format_timestamp

HISTORY_MINUTES = 60

# The history covers the 60 whole minutes before the current one: at 12:00:30 it starts at 11:00:00, 3630 s
# ago, up to 3660 s at 12:00:59. The load balancer drops counts older than this before its newest second, so
# with two minutes to spare the oldest minute is always whole.
REQUEST_COUNTS_KEEP_SECONDS = (HISTORY_MINUTES + 2) * 60


@dataclass(frozen=True)
class ReplicaSample:
    """A service's replica counts as one controller pass in ``minute`` (minutes since the epoch) left them."""

    service: str
    minute: int
    ready: int  # READY replicas
    target: int  # the autoscaler's target


@dataclass(frozen=True)
class ServiceHistory:
    """Per minute, oldest first, from ``start_minute`` (minutes since the epoch): requests that arrived, and
    the READY replicas and target the controller sampled, None for a minute no pass sampled (no controller
    was running, or the service did not exist or was not autoscaled then)."""

    start_minute: int
    requests: tuple[int, ...]
    ready: tuple[int | None, ...]
    target: tuple[int | None, ...]

    @property
    def requests_per_second(self) -> tuple[float, ...]:
        return tuple(count / 60 for count in self.requests)

    @property
    def has_replica_samples(self) -> bool:
        return any(count is not None for count in self.ready)

    def to_json(self) -> dict[str, Any]:
        return {"start": format_timestamp(self.start_minute * 60), "step_seconds": 60,
                "requests_per_second": [round(rate, 3) for rate in self.requests_per_second],
                "ready_replicas": list(self.ready), "target_replicas": list(self.target)}


def history_start_minute(now: float, minutes: int = HISTORY_MINUTES) -> int:
    """The first minute of the history at ``now``: ``minutes`` whole minutes before the current one (whose
    requests are still arriving)."""
    return int(now // 60) - minutes


def compute_service_history(now: float, requests_by_minute: Mapping[int, int], samples: Sequence[ReplicaSample],
                            minutes: int = HISTORY_MINUTES) -> ServiceHistory:
    """The history at ``now`` from request counts per minute and replica samples (either may hold minutes
    outside the window: they are left out)."""
    start = history_start_minute(now, minutes)
    window = range(start, start + minutes)
    by_minute = {sample.minute: sample for sample in samples}
    return ServiceHistory(
        start_minute=start,
        requests=tuple(requests_by_minute.get(minute, 0) for minute in window),
        ready=tuple(by_minute[minute].ready if minute in by_minute else None for minute in window),
        target=tuple(by_minute[minute].target if minute in by_minute else None for minute in window),
    )
