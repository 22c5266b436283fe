"""The controller host's Prometheus endpoint with real processes: requests through a service's load
balancer process show up, counted per replica, in the controller's metrics, with the replicas by status
and the controller's passes; nothing of it is on the service's endpoint."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from skyserve_lite.procs import find_free_port
from tests.metrics_helpers import Samples, parse_samples, total

from .conftest import SkyLite, answering_run, http_get, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TASK = "service:\n  readiness_probe: /\n  replicas: 1\n" + answering_run('"hello"')
REQUESTS = 20


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        return parse_samples(response.read().decode())


def test_requests_through_the_endpoint_are_counted_in_the_controller_metrics(sky: SkyLite, tmp_path: Path) -> None:
    port = find_free_port()
    sky.env["SKY_LITE_METRICS_ADDR"] = f"127.0.0.1:{port}"
    (tmp_path / "hello.yaml").write_text(TASK)
    result = sky.run("serve", "up", str(tmp_path / "hello.yaml"), "--name", "hello")
    match = re.search(r"READY at (http://127\.0\.0\.1:\d+)", result.stdout)
    assert match, result.stdout
    endpoint = match.group(1)
    for _ in range(REQUESTS):
        assert http_get(f"{endpoint}/") == (200, "hello")
    [replica] = sky.status("hello")["services"][0]["replicas"]
    metrics = f"http://127.0.0.1:{port}/metrics"
    requests = {"service": "hello", "version": "1", "replica": replica["url"], "code": "2xx"}

    # The load balancer publishes about once a second (each worker of it, when it has workers: summed over
    # the worker label): wait for all of them, then check the rest.
    samples = wait_until(
        lambda: total(s := _scrape(metrics), "skylite_lb_requests_total", **requests) == REQUESTS and s,
        timeout=30, message=f"{REQUESTS} requests counted for the replica")
    labels = frozenset({"service": "hello", "version": "1", "status": "READY"}.items())
    assert samples[("skylite_replicas", labels)] == 1
    assert (total(samples, "skylite_lb_up", service="hello") or 0) >= 1  # 1, or 1 per worker
    assert total(samples, "skylite_lb_in_flight_requests", service="hello", replica=replica["url"]) == 0
    assert samples[("skylite_controller_pass_duration_seconds_count", frozenset())] >= 1
    # Not on the public endpoint: that path is the replica's like any other.
    assert http_get(f"{endpoint}/metrics") == (200, "hello")
