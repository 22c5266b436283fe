"""The replica count the controller steers to, from a replica policy and the autoscaler's state. Pure.

Apart from the policies (``autoscalers.dispatch``): what only reads a target, as `serve status` does,
imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skyserve_lite.autoscalers.base import AutoscalerState, clip

if TYPE_CHECKING:
    from skyserve_lite.spec.model import ReplicaPolicy


def carry_over(state: AutoscalerState | None, policy: ReplicaPolicy, version: int) -> AutoscalerState:
    """The state to decide from for ``version``: a new version's bounds apply at once (the target is
    re-clipped without waiting for the delays) and the counters restart."""
    if state is None:
        return AutoscalerState(version=version, target=policy.min_replicas)
    if state.version == version:
        return state
    if not policy.is_autoscaling:
        return AutoscalerState(version=version, target=policy.min_replicas)
    return AutoscalerState(version=version, target=clip(state.target, policy.min_replicas, policy.max_replicas))


def compute_target_replicas(policy: ReplicaPolicy, state: AutoscalerState | None = None) -> int:
    """The replica count to steer to: ``min_replicas`` for a fixed policy, else the autoscaler's target
    clipped to the policy's bounds (``min_replicas`` before the first decision); plus ``num_overprovision``
    (spare replicas above the target, beyond ``max_replicas`` too: they absorb a burst while the autoscaler's
    upscale delay holds)."""
    if not policy.is_autoscaling or state is None:
        return policy.min_replicas + policy.num_overprovision
    return clip(state.target, policy.min_replicas, policy.max_replicas) + policy.num_overprovision
