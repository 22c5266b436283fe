"""Autoscaling policies: fixed, request rate, in-flight requests (Ray Serve compatible), spot/on-demand
fallback, and a simulator. All pure: injected time, state held in explicit values, no I/O.

Nothing is imported with the package: each caller inside sky-lite imports the module it uses (``base`` for the
state values, ``dispatch`` for a policy's autoscaler, ``target`` for the target), so that reading a stored state
loads no policy. The names this package exported before they moved to their modules are still importable from
here (``from skyserve_lite.autoscalers import AutoscalingConfig`` is the documented Ray Serve compatible import):
``__getattr__`` (PEP 562) imports a name's module on first use only, so `serve status` still loads no policy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see; at run time ``__getattr__`` below imports these on first use
    from skyserve_lite.autoscalers.base import Autoscaler, AutoscalerState, Decision, Metrics
    from skyserve_lite.autoscalers.dispatch import make_autoscaler
    from skyserve_lite.autoscalers.fallback import MarketTargets, plan_market_targets
    from skyserve_lite.autoscalers.ongoing_requests import (
        CONTROL_LOOP_PERIOD_S,
        AutoscalingConfig,
        BasicAutoscalingPolicy,
        calculate_desired_num_replicas,
    )
    from skyserve_lite.autoscalers.target import carry_over, compute_target_replicas

# Every name the package exported when it imported its modules eagerly (up to d831ec6), by the module that
# defines it now.
_EXPORTS: dict[str, str] = {
    "Autoscaler": "base",
    "AutoscalerState": "base",
    "Decision": "base",
    "Metrics": "base",
    "make_autoscaler": "dispatch",
    "MarketTargets": "fallback",
    "plan_market_targets": "fallback",
    "CONTROL_LOOP_PERIOD_S": "ongoing_requests",
    "AutoscalingConfig": "ongoing_requests",
    "BasicAutoscalingPolicy": "ongoing_requests",
    "calculate_desired_num_replicas": "ongoing_requests",
    "carry_over": "target",
    "compute_target_replicas": "target",
}

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


def __getattr__(name: str) -> object:
    """The exported ``name``, imported from its module on first use (and kept here, so the next look-up does
    not come back). Raises AttributeError naming this package for any other name."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
