"""How many replicas a service wants, which to let go first, and when to stop launching. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus


def find_scale_down_order(replicas: Sequence[ReplicaRecord]) -> list[ReplicaRecord]:
    """Live replicas in the order they should be terminated when the target shrinks.

    Not-yet-ready before ready (they serve nothing yet), older versions before newer (they are on their
    way out), and among equals the newest replica first (the oldest has proven itself longest).
    E.g. r1 v1 READY, r2 v1 STARTING, r3 v2 READY, r4 v1 READY -> r2, r4, r1, r3.
    """
    return sorted(
        replicas,
        key=lambda r: (r.status is ReplicaStatus.READY, r.version, -r.replica_id),
    )


def find_recent_failures(replicas: Sequence[ReplicaRecord], version: int) -> list[ReplicaRecord]:
    """Replicas of ``version`` that failed without ever becoming ready, since one last became ready."""
    # ``is_app_failure``: a failure of the workload itself, not the cloud taking a spot instance back.
    failed = [r for r in replicas
              if r.status.is_app_failure and r.version == version and r.first_ready_at is None]
    if not failed:  # the usual case, asked three times a service per pass: one scan, no second
        return failed
    last_ready = max((r.first_ready_at for r in replicas
                      if r.version == version and r.first_ready_at is not None), default=None)
    return [r for r in failed if last_ready is None or r.launched_at > last_ready]


def is_launch_blocked(recent_failures: Sequence[ReplicaRecord], failure_limit: int) -> bool:
    """True once ``failure_limit`` replicas of the version failed before ever becoming ready, counting
    since a replica of the version last became ready (``recent_failures``: ``find_recent_failures`` of the
    version's replicas, which the controller counts once per pass).

    With the default limit 3: a `run` that exits at once fails replicas 1, 2 and 3, then launching stops
    instead of starting a fourth copy of a broken command every pass. Replicas of older versions that
    still serve do not lift the block: an update to a broken version must not relaunch forever.
    """
    return len(recent_failures) >= failure_limit
