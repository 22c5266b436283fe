"""The update plan as a value: per live replica, reuse / replace / terminate and why; the replicas launched;
the steps of the rollout. ``controller.forecast`` computes it by running the controller's own pass planner
forward, so what `serve update --dry-run` prints is what the controller does.

Worked numbers, both cases that must hold exactly:
- 2 replicas running, ``min_replicas`` raised to 3, nothing else changed: both are reused (2 kept),
  3 - 2 = 1 launched, nothing terminated: ``reuse 2, replace 0, launch 1, terminate 0``.
- 2 replicas running, the image changed: both are replaced, 2 launched, 2 terminated (rolling: each old
  one as a new one is READY): ``reuse 0, replace 2, launch 2, terminate 2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from skyserve_lite.plan.canary import CanaryStepPreview
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.spec.config import FieldChange


class ReplicaAction(str, Enum):
    REUSE = "reuse"  # kept, its version bumped in place
    REPLACE = "replace"  # its config differs: a new replica takes its place; it goes once the mode allows
    TERMINATE = "terminate"  # same config, but not wanted any more (more replicas than the target)


@dataclass(frozen=True)
class ReplicaDecision:
    """What becomes of one replica that is live when the update is planned."""

    replica_id: int
    version: int
    action: ReplicaAction
    reasons: tuple[FieldChange, ...] = ()


@dataclass(frozen=True)
class LaunchDecision:
    """One replica the update launches. ``kept`` is False for one that is terminated again before the
    rollout ends (an on-demand stand-in while spot replicas become READY)."""

    replica_id: int
    is_spot: bool
    kept: bool = True


@dataclass(frozen=True)
class PlanStep:
    """One controller pass of the rollout that launches or takes replicas out of traffic."""

    launch: tuple[int, ...] = ()
    drain: tuple[int, ...] = ()  # taken out of traffic now, terminated once drained
    active_versions: tuple[int, ...] = ()  # versions whose READY replicas get traffic after this step

    def describe(self) -> str:
        parts = []
        if self.launch:
            parts.append("launch " + ", ".join(map(str, self.launch)))
        if self.drain:
            parts.append("drain " + ", ".join(map(str, self.drain)))
        versions = ", ".join(map(str, self.active_versions))
        return "; ".join(parts) + f" (traffic: version{'s' if len(self.active_versions) > 1 else ''} {versions})"


@dataclass(frozen=True)
class UpdatePlan:
    service: str
    from_version: int
    to_version: int
    mode: UpdateMode
    target_replicas: int
    replicas: tuple[ReplicaDecision, ...]  # every replica live now, by id
    launches: tuple[LaunchDecision, ...] = ()
    steps: tuple[PlanStep, ...] = ()
    # False when the rollout did not settle within the forecast's pass limit (a planner bug to report).
    converged: bool = True
    notes: tuple[str, ...] = ()  # what the plan warns of (a `$NAME` nothing fills in)
    canary: tuple[CanaryStepPreview, ...] = ()  # mode canary: its steps, before the promotion

    @property
    def launch(self) -> int:
        return len(self.launches)

    @property
    def terminate(self) -> tuple[int, ...]:
        """Every replica the update terminates: replaced and surplus ones, and launched ones not kept."""
        gone = [d.replica_id for d in self.replicas if d.action is not ReplicaAction.REUSE]
        gone += [launch.replica_id for launch in self.launches if not launch.kept]
        return tuple(sorted(gone))

    def count(self, action: ReplicaAction) -> int:
        return sum(1 for d in self.replicas if d.action is action)

    def summary(self) -> str:
        temporary = sum(1 for launch in self.launches if not launch.kept)
        note = f" ({temporary} on demand until spot replicas are READY)" if temporary else ""
        return (f"reuse {self.count(ReplicaAction.REUSE)}, replace {self.count(ReplicaAction.REPLACE)}, "
                f"launch {self.launch}{note}, terminate {len(self.terminate)}")

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
            "launches": [{"replica_id": launch.replica_id, "spot": launch.is_spot, "kept": launch.kept}
                         for launch in self.launches],
            "steps": [{"launch": list(s.launch), "drain": list(s.drain), "active_versions": list(s.active_versions)}
                      for s in self.steps],
            "launch": self.launch, "terminate": list(self.terminate), "summary": self.summary(),
            "converged": self.converged, "notes": list(self.notes),
        } | ({"canary": [{"percent": c.percent, "new_replicas": c.new_replicas, "bake_seconds": c.bake_seconds,
                          "launch": list(c.launch)} for c in self.canary]} if self.canary else {})
