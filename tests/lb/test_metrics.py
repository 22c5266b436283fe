"""Metrics for Prometheus: the load balancer's totals (``lb.metrics``), its snapshot file (``lb.metrics_file``)
and the families the controller host renders from it, read back with prometheus-client's own parser. The
controller host's endpoint itself: tests/controller/test_metrics_endpoint.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.metrics import (
    compute_lb_families,
    render_text,
)
from skyserve_lite.lb.metrics import LbMetrics, LbSnapshot, metrics_path, read_snapshot, write_snapshot
from skyserve_lite.lb.outcomes import Failure, Outcome
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from tests.metrics_helpers import IdleLoad, parse_samples, sample

from .serving import StaticSource, serve_app, serve_lb


def test_outcomes_become_counters_failures_and_latency_buckets() -> None:
    metrics = LbMetrics("svc")
    for outcome in [
        Outcome(3, "http://r1", 200, 0.004, 1), Outcome(3, "http://r1", 204, 0.2, 1),
        Outcome(3, "http://r1", 503, 3.0, 2), Outcome(4, "http://r2", None, 0.001, 1, Failure.RESET),
        Outcome(None, None, 429, 0.0, 0), Outcome(None, None, 502, 0.3, 0),
    ]:
        metrics.record(outcome)
    samples = parse_samples(render_text(compute_lb_families([metrics.take_snapshot(IdleLoad(), 1, 0.0)])))
    replica = {"service": "svc", "version": "3", "replica": "http://r1"}
    assert sample(samples, "skylite_lb_requests_total", **replica, code="2xx") == 2
    assert sample(samples, "skylite_lb_requests_total", **replica, code="5xx") == 1
    own = {"service": "svc", "version": "", "replica": ""}
    assert sample(samples, "skylite_lb_requests_total", **own, code="4xx") == 1
    assert sample(samples, "skylite_lb_requests_total", **own, code="5xx") == 1
    assert sample(samples, "skylite_lb_attempt_failures_total", service="svc", version="4", replica="http://r2",
                  reason="reset") == 1
    # 0.004 s <= 0.005; 0.2 s <= 0.25; 3.0 s <= 5.0: cumulative buckets as Prometheus reads them.
    assert sample(samples, "skylite_lb_request_duration_seconds_bucket", **replica, le="0.005") == 1
    assert sample(samples, "skylite_lb_request_duration_seconds_bucket", **replica, le="0.25") == 2
    assert sample(samples, "skylite_lb_request_duration_seconds_bucket", **replica, le="2.5") == 2
    assert sample(samples, "skylite_lb_request_duration_seconds_bucket", **replica, le="+Inf") == 3
    assert sample(samples, "skylite_lb_request_duration_seconds_count", **replica) == 3
    assert sample(samples, "skylite_lb_request_duration_seconds_sum", **replica) == pytest.approx(3.204)
    assert sample(samples, "skylite_lb_retries_total", service="svc") == 2
    assert sample(samples, "skylite_lb_ejections_total", service="svc") == 1
    assert sample(samples, "skylite_lb_ejected_replicas", service="svc") == 1
    assert sample(samples, "skylite_lb_in_flight_requests", service="svc", replica="http://r1") == 0


def test_a_snapshot_file_is_read_back_as_it_was_written(tmp_path: Path) -> None:
    metrics = LbMetrics("svc")
    metrics.record(Outcome(1, "http://r1", 200, 0.01, 1))
    snapshot = metrics.take_snapshot(IdleLoad(), 1234, 99.5)
    write_snapshot(metrics_path(tmp_path, "svc"), snapshot)
    assert read_snapshot(metrics_path(tmp_path, "svc")) == snapshot


def _replica_app() -> web.Application:
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", answer)
    return app


def test_n_requests_through_a_real_load_balancer_count_n_for_their_replica() -> None:
    requests = 25

    async def body() -> tuple[LbSnapshot, str]:
        metrics = LbMetrics("svc")
        async with serve_app(_replica_app()) as replica:
            lb = LoadBalancer("svc", StaticSource(LbView((replica,), "round_robin", versions=(2,))), None,
                              FakeClock(0.0), hold_seconds=0, outcomes=(metrics,))
            async with serve_lb(lb) as lb_url:
                async with aiohttp.ClientSession() as session:
                    for _ in range(requests):
                        async with session.get(f"{lb_url}/") as response:
                            assert response.status == 200
                            await response.read()
                await asyncio.sleep(0.05)  # the last response's release runs right after its body went out
                return metrics.take_snapshot(lb, os.getpid(), 0.0), replica

    snapshot, replica = asyncio.run(body())
    samples = parse_samples(render_text(compute_lb_families([snapshot])))
    labels = {"service": "svc", "version": "2", "replica": replica}
    assert sample(samples, "skylite_lb_requests_total", **labels, code="2xx") == requests
    assert sample(samples, "skylite_lb_request_duration_seconds_count", **labels) == requests
    assert sample(samples, "skylite_lb_in_flight_requests", service="svc", replica=replica) == 0


def test_a_replica_gone_for_the_forget_time_loses_its_series_and_one_back_in_time_keeps_them() -> None:
    metrics = LbMetrics("svc")
    for replica in ("http://a", "http://b", "http://c"):
        metrics.record(Outcome(1, replica, 200, 0.01, 1))
        metrics.record(Outcome(1, replica, None, 0.01, 1, Failure.CONNECT))
    metrics.record(Outcome(None, None, 503, 0.0, 0))
    metrics.forget_gone(["http://a"], now=100.0, after_seconds=60.0)  # b and c leave the targets at 100
    metrics.forget_gone(["http://a", "http://b"], now=130.0, after_seconds=60.0)  # b is back
    metrics.forget_gone(["http://a"], now=160.0, after_seconds=60.0)  # c: 60 s gone; b: gone again at 160
    snapshot = metrics.take_snapshot(IdleLoad(), 1, 160.0)
    assert {replica for _, replica, _, _ in snapshot.requests} == {"http://a", "http://b", None}
    assert {replica for _, replica, _, _ in snapshot.failures} == {"http://a", "http://b"}
    assert {row.replica for row in snapshot.latency} == {"http://a", "http://b"}
    metrics.forget_gone(["http://a"], now=220.0, after_seconds=60.0)
    assert {replica for _, replica, _, _ in metrics.take_snapshot(IdleLoad(), 1, 220.0).requests} == {"http://a", None}
