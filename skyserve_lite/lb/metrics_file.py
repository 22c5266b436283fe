"""The file a load balancer hands its metrics over in: an ``LbSnapshot`` at ``metrics_path(home, service)``,
written by ``lb.metrics.LbMetrics`` and read by the controller host's exporter (``controller.metrics``).

Kept apart from the counting in ``lb.metrics`` (which re-exports these names): this is a data format, read
and written once a second, off the request path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skyserve_lite.codec import decode, encode

__all__ = [
    "LATENCY_BUCKETS",
    "LatencyRow",
    "LbSnapshot",
    "metrics_dir",
    "metrics_path",
    "read_snapshot",
    "read_snapshots",
    "write_snapshot",
]

# Upper bounds of the latency buckets, in seconds (+Inf is implied): from a cached answer (5 ms) to a long
# generation (60 s). 14 buckets x the replicas of a service is a few hundred series at most.
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class LatencyRow:
    """One latency histogram: counts per bucket of ``LATENCY_BUCKETS`` (not cumulative), then the +Inf
    bucket, and the sum of the seconds."""

    version: int | None
    replica: str
    buckets: tuple[int, ...]
    total_seconds: float


@dataclass(frozen=True)
class LbSnapshot:
    """A load balancer's totals at ``written_at`` (epoch seconds), from the process ``pid``."""

    service: str
    pid: int
    written_at: float
    requests: tuple[tuple[int | None, str | None, str, int], ...]  # version, replica, class, count
    failures: tuple[tuple[int | None, str | None, str, int], ...]  # version, replica, Failure, count
    latency: tuple[LatencyRow, ...]
    in_flight: tuple[tuple[str, int], ...]
    waiting: int
    retries: int
    ejections: int
    ejected: int
    worker: int | None = None  # which worker of a load balancer on several processes (``lb.workers``)


def metrics_dir(home: Path) -> Path:
    """Where the load balancers of ``home`` publish their snapshots."""
    return home / "metrics" / "lb"


def metrics_path(home: Path, service: str, worker: int | None = None) -> Path:
    """The snapshot file of ``service``'s load balancer; with several worker processes (``lb.workers``),
    worker ``worker``'s (``<service>.worker-<k>.json``: a service name has no dot), which the exporter
    serves with a ``worker`` label."""
    return metrics_dir(home) / (f"{service}.json" if worker is None else f"{service}.worker-{worker}.json")


def write_snapshot(path: Path, snapshot: LbSnapshot) -> None:
    """Replace ``path`` with ``snapshot`` atomically (a reader sees the old file or the new one, whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(encode(snapshot), separators=(",", ":")))
    os.replace(temporary, path)


def read_snapshot(path: Path) -> LbSnapshot:
    """The snapshot at ``path``. Raises ``OSError`` when it cannot be read, ``ValueError`` when it is not one."""
    return decode(LbSnapshot, json.loads(path.read_text()), str(path))  # type: ignore[no-any-return]


def read_snapshots(paths: Iterable[Path]) -> list[LbSnapshot]:
    """The snapshots at ``paths`` that can be read (a file being replaced or damaged is skipped)."""
    snapshots = []
    for path in paths:
        try:
            snapshots.append(read_snapshot(path))
        except (OSError, ValueError):
            continue
    return snapshots

