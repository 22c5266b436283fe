"""The controller host's Prometheus endpoint (``controller.metrics``): its address setting, and a scrape
serving the live load balancers' counts (a stopped one's file is left out), the replicas by status, the
autoscaler's targets and the controller's passes."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.metrics import MetricsAddress, MetricsExporter, parse_metrics_addr
from skyserve_lite.errors import UsageError
from skyserve_lite.lb.metrics import LbMetrics
from skyserve_lite.lb.metrics_file import metrics_path, write_snapshot
from skyserve_lite.lb.outcomes import Outcome
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import AutoscalerObservation, ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store
from tests.metrics_helpers import IdleLoad, parse_samples, sample


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
    write_snapshot(metrics_path(home, "svc"), live.take_snapshot(IdleLoad(), os.getpid(), 0.0))
    gone = LbMetrics("old")  # a load balancer that has stopped: its file is left, its counts are not served
    gone.record(Outcome(1, "http://r9", 200, 0.01, 1))
    write_snapshot(metrics_path(home, "old"), gone.take_snapshot(IdleLoad(), _dead_pid(), 0.0))

    exporter = MetricsExporter(home, MetricsAddress("127.0.0.1", 0), lambda: Store.open_read_only(home))
    exporter.start()
    try:
        exporter.observe_pass(0.03)
        exporter.observe_pass(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        exporter.close()
    samples = parse_samples(text)
    assert sample(samples, "skylite_lb_requests_total", service="svc", version="1", replica="http://r1",
                  code="2xx") == 3
    assert sample(samples, "skylite_lb_up", service="svc") == 1
    assert sample(samples, "skylite_lb_up", service="old") is None
    assert sample(samples, "skylite_replicas", service="svc", version="1", status="READY") == 2
    assert sample(samples, "skylite_autoscaler_raw_target_replicas", service="svc") == 5
    assert sample(samples, "skylite_autoscaler_target_replicas", service="svc") == 2
    assert sample(samples, "skylite_controller_pass_duration_seconds_count") == 2
    assert sample(samples, "skylite_controller_pass_duration_seconds_bucket", le="0.05") == 1
