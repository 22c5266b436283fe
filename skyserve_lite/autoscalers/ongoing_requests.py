"""In-flight requests (Ray Serve semantics): `replica_policy.target_ongoing_requests_per_replica`.

desired = ceil(replicas reporting x ((average in-flight per replica / target - 1) x smoothing + 1)), which
with the default smoothing 1.0 is ceil(total in-flight / target); clipped to [min, max]. ``smoothing`` is
Ray 2.7's upscale or downscale smoothing factor by the direction of the load (``AutoscalingConfig``; the
controller's form runs with 1.0, the task YAML does not set them). A change is applied
once the same direction has been decided for *more than* ``int(delay / CONTROL_LOOP_PERIOD_S)`` consecutive
periods; an equal decision resets the counter.

Worked numbers: target 5, in-flight [7, 1, 8, 4] on 4 replicas: average 5, desired ceil(4 x 1) = 4, equal
to the current 4, so nothing changes. In-flight [20, 20]: average 20, desired ceil(2 x 4) = 8.

``AutoscalingConfig``, ``BasicAutoscalingPolicy`` and ``calculate_desired_num_replicas`` keep the names and
signatures of Ray Serve's policy, so tests written against Ray's policy run against this module unchanged;
``get_decision_num_replicas`` takes both Ray 1.x's and Ray 2.x's argument orders (``ray_args``).
The controller uses ``OngoingRequestsAutoscaler``, the same arithmetic with its state held in the store.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import overload

from skyserve_lite.autoscalers.base import AutoscalerState, Decision, Metrics, clip, is_due
from skyserve_lite.autoscalers.ray_args import resolve_decision_args

# The controller's decision period for this policy.
CONTROL_LOOP_PERIOD_S = 10.0


@dataclass
class AutoscalingConfig:
    """Ray Serve's autoscaling config (the fields this policy reads, Ray 2.7's smoothing factors included).

    ``upscale_smoothing_factor`` and ``downscale_smoothing_factor`` are the gain for each direction; one left
    at None takes ``smoothing_factor`` (Ray's older, single factor). Raises ValueError naming the field."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_num_ongoing_requests_per_replica: float = 1.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    smoothing_factor: float = 1.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(self.min_replicas, 1):
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.target_num_ongoing_requests_per_replica <= 0:
            raise ValueError("target_num_ongoing_requests_per_replica must be greater than 0")
        _check_factor("smoothing_factor", self.smoothing_factor)
        for name in ("upscale_smoothing_factor", "downscale_smoothing_factor"):
            if getattr(self, name) is not None:
                _check_factor(name, getattr(self, name))

    def get_upscale_smoothing_factor(self) -> float:
        return self.smoothing_factor if self.upscale_smoothing_factor is None else self.upscale_smoothing_factor

    def get_downscale_smoothing_factor(self) -> float:
        return self.smoothing_factor if self.downscale_smoothing_factor is None else self.downscale_smoothing_factor


def _check_factor(name: str, value: object) -> None:
    # NaN fails every comparison and infinity overflows ceil(): neither is a gain.
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a number greater than 0; got {value!r}")


def calculate_desired_num_replicas(autoscaling_config: AutoscalingConfig,
                                   current_num_ongoing_requests: Sequence[float]) -> int:
    """The replica count the in-flight load asks for, clipped to the config's bounds (Ray 2.7's rules).

    The load's ratio to the target picks the gain: at or above 1 the upscale factor, below it the downscale
    one. 3 replicas with 2 in flight each, target 1: ratio 2; factor 1 -> ceil(3 x 2) = 6, factor 0.5 ->
    ceil(3 x 1.5) = 5. Raises ValueError for an empty list (no replica reports: see ``compute_wake_target``)."""
    current = len(current_num_ongoing_requests)
    if current == 0:
        raise ValueError("Number of replicas cannot be zero")
    average = sum(current_num_ongoing_requests) / current
    error_ratio = average / autoscaling_config.target_num_ongoing_requests_per_replica
    factor = (autoscaling_config.get_upscale_smoothing_factor() if error_ratio >= 1
              else autoscaling_config.get_downscale_smoothing_factor())
    desired = math.ceil(current * (1 + (error_ratio - 1) * factor) - 1e-9)
    if error_ratio == 0 and desired == current:
        # No load at all, yet a gain below 1/current rounds back up to the current count (1 replica, factor 0.5:
        # ceil(1 x 0.5) = 1), so the service would never reach min_replicas, 0 included: as Ray does, one
        # replica less per decision.
        desired -= 1
    return clip(desired, autoscaling_config.min_replicas, autoscaling_config.max_replicas)


def compute_wake_target(autoscaling_config: AutoscalingConfig, curr_target_num_replicas: int) -> int:
    """The target when requests wait and no replica reports (scaled to zero): Ray's ceil(1 x upscale factor),
    at least 1, never below the current target, and at most max_replicas (Ray's rule has no upper clip here;
    sky-lite keeps every target within the bounds). Factor 2.5 -> 3 replicas; 0.5 -> 1."""
    wake = clip(math.ceil(autoscaling_config.get_upscale_smoothing_factor()), 1, autoscaling_config.max_replicas)
    return max(wake, curr_target_num_replicas)


def step_counter(counter: int, desired: int, current_target: int, up_periods: int, down_periods: int
                 ) -> tuple[int, int]:
    """One period of Ray's hysteresis: positive counts scale-up decisions, negative scale-down ones.
    Returns the new counter and the target (changed only when the counter passed its threshold)."""
    if desired > current_target:
        counter = max(counter, 0) + 1
        if counter > up_periods:
            return 0, desired
    elif desired < current_target:
        counter = min(counter, 0) - 1
        if counter < -down_periods:
            return 0, desired
    else:
        counter = 0
    return counter, current_target


class BasicAutoscalingPolicy:
    """Ray Serve's stateful interface over ``step_counter``."""

    def __init__(self, config: AutoscalingConfig) -> None:
        self.config = config
        self.loop_period_s = CONTROL_LOOP_PERIOD_S
        self.scale_up_consecutive_periods = int(config.upscale_delay_s / self.loop_period_s)
        self.scale_down_consecutive_periods = int(config.downscale_delay_s / self.loop_period_s)
        self.decision_counter = 0

    @overload
    def get_decision_num_replicas(self, curr_target_num_replicas: int, current_num_ongoing_requests: Sequence[float],
                                  current_handle_queued_queries: float = 0) -> int:
        ...

    @overload
    def get_decision_num_replicas(self, current_num_ongoing_requests: Sequence[float], curr_target_num_replicas: int,
                                  current_handle_queued_queries: float = 0) -> int:
        ...

    def get_decision_num_replicas(self, *args: object, **kwargs: object) -> int:
        """The target after one decision period. Takes Ray 2.x's positional order (target, in-flight list,
        queued) and Ray 1.x's (in-flight list, target), told apart by the first argument's type, or the same
        names as keywords (``ray_args``). Raises TypeError naming an argument of the wrong kind."""
        call = resolve_decision_args(args, kwargs)
        ongoing, current_target = call.current_num_ongoing_requests, call.curr_target_num_replicas
        if not ongoing:
            # No replica reports: wake from zero when requests wait, else keep the target.
            if call.current_handle_queued_queries > 0:
                return compute_wake_target(self.config, current_target)
            return current_target
        desired = calculate_desired_num_replicas(self.config, ongoing)
        self.decision_counter, target = step_counter(
            self.decision_counter, desired, current_target, self.scale_up_consecutive_periods,
            self.scale_down_consecutive_periods)
        return target


@dataclass(frozen=True)
class OngoingRequestsAutoscaler:
    """The controller's form: the counter lives in ``AutoscalerState`` (upscale_count - downscale_count)."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests_per_replica: float
    upscale_delay_seconds: float
    downscale_delay_seconds: float
    period_seconds: float = CONTROL_LOOP_PERIOD_S
    name: str = "ongoing_requests"

    def initial_state(self, version: int) -> AutoscalerState:
        return AutoscalerState(version=version, target=self.min_replicas)

    def _config(self) -> AutoscalingConfig:
        return AutoscalingConfig(
            min_replicas=self.min_replicas, max_replicas=self.max_replicas,
            target_num_ongoing_requests_per_replica=self.target_ongoing_requests_per_replica,
            upscale_delay_s=self.upscale_delay_seconds, downscale_delay_s=self.downscale_delay_seconds)

    def decide(self, state: AutoscalerState, metrics: Metrics) -> Decision:
        ongoing = metrics.ongoing_requests
        average = sum(ongoing) / len(ongoing) if ongoing else None
        if not ongoing:
            # No replica reports (scaled to zero, or none READY yet): wake on any demand, held or counted.
            demand = metrics.waiting_requests > 0 or (state.target == 0 and metrics.requests_in_window > 0)
            target = compute_wake_target(self._config(), state.target) if demand else state.target
            new = AutoscalerState(state.version, target, last_decision_at=metrics.now)
            changed = target != state.target
            return Decision(new if changed else state, raw_target=target, decided=changed)
        desired = calculate_desired_num_replicas(self._config(), ongoing)
        if not is_due(state, metrics.now, self.period_seconds):
            return Decision(state, raw_target=desired, held_back=_hold(self, state), average_ongoing=average)
        up_periods = int(self.upscale_delay_seconds / self.period_seconds)
        down_periods = int(self.downscale_delay_seconds / self.period_seconds)
        counter, target = step_counter(state.upscale_count - state.downscale_count, desired, state.target,
                                       up_periods, down_periods)
        new = AutoscalerState(state.version, target, max(counter, 0), max(-counter, 0), metrics.now)
        return Decision(new, raw_target=desired, held_back=_hold(self, new), decided=True, average_ongoing=average)


def _hold(policy: OngoingRequestsAutoscaler, state: AutoscalerState) -> str | None:
    if state.upscale_count:
        return f"upscale delay {state.upscale_count}/{int(policy.upscale_delay_seconds / policy.period_seconds) + 1}"
    if state.downscale_count:
        periods = int(policy.downscale_delay_seconds / policy.period_seconds) + 1
        return f"downscale delay {state.downscale_count}/{periods}"
    return None
