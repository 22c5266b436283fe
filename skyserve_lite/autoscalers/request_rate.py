"""Request rate (SkyServe semantics): `replica_policy.target_qps_per_replica`.

qps = requests the load balancer saw in the last 60 s / 60; raw target = ceil(qps / target_qps_per_replica),
clipped to [min_replicas, max_replicas]. A decision is made every 20 s. A change is applied only after it
has been the decision for ``threshold = int(delay / 20)`` consecutive decisions (``upscale_delay_seconds``,
default 300 -> 15; ``downscale_delay_seconds``, default 1200 -> 60); a decision in the other direction, or an
equal one, resets both counters.

Worked numbers: target_qps_per_replica 2, 1-5 replicas, current target 1, 300 requests in the last minute:
qps 5.0, raw target ceil(5 / 2) = 3. With upscale_delay_seconds 60 the threshold is 3: the decisions at
t=0 and t=20 are held back ("upscale delay 1/3", "2/3"), the one at t=40 applies 3 replicas.

From a target of 0 (scale to zero), the first request scales to the raw target at once, on the very next
controller pass: waiting out a delay would leave the first user with a timeout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skyserve_lite.autoscalers.base import AutoscalerState, Decision, Metrics, clip, is_due

DECISION_PERIOD_S = 20.0


@dataclass(frozen=True)
class RequestRateAutoscaler:
    min_replicas: int
    max_replicas: int
    target_qps_per_replica: float
    upscale_delay_seconds: float
    downscale_delay_seconds: float
    period_seconds: float = DECISION_PERIOD_S
    name: str = "request_rate"

    @property
    def upscale_threshold(self) -> int:
        return int(self.upscale_delay_seconds / self.period_seconds)

    @property
    def downscale_threshold(self) -> int:
        return int(self.downscale_delay_seconds / self.period_seconds)

    def initial_state(self, version: int) -> AutoscalerState:
        return AutoscalerState(version=version, target=self.min_replicas)

    def raw_target(self, metrics: Metrics) -> int:
        wanted = math.ceil(metrics.qps / self.target_qps_per_replica - 1e-9)
        return clip(wanted, self.min_replicas, self.max_replicas)

    def decide(self, state: AutoscalerState, metrics: Metrics) -> Decision:
        raw = self.raw_target(metrics)
        if state.target == 0 and (metrics.requests_in_window > 0 or metrics.waiting_requests > 0):
            woken = max(raw, 1)
            new = AutoscalerState(state.version, woken, last_decision_at=metrics.now)
            return Decision(new, raw_target=woken, decided=True, qps=metrics.qps)
        if not is_due(state, metrics.now, self.period_seconds):
            return Decision(state, raw_target=raw, held_back=_describe_hold(self, state), qps=metrics.qps)
        up, down, target = 0, 0, state.target
        if raw > state.target:
            up = state.upscale_count + 1
            if up >= self.upscale_threshold:
                up, target = 0, raw
        elif raw < state.target:
            down = state.downscale_count + 1
            if down >= self.downscale_threshold:
                down, target = 0, raw
        new = AutoscalerState(state.version, target, up, down, last_decision_at=metrics.now)
        return Decision(new, raw_target=raw, held_back=_describe_hold(self, new), decided=True, qps=metrics.qps)


def _describe_hold(policy: RequestRateAutoscaler, state: AutoscalerState) -> str | None:
    if state.upscale_count:
        return f"upscale delay {state.upscale_count}/{policy.upscale_threshold}"
    if state.downscale_count:
        return f"downscale delay {state.downscale_count}/{policy.downscale_threshold}"
    return None
