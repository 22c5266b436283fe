"""Values shared by the autoscaling policies. A policy is pure: state and metrics in, a decision out.

The state lives in the store between controller passes, so a controller restart loses neither the request
window (request counts are stored by the load balancer) nor the hysteresis counters (stored here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class AutoscalerState:
    """What a policy remembers between decisions.

    ``version`` is the service version whose bounds ``target`` honours: after an update the target is
    re-clipped to the new bounds at once and the counters restart.
    """

    version: int
    target: int
    upscale_count: int = 0
    downscale_count: int = 0
    last_decision_at: float | None = None


@dataclass(frozen=True)
class Metrics:
    """What the load balancers reported, as of ``now``."""

    now: float
    requests_in_window: int = 0  # requests that arrived in the last ``window_seconds``
    window_seconds: float = 60.0
    ongoing_requests: tuple[float, ...] = ()  # in-flight requests of each replica that reports
    waiting_requests: int = 0  # requests the load balancer holds because no replica is READY
    # As the load balancer reports them, by replica url; the controller turns these into
    # ``ongoing_requests`` for the replicas READY now.
    ongoing_requests_by_url: tuple[tuple[str, int], ...] = ()

    @property
    def qps(self) -> float:
        return self.requests_in_window / self.window_seconds


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the new state, plus what it saw and why a change may be held back."""

    state: AutoscalerState
    raw_target: int  # what the metrics ask for now, clipped to the bounds
    held_back: str | None = None  # "upscale delay 4/15": the rule holding a change back
    decided: bool = False  # False between decision periods: ``state`` is the old one
    qps: float | None = None
    average_ongoing: float | None = None

    @property
    def target(self) -> int:
        return self.state.target


class Autoscaler(Protocol):
    """A replica-count policy. ``decide`` is pure and idempotent for equal inputs."""

    @property
    def name(self) -> str:
        ...

    @property
    def period_seconds(self) -> float:
        """Decisions happen at most this often; calls in between keep the state."""
        ...

    def initial_state(self, version: int) -> AutoscalerState:
        ...

    def decide(self, state: AutoscalerState, metrics: Metrics) -> Decision:
        ...


def clip(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def is_due(state: AutoscalerState, now: float, period_seconds: float) -> bool:
    return state.last_decision_at is None or now - state.last_decision_at >= period_seconds - 1e-9
