"""Which policy a replica policy means (the target it steers to: ``autoscalers.target``)."""

from __future__ import annotations

from dataclasses import replace

from skyserve_lite.autoscalers.base import Autoscaler
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
