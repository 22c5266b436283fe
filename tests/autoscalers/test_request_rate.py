"""Request-rate policy, rule by rule, with explicit time: thresholds, counter resets, wake from zero."""

from __future__ import annotations

import pytest

from skyserve_lite.autoscalers.base import AutoscalerState, Metrics
from skyserve_lite.autoscalers.request_rate import RequestRateAutoscaler

POLICY = RequestRateAutoscaler(min_replicas=1, max_replicas=5, target_qps_per_replica=2,
                               upscale_delay_seconds=60, downscale_delay_seconds=100)


def at(now: float, qps: float) -> Metrics:
    return Metrics(now=now, requests_in_window=round(qps * 60))


def run(policy: RequestRateAutoscaler, start: AutoscalerState, loads: list[float]) -> list[int]:
    """Decide once per period with the given qps; return the target after each decision."""
    state, targets = start, []
    for index, qps in enumerate(loads):
        state = policy.decide(state, at(index * policy.period_seconds, qps)).state
        targets.append(state.target)
    return targets


@pytest.mark.parametrize(
    ("qps", "raw"),
    [(0, 1), (0.1, 1), (2, 1), (2.01, 2), (5, 3), (9.9, 5), (100, 5)],
    ids=["idle-min", "tiny", "exactly-one", "just-over", "ceil", "near-max", "clipped-to-max"],
)
def test_raw_target_is_ceil_of_qps_over_target_clipped(qps: float, raw: int) -> None:
    assert POLICY.decide(POLICY.initial_state(1), at(0, qps)).raw_target == raw


def test_thresholds_are_delay_over_the_20s_period() -> None:
    assert (POLICY.upscale_threshold, POLICY.downscale_threshold) == (3, 5)
    default = RequestRateAutoscaler(1, 5, 2, upscale_delay_seconds=300, downscale_delay_seconds=1200)
    assert (default.upscale_threshold, default.downscale_threshold) == (15, 60)


@pytest.mark.parametrize(
    ("start", "loads", "targets"),
    [
        pytest.param(1, [5, 5, 5], [1, 1, 3], id="upscale-after-3-consecutive"),
        pytest.param(3, [1, 1, 1, 1, 1], [3, 3, 3, 3, 1], id="downscale-after-5-consecutive"),
        pytest.param(1, [5, 5, 2, 5, 5, 5], [1, 1, 1, 1, 1, 3], id="equal-decision-resets-upscale"),
        pytest.param(3, [1, 1, 1, 1, 9, 1, 1, 1, 1, 1], [3, 3, 3, 3, 3, 3, 3, 3, 3, 1],
                     id="opposite-decision-resets-downscale"),
        pytest.param(2, [4, 4, 4], [2, 2, 2], id="equal-keeps"),
        pytest.param(1, [5, 9, 9], [1, 1, 5], id="applies-the-latest-raw-target"),
    ],
)
def test_hysteresis(start: int, loads: list[float], targets: list[int]) -> None:
    assert run(POLICY, AutoscalerState(version=1, target=start), loads) == targets


def test_zero_delay_applies_at_the_first_decision() -> None:
    eager = RequestRateAutoscaler(1, 5, 2, upscale_delay_seconds=0, downscale_delay_seconds=0)
    assert run(eager, eager.initial_state(1), [5, 1]) == [3, 1]


def test_no_decision_between_periods() -> None:
    state = POLICY.decide(POLICY.initial_state(1), at(0, 5)).state
    assert state.upscale_count == 1
    between = POLICY.decide(state, at(10, 5))
    assert not between.decided and between.state == state
    assert between.held_back == "upscale delay 1/3"
    assert POLICY.decide(state, at(20, 5)).state.upscale_count == 2


def test_held_back_names_the_rule_and_progress() -> None:
    decision = POLICY.decide(AutoscalerState(1, target=3), at(0, 1))
    assert decision.held_back == "downscale delay 1/5"
    assert decision.qps == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("requests", "waiting", "target"),
    [(0, 0, 0), (1, 0, 1), (600, 0, 5), (0, 3, 1)],
    ids=["idle-stays-at-zero", "first-request-wakes", "wakes-to-raw-target", "held-request-wakes"],
)
def test_wake_from_zero_is_immediate(requests: int, waiting: int, target: int) -> None:
    policy = RequestRateAutoscaler(0, 5, 2, upscale_delay_seconds=300, downscale_delay_seconds=1200)
    state = AutoscalerState(version=1, target=0, last_decision_at=0.0)
    # Only 2 s after the last decision and with a 15-decision upscale delay: waking must not wait.
    decision = policy.decide(state, Metrics(now=2.0, requests_in_window=requests, waiting_requests=waiting))
    assert decision.state.target == target


def test_scale_to_zero_after_the_downscale_delay() -> None:
    policy = RequestRateAutoscaler(0, 3, 2, upscale_delay_seconds=0, downscale_delay_seconds=40)
    # int(40 / 20) = 2 consecutive decisions for 0 replicas: the second one applies it.
    assert run(policy, AutoscalerState(1, target=1), [0, 0, 0]) == [1, 0, 0]
