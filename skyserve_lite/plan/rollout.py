"""Rollout strategies behind one dispatch: each takes one step per controller pass and returns.

A step looks at the replicas of the current version (``current``, reused ones included) and the live
replicas still on an older version whose config differs (``outdated``), and says which outdated ones to
terminate now and which versions the load balancer may send traffic to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from skyserve_lite.state.models import ReplicaRecord


class UpdateMode(str, Enum):
    ROLLING = "rolling"
    BLUE_GREEN = "blue_green"
    CANARY = "canary"  # a share of the traffic in steps, judged, then promoted or rolled back (``plan.canary``)

    @classmethod
    def of_version(cls, stored_mode: str) -> UpdateMode:
        """The mode a stored version rolls out with; the first version ("initial") has nothing to replace."""
        return cls.ROLLING if stored_mode == "initial" else cls(stored_mode)


@dataclass(frozen=True)
class RolloutStep:
    terminate: tuple[int, ...]  # replica ids of outdated replicas to terminate in this pass
    active_versions: tuple[int, ...]  # versions whose READY replicas get traffic


def plan_rollout_step(mode: UpdateMode, version: int, current: Sequence[ReplicaRecord],
                      outdated: Sequence[ReplicaRecord], target: int, min_replicas: int) -> RolloutStep:
    """Dispatch to the strategy of ``mode``. ``version`` is the current version. A canary's steps are state
    (``controller.canary_steps``); once promoted it drains the old replicas as a rolling update does."""
    from skyserve_lite.plan import blue_green, rolling

    if mode is UpdateMode.BLUE_GREEN:
        return blue_green.plan_step(version, current, outdated, min_replicas)
    return rolling.plan_step(version, current, outdated, target)
