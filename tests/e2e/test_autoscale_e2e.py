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


ZERO = """\
service:
  readiness_probe: /
  replica_policy:
    min_replicas: 0
    max_replicas: 1
    target_qps_per_replica: 1
    upscale_delay_seconds: 60
    downscale_delay_seconds: 2
run: exec python3 -m http.server $PORT --bind 127.0.0.1
"""


def test_scale_to_zero_and_the_first_request_wakes_it(sky: SkyLite, tmp_path: Path) -> None:
    sky.env.update(SKY_LITE_AUTOSCALER_PERIOD_SECONDS="1", SKY_LITE_AUTOSCALER_WINDOW_SECONDS="3")
    task = tmp_path / "zero.yaml"
    task.write_text(ZERO)
    out = sky.run("serve", "up", str(task), "-n", "auto").stdout
    assert "is scaled to zero at http://127.0.0.1:" in out
    endpoint = out.split(" at ", 1)[1].split(";", 1)[0]
    assert sky.status("auto")["services"][0]["status"] == "NO_REPLICA"
    assert live_replicas(sky) == 0

    # The first request is held by the load balancer while a replica starts, then answered: no 503.
    started = time.monotonic()
    status, _ = http_get(endpoint + "/", timeout=40)
    assert status == 200
    assert time.monotonic() - started < 30
    assert ready_replicas(sky) == 1

    # Idle again: the window empties, two 1 s decisions agree, and the service is back at zero.
    wait_until(lambda: live_replicas(sky) == 0, timeout=60, message="scale back to zero")
    wait_until(lambda: sky.status("auto")["services"][0]["status"] == "NO_REPLICA", timeout=30,
               message="NO_REPLICA")
