"""Metrics for Prometheus: the load balancer's totals (``lb.metrics``) and the controller host's endpoint
(``controller.metrics``), read back with prometheus-client's own parser."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from skyserve_lite.api import LocalController
from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.metrics import (
    MetricsAddress,
    MetricsExporter,
    compute_lb_families,
    parse_metrics_addr,
    render_text,
)
from skyserve_lite.errors import UsageError
from skyserve_lite.lb.metrics import LbMetrics, LbSnapshot, metrics_path, read_snapshot, write_snapshot
from skyserve_lite.lb.outcomes import Failure, Outcome
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import AutoscalerObservation, ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store

from .serving import StaticSource, serve_app, serve_lb

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text page, by name and labels."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class _Idle:
    """A load balancer with nothing in flight, for snapshots of recorded outcomes only."""

    retries = 2
    ejections = 1
    waiting = 0
    ejected = frozenset({"http://r2"})

    def in_flight(self) -> tuple[tuple[str, int], ...]:
        return (("http://r1", 0), ("http://r2", 0))


def test_outcomes_become_counters_failures_and_latency_buckets() -> None:
    metrics = LbMetrics("svc")
    for outcome in [
        Outcome(3, "http://r1", 200, 0.004, 1), Outcome(3, "http://r1", 204, 0.2, 1),
        Outcome(3, "http://r1", 503, 3.0, 2), Outcome(4, "http://r2", None, 0.001, 1, Failure.RESET),
        Outcome(None, None, 429, 0.0, 0), Outcome(None, None, 502, 0.3, 0),
    ]:
        metrics.record(outcome)
    samples = parse(render_text(compute_lb_families([metrics.take_snapshot(_Idle(), 1, 0.0)])))
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
    snapshot = metrics.take_snapshot(_Idle(), 1234, 99.5)
    write_snapshot(metrics_path(tmp_path, "svc"), snapshot)
    assert read_snapshot(metrics_path(tmp_path, "svc")) == snapshot


@pytest.mark.parametrize(("value", "expected"), [
    (None, MetricsAddress("127.0.0.1", 30000)),
    ("127.0.0.2:9100", MetricsAddress("127.0.0.2", 9100)),
    ("[::1]:9100", MetricsAddress("::1", 9100)),
    ("off", None),
    ("OFF", None),
])
def test_the_metrics_address_setting(value: str | None, expected: MetricsAddress | None) -> None:
    environ = {} if value is None else {"SKY_LITE_METRICS_ADDR": value}
    assert parse_metrics_addr(environ) == expected


@pytest.mark.parametrize("value", ["9100", "localhost", "127.0.0.1:http", "127.0.0.1:70000", ":9100"])
def test_a_bad_metrics_address_names_the_setting(value: str) -> None:
    with pytest.raises(UsageError, match="SKY_LITE_METRICS_ADDR"):
        parse_metrics_addr({"SKY_LITE_METRICS_ADDR": value})


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
    samples = parse(render_text(compute_lb_families([snapshot])))
    labels = {"service": "svc", "version": "2", "replica": replica}
    assert sample(samples, "skylite_lb_requests_total", **labels, code="2xx") == requests
    assert sample(samples, "skylite_lb_request_duration_seconds_count", **labels) == requests
    assert sample(samples, "skylite_lb_in_flight_requests", service="svc", replica=replica) == 0


TEXT = "service: {replicas: 2}\nrun: python serve.py\n"


def _dead_pid() -> int:
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                             text=True, check=True)
    return int(process.stdout)


def test_the_controller_endpoint_serves_live_load_balancers_replicas_targets_and_passes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    task = SubmittedTask(text=TEXT, source="/t/svc.yaml", spec=parse_task(TEXT))
    LocalController(home, FakeClock(), start_daemon=False).create_service("svc", task)
    store = Store.open(home)
    try:
        template = ReplicaRecord(service="svc", replica_id=0, version=1, status=ReplicaStatus.READY, cloud="local",
                                 launched_at=0.0, status_since=0.0, launch_token="t")
        store.add_replicas("svc", 2, template)
        store.put_autoscaler_states([("svc", AutoscalerState(version=1, target=2),
                                      AutoscalerObservation(policy="request_rate", raw_target=5))])
    finally:
        store.close()
    live = LbMetrics("svc")
    for _ in range(3):
        live.record(Outcome(1, "http://r1", 200, 0.01, 1))
    write_snapshot(metrics_path(home, "svc"), live.take_snapshot(_Idle(), os.getpid(), 0.0))
    gone = LbMetrics("old")  # a load balancer that has stopped: its file is left, its counts are not served
    gone.record(Outcome(1, "http://r9", 200, 0.01, 1))
    write_snapshot(metrics_path(home, "old"), gone.take_snapshot(_Idle(), _dead_pid(), 0.0))

    exporter = MetricsExporter(home, MetricsAddress("127.0.0.1", 0), lambda: Store.open_read_only(home))
    exporter.start()
    try:
        exporter.observe_pass(0.03)
        exporter.observe_pass(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        exporter.close()
    samples = parse(text)
    assert sample(samples, "skylite_lb_requests_total", service="svc", version="1", replica="http://r1",
                  code="2xx") == 3
    assert sample(samples, "skylite_lb_up", service="svc") == 1
    assert sample(samples, "skylite_lb_up", service="old") is None
    assert sample(samples, "skylite_replicas", service="svc", version="1", status="READY") == 2
    assert sample(samples, "skylite_autoscaler_raw_target_replicas", service="svc") == 5
    assert sample(samples, "skylite_autoscaler_target_replicas", service="svc") == 2
    assert sample(samples, "skylite_controller_pass_duration_seconds_count") == 2
    assert sample(samples, "skylite_controller_pass_duration_seconds_bucket", le="0.05") == 1


def test_a_replica_gone_for_the_forget_time_loses_its_series_and_one_back_in_time_keeps_them() -> None:
    metrics = LbMetrics("svc")
    for replica in ("http://a", "http://b", "http://c"):
        metrics.record(Outcome(1, replica, 200, 0.01, 1))
        metrics.record(Outcome(1, replica, None, 0.01, 1, Failure.CONNECT))
    metrics.record(Outcome(None, None, 503, 0.0, 0))
    metrics.forget_gone(["http://a"], now=100.0, after_seconds=60.0)  # b and c leave the targets at 100
    metrics.forget_gone(["http://a", "http://b"], now=130.0, after_seconds=60.0)  # b is back
    metrics.forget_gone(["http://a"], now=160.0, after_seconds=60.0)  # c: 60 s gone; b: gone again at 160
    snapshot = metrics.take_snapshot(_Idle(), 1, 160.0)
    assert {replica for _, replica, _, _ in snapshot.requests} == {"http://a", "http://b", None}
    assert {replica for _, replica, _, _ in snapshot.failures} == {"http://a", "http://b"}
    assert {row.replica for row in snapshot.latency} == {"http://a", "http://b"}
    metrics.forget_gone(["http://a"], now=220.0, after_seconds=60.0)
    assert {replica for _, replica, _, _ in metrics.take_snapshot(_Idle(), 1, 220.0).requests} == {"http://a", None}
