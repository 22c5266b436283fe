"""What a pass samples into the replica history (``state.history``). Pure: snapshots and plan in, samples out.

The executor writes the samples of the first pass in each minute and skips the rest (``Executor.
record_replica_history``), so at a 2 s interval one write stands for 30 passes.
"""

from __future__ import annotations

from collections.abc import Sequence

from skyserve_lite.controller.pass_types import PassPlan, ServiceSnapshot
from skyserve_lite.state.history import ReplicaSample
from skyserve_lite.state.models import ReplicaStatus


def find_replica_samples(snapshots: Sequence[ServiceSnapshot], plan: PassPlan, now: float) -> tuple[ReplicaSample, ...]:
    """One sample per autoscaled service that this pass keeps: the READY replicas once ``plan`` is applied
    (a replica it marks READY counts, one it removes does not) and the autoscaler's target after its
    decision. Fixed-size services and services going down are not sampled: status shows no history for
    them."""
    minute = int(now // 60)
    updated = {(r.service, r.replica_id): r for r in plan.replica_updates}
    removed = set(plan.removals)
    decided = {name: state for name, state, _observed in plan.autoscaler_updates}
    samples = []
    for snapshot in snapshots:
        service = snapshot.service
        policy = snapshot.spec.service.replica_policy
        if service.deleting or service.name in plan.deletions or not policy.is_autoscaling:
            continue
        replicas = [updated.get((service.name, r.replica_id), r) for r in snapshot.replicas
                    if (service.name, r.replica_id) not in removed]
        ready = sum(1 for r in replicas if r.status is ReplicaStatus.READY)
        state = decided.get(service.name, snapshot.autoscaler)
        target = policy.min_replicas if state is None else state.target
        samples.append(ReplicaSample(service.name, minute, ready, target))
    return tuple(samples)
