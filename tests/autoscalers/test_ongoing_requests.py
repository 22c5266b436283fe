"""In-flight policy. The tests against BasicAutoscalingPolicy use Ray Serve's public names and call
shapes, as a suite written for Ray's policy would."""

from __future__ import annotations

import pytest

from skyserve_lite.autoscalers.base import AutoscalerState, Metrics
from skyserve_lite.autoscalers.ongoing_requests import (
    CONTROL_LOOP_PERIOD_S,
    AutoscalingConfig,
    BasicAutoscalingPolicy,
    OngoingRequestsAutoscaler,
    calculate_desired_num_replicas,
)


def test_example_from_the_docs() -> None:
    config = AutoscalingConfig(min_replicas=1, max_replicas=10, target_num_ongoing_requests_per_replica=5,
                               upscale_delay_s=0.0, downscale_delay_s=0.0)
    policy = BasicAutoscalingPolicy(config)
    assert policy.get_decision_num_replicas(current_num_ongoing_requests=[7, 1, 8, 4], curr_target_num_replicas=4,
                                            current_handle_queued_queries=0) == 4
    assert policy.get_decision_num_replicas([7, 1, 8, 4], 4) == 4


def test_control_loop_period_is_at_most_10s() -> None:
    assert 0 < CONTROL_LOOP_PERIOD_S <= 10


@pytest.mark.parametrize(
    ("ongoing", "smoothing", "expected"),
    [
        pytest.param([2.0] * 10, 1.0, 20, id="scale-up-10x2"),
        pytest.param([0.5] * 10, 1.0, 5, id="scale-down-10x0.5"),
        pytest.param([4.0] * 10, 0.5, 25, id="smoothing-up"),
        pytest.param([0.25] * 10, 0.5, 7, id="smoothing-down"),
        pytest.param([150] * 10, 1.0, 11, id="clipped-to-max"),
    ],
)
def test_desired_replicas(ongoing: list[float], smoothing: float, expected: int) -> None:
    config = AutoscalingConfig(min_replicas=0, max_replicas=11 if expected == 11 else 100,
                               target_num_ongoing_requests_per_replica=100 if expected == 11 else 1,
                               smoothing_factor=smoothing)
    assert calculate_desired_num_replicas(autoscaling_config=config, current_num_ongoing_requests=ongoing) == expected


def test_bounds_hold_for_every_load() -> None:
    config = AutoscalingConfig(min_replicas=9, max_replicas=11, target_num_ongoing_requests_per_replica=100)
    for load in range(1, 300):
        assert 9 <= calculate_desired_num_replicas(config, [load] * 10) <= 11


def test_no_replicas_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot be zero"):
        calculate_desired_num_replicas(AutoscalingConfig(), [])


def test_upscale_and_downscale_delays_with_resets() -> None:
    config = AutoscalingConfig(min_replicas=1, max_replicas=2, target_num_ongoing_requests_per_replica=1,
                               upscale_delay_s=30.0, downscale_delay_s=600.0)
    policy = BasicAutoscalingPolicy(config)
    up_periods = int(30.0 / CONTROL_LOOP_PERIOD_S)
    down_periods = int(600.0 / CONTROL_LOOP_PERIOD_S)

    def decide(ongoing: list[float], target: int) -> int:
        return policy.get_decision_num_replicas(current_num_ongoing_requests=ongoing, curr_target_num_replicas=target)

    assert [decide([100], 1) for _ in range(up_periods)] == [1] * up_periods
    assert decide([100], 1) == 2
    assert [decide([0, 0], 2) for _ in range(down_periods)] == [2] * down_periods
    assert decide([0, 0], 2) == 1
    # Half-way to an upscale, a downscale decision resets the counter: the full delay again.
    for _ in range(up_periods // 2):
        assert decide([100], 1) == 1
    decide([0], 1)
    assert [decide([100], 1) for _ in range(up_periods)] == [1] * up_periods
    assert decide([100], 1) == 2


def test_replicas_starting_slowly_do_not_cause_a_downscale() -> None:
    config = AutoscalingConfig(min_replicas=1, max_replicas=200, target_num_ongoing_requests_per_replica=1,
                               upscale_delay_s=0, downscale_delay_s=100000)
    policy = BasicAutoscalingPolicy(config)
    assert policy.get_decision_num_replicas([100], 1) == 100
    assert policy.get_decision_num_replicas([100], 100) == 100
    assert policy.get_decision_num_replicas([100, 20, 3], 100) == 123
    assert policy.get_decision_num_replicas([6, 2, 1, 1], 123) == 123


@pytest.mark.parametrize("delay", [30.0, 0.0])
def test_fluctuating_load_never_flaps_with_a_delay(delay: float) -> None:
    config = AutoscalingConfig(min_replicas=1, max_replicas=10, target_num_ongoing_requests_per_replica=50,
                               upscale_delay_s=delay, downscale_delay_s=delay)
    policy = BasicAutoscalingPolicy(config)
    for trial in range(200):
        if trial % 2 == 0:
            assert policy.get_decision_num_replicas([100], 1) == (1 if delay else 2)
        else:
            assert policy.get_decision_num_replicas([20, 20], 2) == (2 if delay else 1)


@pytest.mark.parametrize(("queued", "target", "expected"), [(0, 0, 0), (5, 0, 1), (5, 3, 3)])
def test_no_replica_reporting_wakes_only_for_queued_requests(queued: int, target: int, expected: int) -> None:
    policy = BasicAutoscalingPolicy(AutoscalingConfig(min_replicas=0, max_replicas=5))
    assert policy.get_decision_num_replicas([], target, current_handle_queued_queries=queued) == expected


def test_controller_form_keeps_the_counter_in_its_state() -> None:
    scaler = OngoingRequestsAutoscaler(1, 10, target_ongoing_requests_per_replica=5, upscale_delay_seconds=20,
                                       downscale_delay_seconds=0, period_seconds=10)
    state = AutoscalerState(version=1, target=2)
    targets = []
    for step in range(3):
        decision = scaler.decide(state, Metrics(now=step * 10.0, ongoing_requests=(20.0, 20.0)))
        state = decision.state
        targets.append(state.target)
    # int(20 / 10) = 2 periods must pass; the change lands on the third consecutive decision.
    assert targets == [2, 2, 8]
    assert decision.average_ongoing == 20.0


@pytest.mark.parametrize(
    ("target", "requests", "waiting", "expected"),
    [(0, 0, 0, 0), (0, 3, 0, 1), (0, 0, 2, 1), (2, 3, 0, 2)],
    ids=["idle-zero-stays", "counted-request-wakes", "held-request-wakes", "nonzero-waits-for-reports"],
)
def test_controller_form_wakes_from_zero(target: int, requests: int, waiting: int, expected: int) -> None:
    scaler = OngoingRequestsAutoscaler(0, 4, target_ongoing_requests_per_replica=1, upscale_delay_seconds=60,
                                       downscale_delay_seconds=60)
    metrics = Metrics(now=5.0, requests_in_window=requests, waiting_requests=waiting)
    assert scaler.decide(AutoscalerState(version=1, target=target), metrics).state.target == expected
