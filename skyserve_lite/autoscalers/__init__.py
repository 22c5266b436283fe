"""Autoscaling policies: fixed, request rate, in-flight requests (Ray Serve compatible), spot/on-demand
fallback, and a simulator. All pure: injected time, state held in explicit values, no I/O."""

from skyserve_lite.autoscalers.base import Autoscaler, AutoscalerState, Decision, Metrics
from skyserve_lite.autoscalers.dispatch import carry_over, compute_target_replicas, make_autoscaler
from skyserve_lite.autoscalers.fallback import MarketTargets, plan_market_targets
from skyserve_lite.autoscalers.ongoing_requests import (
    CONTROL_LOOP_PERIOD_S,
    AutoscalingConfig,
    BasicAutoscalingPolicy,
    calculate_desired_num_replicas,
)

__all__ = [
    "CONTROL_LOOP_PERIOD_S",
    "Autoscaler",
    "AutoscalerState",
    "AutoscalingConfig",
    "BasicAutoscalingPolicy",
    "Decision",
    "MarketTargets",
    "Metrics",
    "calculate_desired_num_replicas",
    "carry_over",
    "compute_target_replicas",
    "make_autoscaler",
    "plan_market_targets",
]
