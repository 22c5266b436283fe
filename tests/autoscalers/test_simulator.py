"""The simulator runs the controller's policy code over a CSV trace."""

from __future__ import annotations

import pytest

from skyserve_lite.autoscalers.simulator import parse_trace, requests_between, simulate
from skyserve_lite.errors import UsageError
from skyserve_lite.spec.model import ReplicaPolicy

POLICY = ReplicaPolicy(min_replicas=1, max_replicas=4, target_qps_per_replica=2, upscale_delay_seconds=40,
                       downscale_delay_seconds=60)


def test_rates_hold_until_the_next_row() -> None:
    trace = parse_trace("time_s,qps\n0,1\n30,3\n", "t.csv")
    assert requests_between(trace, 0, 60) == pytest.approx(30 * 1 + 30 * 3)
    assert requests_between(trace, -60, 0) == 0
    assert requests_between(trace, 100, 160) == pytest.approx(180)


def test_one_decision_per_period_with_the_policy_rules() -> None:
    trace = parse_trace("time_s,qps\n0,0\n20,8\n200,0\n400,0\n", "t.csv")
    decisions = simulate(POLICY, trace)
    assert [d.time_s for d in decisions][:3] == [0.0, 20.0, 40.0]
    targets = {d.time_s: d.target_replicas for d in decisions}
    # Over the last 60 s: t=40 sees 20 s of 8 qps = 2.67 qps (raw 2, held: delay 40 s = 2 decisions);
    # t=60 sees 40 s = 5.33 qps (raw 3), the second upscale decision in a row, so 3 applies.
    assert targets[40.0] == 1 and targets[60.0] == 3
    assert max(targets.values()) == 4
    assert targets[400.0] == 1
    assert decisions[2].held_back == "upscale delay 1/2"


def test_in_flight_column_drives_the_in_flight_policy() -> None:
    policy = ReplicaPolicy(min_replicas=1, max_replicas=6, target_ongoing_requests_per_replica=2,
                           upscale_delay_seconds=0, downscale_delay_seconds=0)
    decisions = simulate(policy, parse_trace("time_s,qps,ongoing_requests\n0,0,8\n30,0,8\n", "t.csv"))
    assert [d.target_replicas for d in decisions] == [4, 4, 4, 4]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,qps\n0,1\n", "the header must name time_s and qps"),
        ("time_s,qps\n", "the trace has no rows"),
        ("time_s,qps\n0,abc\n", "line 2: qps must be a number, got 'abc'"),
        ("time_s,qps\n0,-1\n", "line 2: qps must be a number >= 0"),
        ("time_s,qps\n10,1\n5,1\n", "line 3: time_s must increase"),
        ("time_s,qps\n0,\n", "line 2: qps is empty"),
    ],
)
def test_bad_traces_name_file_line_and_column(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_trace(text, "trace.csv")
    assert str(info.value).startswith("trace.csv: ")


def test_a_fixed_policy_is_shown_at_the_asked_period() -> None:
    decisions = simulate(ReplicaPolicy(min_replicas=2, max_replicas=2), parse_trace("time_s,qps\n0,1\n30,1\n", "t"),
                         period_seconds=10)
    assert [(d.time_s, d.target_replicas) for d in decisions] == [(0, 2), (10, 2), (20, 2), (30, 2)]
