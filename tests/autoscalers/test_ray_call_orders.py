"""``BasicAutoscalingPolicy.get_decision_num_replicas`` as Ray 1.x and Ray 2.x call it: Ray 2.x passes
(curr_target_num_replicas, current_num_ongoing_requests, current_handle_queued_queries) by position, Ray 1.x
(current_num_ongoing_requests, curr_target_num_replicas); both by name."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from skyserve_lite.autoscalers.ongoing_requests import AutoscalingConfig, BasicAutoscalingPolicy
from skyserve_lite.autoscalers.ray_args import DecisionArgs, resolve_decision_args

TARGET, ONGOING, QUEUED = "curr_target_num_replicas", "current_num_ongoing_requests", "current_handle_queued_queries"

# Target 2 with [20, 20] in flight against a target of 5 each: 8 replicas wanted.
TWO_AT_20 = DecisionArgs(2, (20.0, 20.0), 0.0)


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        pytest.param((2, [20, 20], 3), {}, DecisionArgs(2, (20.0, 20.0), 3.0), id="ray2-positional"),
        pytest.param((2, [20, 20]), {}, TWO_AT_20, id="ray2-positional-no-queued"),
        pytest.param(([20, 20], 2), {}, TWO_AT_20, id="ray1-positional"),
        pytest.param(([20, 20], 2, 3), {}, DecisionArgs(2, (20.0, 20.0), 3.0), id="ray1-positional-with-queued"),
        pytest.param((), {TARGET: 2, ONGOING: [20, 20], QUEUED: 3}, DecisionArgs(2, (20.0, 20.0), 3.0),
                     id="keywords"),
        pytest.param((), {ONGOING: [20, 20], TARGET: 2}, TWO_AT_20, id="keywords-ray1-order"),
        pytest.param((2,), {ONGOING: [20, 20]}, TWO_AT_20, id="ray2-target-then-keyword"),
        pytest.param(([20, 20],), {TARGET: 2}, TWO_AT_20, id="ray1-list-then-keyword"),
        pytest.param(((20, 20.0), 2), {}, TWO_AT_20, id="tuple-of-loads"),
        pytest.param((2.0, [20, 20]), {}, TWO_AT_20, id="whole-float-target"),
        pytest.param(([], 0, 5), {}, DecisionArgs(0, (), 5.0), id="no-replica-reports"),
        pytest.param((0, []), {QUEUED: 5}, DecisionArgs(0, (), 5.0), id="ray2-queued-by-keyword"),
    ],
)
def test_resolves_every_call_shape(args: tuple[object, ...], kwargs: dict[str, object],
                                   expected: DecisionArgs) -> None:
    assert resolve_decision_args(args, kwargs) == expected


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        pytest.param(("2", [20]), {}, TypeError,
                     r"first argument must be curr_target_num_replicas, a number \(Ray 2\.x.*or "
                     r"current_num_ongoing_requests, a sequence of numbers \(Ray 1\.x.*got str '2'",
                     id="string-first"),
        pytest.param((None, [20]), {}, TypeError, "first argument must be .*got NoneType None", id="none-first"),
        pytest.param((True, [20]), {}, TypeError, "first argument must be .*got bool True", id="bool-first"),
        pytest.param(({0: 20}, 2), {}, TypeError, "first argument must be .*got dict", id="dict-first"),
        pytest.param((2, 3), {}, TypeError, "current_num_ongoing_requests must be a sequence of numbers.*got int 3",
                     id="ray2-two-numbers"),
        pytest.param((2, "20"), {}, TypeError, "current_num_ongoing_requests must be a sequence", id="ray2-string"),
        pytest.param(([20], [2]), {}, TypeError, "curr_target_num_replicas must be a whole number.*got list",
                     id="ray1-two-lists"),
        pytest.param((2.5, [20]), {}, TypeError, "curr_target_num_replicas must be a whole number.*2.5",
                     id="fractional-target"),
        pytest.param((2, [1, "x"]), {}, TypeError, r"current_num_ongoing_requests\[1\] must be a number.*'x'",
                     id="load-not-a-number"),
        pytest.param((2, [20], "3"), {}, TypeError, "current_handle_queued_queries must be a number",
                     id="queued-not-a-number"),
        pytest.param((2, [20], 0, 9), {}, TypeError, "at most 3 arguments", id="too-many"),
        pytest.param((2, [20]), {TARGET: 2}, TypeError, "multiple values for argument 'curr_target_num_replicas'",
                     id="target-twice"),
        pytest.param(([20],), {ONGOING: [20], TARGET: 1}, TypeError,
                     "multiple values for argument 'current_num_ongoing_requests'", id="loads-twice"),
        pytest.param((), {TARGET: 2}, TypeError, "missing required argument 'current_num_ongoing_requests'",
                     id="loads-missing"),
        pytest.param(([20],), {}, TypeError, "missing required argument 'curr_target_num_replicas'",
                     id="target-missing"),
        pytest.param((), {TARGET: 2, ONGOING: [20], "current_num_replicas": 1}, TypeError,
                     "unexpected keyword argument 'current_num_replicas'", id="unknown-keyword"),
        pytest.param((-1, [20]), {}, ValueError, "curr_target_num_replicas must be 0 or more", id="negative-target"),
        pytest.param((2, [20, -1]), {}, ValueError, r"current_num_ongoing_requests\[1\] must be a finite number",
                     id="negative-load"),
        pytest.param((2, [math.nan]), {}, ValueError, r"current_num_ongoing_requests\[0\]", id="nan-load"),
        pytest.param((2, [20], math.inf), {}, ValueError, "current_handle_queued_queries must be a finite",
                     id="infinite-queued"),
    ],
)
def test_rejects_what_neither_ray_passes(args: tuple[object, ...], kwargs: dict[str, object],
                                         error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        resolve_decision_args(args, kwargs)


def _policy(delay_s: float = 0.0) -> BasicAutoscalingPolicy:
    return BasicAutoscalingPolicy(AutoscalingConfig(min_replicas=1, max_replicas=10,
                                                    target_num_ongoing_requests_per_replica=5,
                                                    upscale_delay_s=delay_s, downscale_delay_s=delay_s))


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda p: p.get_decision_num_replicas(2, [20, 20], 0), id="ray2-positional"),
        pytest.param(lambda p: p.get_decision_num_replicas([20, 20], 2), id="ray1-positional"),
        pytest.param(lambda p: p.get_decision_num_replicas(curr_target_num_replicas=2,
                                                           current_num_ongoing_requests=[20, 20],
                                                           current_handle_queued_queries=0), id="ray2-keywords"),
        pytest.param(lambda p: p.get_decision_num_replicas(current_num_ongoing_requests=[20, 20],
                                                           curr_target_num_replicas=2), id="ray1-keywords"),
    ],
)
def test_the_policy_decides_the_same_for_either_order(call: Callable[[BasicAutoscalingPolicy], int]) -> None:
    # Average 20 against a target of 5 each: ceil(2 x 4) = 8.
    assert call(_policy()) == 8


def test_ray2_positional_wakes_from_zero_on_queued_queries() -> None:
    assert _policy().get_decision_num_replicas(0, [], 5) == 1
    assert _policy().get_decision_num_replicas(0, [], 0) == 0


def test_a_rejected_call_leaves_the_counter_alone() -> None:
    policy = _policy(delay_s=30.0)  # int(30 / 10) = 3 periods before a change
    assert policy.get_decision_num_replicas(2, [20, 20]) == 2
    assert policy.decision_counter == 1
    decide: Callable[..., Any] = policy.get_decision_num_replicas
    with pytest.raises(TypeError, match="current_num_ongoing_requests must be a sequence"):
        decide(2, 20)
    assert policy.decision_counter == 1
