"""Which policy a replica policy means, and the target the controller steers to."""

from __future__ import annotations

from dataclasses import replace

from skyserve_lite.autoscalers.base import Autoscaler, AutoscalerState, clip
from skyserve_lite.autoscalers.fixed import FixedAutoscaler
from skyserve_lite.autoscalers.ongoing_requests import OngoingRequestsAutoscaler
from skyserve_lite.autoscalers.request_rate import RequestRateAutoscaler
from skyserve_lite.spec.model import ReplicaPolicy


def make_autoscaler(policy: ReplicaPolicy, period_seconds: float | None = None) -> Autoscaler:
    """The policy for ``policy``; ``period_seconds`` overrides the decision period (tests, simulations)."""
    scaler: RequestRateAutoscaler | OngoingRequestsAutoscaler
    if policy.target_qps_per_replica is not None:
        scaler = RequestRateAutoscaler(policy.min_replicas, policy.max_replicas, policy.target_qps_per_replica,
                                       policy.upscale_delay_seconds, policy.downscale_delay_seconds)
    elif policy.target_ongoing_requests_per_replica is not None:
        scaler = OngoingRequestsAutoscaler(
            policy.min_replicas, policy.max_replicas, policy.target_ongoing_requests_per_replica,
            policy.upscale_delay_seconds, policy.downscale_delay_seconds)
    else:
        return FixedAutoscaler(policy.min_replicas)
    return scaler if period_seconds is None else replace(scaler, period_seconds=period_seconds)


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
