"""Fixed: `service.replicas: N`, or a `replica_policy` without a target -> always `min_replicas`."""

from __future__ import annotations

from dataclasses import dataclass

from skyserve_lite.autoscalers.base import AutoscalerState, Decision, Metrics


@dataclass(frozen=True)
class FixedAutoscaler:
    replicas: int
    name: str = "fixed"
    period_seconds: float = 0.0

    def initial_state(self, version: int) -> AutoscalerState:
        return AutoscalerState(version=version, target=self.replicas)

    def decide(self, state: AutoscalerState, metrics: Metrics) -> Decision:
        # No decision time is kept: nothing here changes with time, so a steady service writes nothing.
        new = AutoscalerState(version=state.version, target=self.replicas)
        return Decision(new, raw_target=self.replicas, decided=True)
