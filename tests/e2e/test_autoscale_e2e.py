"""Autoscaling with real processes: HTTP load through the load balancer scales the service up, and it
scales back down once the load is gone (short periods and delays so the test takes seconds)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from .conftest import SkyLite, http_get, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TASK = """\
service:
  readiness_probe: /
  replica_policy:
    min_replicas: 1
    max_replicas: 2
    target_qps_per_replica: 2
    upscale_delay_seconds: 0
    downscale_delay_seconds: 3
run: exec python3 -m http.server $PORT --bind 127.0.0.1
"""


def live_replicas(sky: SkyLite) -> int:
    service = sky.status("auto")["services"][0]
    return sum(1 for r in service["replicas"] if r["status"] in ("PROVISIONING", "STARTING", "READY"))


def ready_replicas(sky: SkyLite) -> int:
    service = sky.status("auto")["services"][0]
    return sum(1 for r in service["replicas"] if r["status"] == "READY")


def test_load_scales_up_and_idle_scales_down(sky: SkyLite, tmp_path: Path) -> None:
    sky.env.update(SKY_LITE_AUTOSCALER_PERIOD_SECONDS="1", SKY_LITE_AUTOSCALER_WINDOW_SECONDS="5")
    task = tmp_path / "auto.yaml"
    task.write_text(TASK)
    endpoint = sky.run("serve", "up", str(task), "-n", "auto").stdout.rsplit(" ", 1)[1].strip()
    assert live_replicas(sky) == 1

    stop = threading.Event()
    statuses: list[int] = []

    def load() -> None:
        # About 20 requests/s, bounded: at most 400 requests, and only while the test waits.
        for _ in range(400):
            if stop.is_set():
                return
            statuses.append(http_get(endpoint + "/")[0])
            time.sleep(0.05)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        wait_until(lambda: ready_replicas(sky) == 2, timeout=60, message="a second READY replica under load")
        autoscaler = sky.status("auto")["services"][0]["autoscaler"]
        assert autoscaler["policy"] == "request_rate"
        assert autoscaler["target_replicas"] == 2
        assert autoscaler["qps"] > 2
    finally:
        stop.set()
        worker.join(30)
    assert statuses and set(statuses) == {200}

    # No load: after the 5 s window empties and 3 decisions of 1 s agree, one replica goes.
    wait_until(lambda: live_replicas(sky) == 1, timeout=60, message="scale back down to 1 replica")
    assert sky.status("auto")["services"][0]["autoscaler"]["target_replicas"] == 1
