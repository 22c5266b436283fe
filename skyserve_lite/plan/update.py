"""The update plan: per live replica, reuse (same replica config) or replace (and why); then how many to
launch and which to terminate so that the new version's target is met. Pure; `--dry-run` renders it and
the controller pass applies the same decisions: reuse is ``spec.config``'s comparison in both, surplus
replicas go in ``find_scale_down_order``.

Worked numbers, both cases that must hold exactly:
- 2 replicas running, ``min_replicas`` raised to 3, nothing else changed: both are reused (2 kept),
  3 - 2 = 1 launched, nothing terminated.
- 2 replicas running, ``min_replicas`` lowered to 1: both are reused, 2 - 1 = 1 surplus is terminated
  (the newest, as both are READY on the same version), nothing launched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.autoscalers.dispatch import carry_over, compute_target_replicas
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.scaling import find_scale_down_order
from skyserve_lite.spec.config import FieldChange, find_config_changes
from skyserve_lite.spec.model import TaskSpec
from skyserve_lite.state.models import ReplicaRecord


class ReplicaAction(str, Enum):
    REUSE = "reuse"  # kept, its version bumped in place
    REPLACE = "replace"  # a new replica takes its place; it goes once the mode allows
    TERMINATE = "terminate"  # reused config, but more replicas than the new target


@dataclass(frozen=True)
class ReplicaDecision:
    replica_id: int
    version: int
    action: ReplicaAction
    reasons: tuple[FieldChange, ...] = ()


@dataclass(frozen=True)
class UpdatePlan:
    service: str
    from_version: int
    to_version: int
    mode: UpdateMode
    target_replicas: int
    replicas: tuple[ReplicaDecision, ...]
    launch: int

    @property
    def terminate(self) -> tuple[int, ...]:
        """Every replica that goes away: surplus ones at once, replaced ones as the mode allows."""
        return tuple(d.replica_id for d in self.replicas if d.action is not ReplicaAction.REUSE)

    def count(self, action: ReplicaAction) -> int:
        return sum(1 for d in self.replicas if d.action is action)

    def summary(self) -> str:
        return (f"reuse {self.count(ReplicaAction.REUSE)}, replace {self.count(ReplicaAction.REPLACE)}, "
                f"launch {self.launch}, terminate {self.count(ReplicaAction.TERMINATE)}")

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service, "from_version": self.from_version, "to_version": self.to_version,
            "mode": self.mode.value, "target_replicas": self.target_replicas,
            "replicas": [
                {"replica_id": d.replica_id, "version": d.version, "action": d.action.value,
                 "reasons": [{"path": c.path, "old": c.old, "new": c.new}
                             | ({"note": c.note} if c.note else {}) for c in d.reasons]}
                for d in self.replicas
            ],
            "launch": self.launch, "terminate": list(self.terminate), "summary": self.summary(),
        }


def _decision(replica: ReplicaRecord, changes: tuple[FieldChange, ...]) -> ReplicaDecision:
    """Reuse when nothing in the replica config differs, else replace, naming the differing fields."""
    action = ReplicaAction.REPLACE if changes else ReplicaAction.REUSE
    return ReplicaDecision(replica.replica_id, replica.version, action, changes)


def plan_update(service: str, from_version: int, to_version: int, mode: UpdateMode, new_spec: TaskSpec,
                version_specs: Mapping[int, TaskSpec], replicas: Sequence[ReplicaRecord],
                autoscaler: AutoscalerState | None = None) -> UpdatePlan:
    """The plan of moving ``service`` to ``new_spec``. Terminal and shutting-down replicas are left out:
    they are never reused. ``version_specs`` must hold the spec of every live replica's version.
    ``autoscaler`` is the current autoscaling state: its target, re-clipped to the new bounds, is the
    target (``min_replicas`` without one)."""
    live = [r for r in replicas if r.status.is_live]
    # The comparison depends only on the replica's version: compare each version once, not each replica
    # (10,000 replicas in 5 versions: 5 comparisons).
    changes = {v: find_config_changes(version_specs[v], new_spec) for v in {r.version for r in live}}
    decisions = {r.replica_id: _decision(r, changes[r.version]) for r in live}
    reused = [r for r in live if decisions[r.replica_id].action is ReplicaAction.REUSE]
    policy = new_spec.service.replica_policy
    target = compute_target_replicas(policy, carry_over(autoscaler, policy, to_version) if autoscaler else None)
    surplus = find_scale_down_order(reused)[:max(0, len(reused) - target)]
    for replica in surplus:
        decisions[replica.replica_id] = ReplicaDecision(
            replica.replica_id, replica.version, ReplicaAction.TERMINATE,
            (FieldChange("target_replicas", len(reused), target, note="more reusable replicas than the target"),))
    return UpdatePlan(
        service=service, from_version=from_version, to_version=to_version, mode=mode, target_replicas=target,
        replicas=tuple(decisions[r.replica_id] for r in sorted(live, key=lambda r: r.replica_id)),
        launch=max(0, target - (len(reused) - len(surplus))),
    )
