"""The canary judge and Prometheus read the same outcomes: for one stream of outcomes, the per-version
counts the judge is given (``lb.version_counts`` -> ``plan.canary.compute_counts``) equal what the
``skylite_lb_requests_total`` and ``skylite_lb_attempt_failures_total`` series of that version say, so a
rollback's ``5xx 7.5% (12/160)`` can be read back from the metrics (docs/update.md, "Where the numbers
come from")."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.metrics import compute_lb_families, render_text
from skyserve_lite.lb.metrics import LbMetrics
from skyserve_lite.lb.outcomes import Failure, Outcome, find_status_class
from skyserve_lite.lb.version_counts import VersionCounter
from skyserve_lite.plan.canary import VersionCounts, compute_counts


class _Idle:
    retries = 0
    ejections = 0
    waiting = 0
    ejected: frozenset[str] = frozenset()

    def in_flight(self) -> tuple[tuple[str, int], ...]:
        return ()


# The worked example's window: version 4 (the canary) answered 148 x 200 and 12 x 500; version 3 answered
# 1,434 x 200, 4 x 502 and had 2 resets; plus what is no version's: the load balancer's own 503s while
# holding, and attempts the client abandoned (not the replica's fault).
STREAM = ([Outcome(4, "http://new", 200, 0.01, 1)] * 148 + [Outcome(4, "http://new", 500, 0.01, 1)] * 12
          + [Outcome(3, "http://old", 200, 0.01, 1)] * 1434 + [Outcome(3, "http://old", 502, 0.01, 1)] * 4
          + [Outcome(3, "http://old", None, 0.01, 1, Failure.RESET)] * 2
          + [Outcome(None, None, 503, 0.0, 0)] * 7 + [Outcome(4, "http://new", None, 0.5, 1, Failure.ABORTED)] * 3)


def _from_metrics(text: str, version: str) -> VersionCounts:
    """A version's counts as a Prometheus query would sum them: responses by code, plus failed attempts
    except the client's own aborts."""
    by_code: dict[str, float] = {}
    failed = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("version") != version:
                continue
            if s.name == "skylite_lb_requests_total":
                by_code[s.labels["code"]] = by_code.get(s.labels["code"], 0) + s.value
            elif s.name == "skylite_lb_attempt_failures_total" and s.labels["reason"] != "aborted":
                failed += s.value
    return VersionCounts(requests=int(sum(by_code.values()) + failed), errors_5xx=int(by_code.get("5xx", 0)),
                         failed=int(failed))


def test_the_judge_and_the_metrics_count_the_same_requests_per_version() -> None:
    clock = FakeClock(1000.0)
    counter, metrics = VersionCounter(clock), LbMetrics("web")
    for outcome in STREAM:
        counter.record(outcome)
        metrics.record(outcome)
    by_version: dict[int, dict[str, int]] = {}
    for (version, _, status_class), n in counter.take_completed().items():
        by_version.setdefault(version, {})[status_class] = n
    new, old = compute_counts(by_version, 4)
    assert new == VersionCounts(requests=160, errors_5xx=12, failed=0)  # 7.5%: the worked example's
    assert old == VersionCounts(requests=1440, errors_5xx=4, failed=2)
    text = render_text(compute_lb_families([metrics.take_snapshot(_Idle(), 1, 1000.0)]))
    assert _from_metrics(text, "4") == new
    assert _from_metrics(text, "3") == old


@pytest.mark.parametrize(("status", "expected"), [
    (None, "failed"), (101, "1xx"), (200, "2xx"), (204, "2xx"), (304, "3xx"), (429, "4xx"), (503, "5xx"),
    (599, "5xx"), (600, "5xx"), (999, "5xx"),  # llhttp takes any three digits: outside HTTP is a server error
])
def test_the_status_class_of_an_outcome(status: int | None, expected: str) -> None:
    assert find_status_class(status) == expected


def test_a_status_outside_http_is_an_error_for_the_judge_as_for_the_metrics() -> None:
    counter, metrics = VersionCounter(FakeClock(1000.0)), LbMetrics("web")
    for outcome in [Outcome(4, "http://new", 200, 0.01, 1), Outcome(4, "http://new", 600, 0.01, 1)]:
        counter.record(outcome)
        metrics.record(outcome)
    new, _ = compute_counts({4: {c: n for (_, _, c), n in counter.take_completed().items()}}, 4)
    assert new == VersionCounts(requests=2, errors_5xx=1, failed=0)
    text = render_text(compute_lb_families([metrics.take_snapshot(_Idle(), 1, 1000.0)]))
    assert _from_metrics(text, "4") == new
