"""Blue-green: traffic stays on the old version until the new one has ``min_replicas`` READY, then all of
it moves at once and every old replica is terminated.

Worked numbers: min_replicas 2, old v1 replicas 1 and 2 READY, new v2 replicas 3 READY and 4 STARTING:
one new READY < 2, so the load balancer keeps sending only to v1. When 4 is READY too, the step switches
the active version to v2 and terminates 1 and 2 in the same pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from skyserve_lite.plan.rollout import RolloutStep
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus


def plan_step(version: int, current: Sequence[ReplicaRecord], outdated: Sequence[ReplicaRecord],
              min_replicas: int) -> RolloutStep:
    ready_current = sum(1 for r in current if r.status is ReplicaStatus.READY)
    if ready_current >= min_replicas or not outdated:
        return RolloutStep(terminate=tuple(r.replica_id for r in outdated), active_versions=(version,))
    old_ready = sorted({r.version for r in outdated if r.status is ReplicaStatus.READY})
    # With no old replica READY there is nothing to protect: let the new version serve what it can.
    return RolloutStep(terminate=(), active_versions=tuple(old_ready) or (version,))
