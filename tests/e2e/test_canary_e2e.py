"""Canary updates with real replica processes and a real load balancer: a version that answers 500 on `/`
(200 on its probe path) is rolled back at the first step with no old replica lost and the reason shown; a
good version is promoted through every step, its share of the requests measured through the endpoint; a
rolling update with `--auto-rollback` of such a version is rolled back without the service ever having no
replica to answer."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from .conftest import SkyLite, answering_run, http_get, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

# Short windows and few requests to judge: 20% then 50%, 5 s each, 10 requests at least (extended twice).
TASK = """\
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 60
  replicas: 2
  canary: {{steps: [20, 50], bake_seconds: 5, min_requests: 10, max_extensions: 2}}
""" + answering_run('"{label} " + os.environ["SKY_LITE_REPLICA_ID"]',
                    status='200 if self.path == "/health" else {status}')


class Load:
    """Requests to the endpoint, one after another (about 40 a second), each answer kept with its time."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.answers: list[tuple[float, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, body = http_get(self.endpoint + "/", timeout=20)  # a loaded 2-core machine: slow, not lost
            except OSError:
                status, body = 0, ""
            self.answers.append((time.monotonic(), status, body))
            time.sleep(0.025)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def replicas(sky: SkyLite) -> dict[int, tuple[int, str, str]]:
    service = sky.status("web")["services"][0]
    return {r["replica_id"]: (r["version"], r["status"], r["instance_id"]) for r in service["replicas"]}


def canary_percent(sky: SkyLite) -> tuple[int, str] | None:
    canary = sky.status("web")["services"][0]["canary"]
    return None if canary is None else (canary["percent"], canary["phase"])


def test_a_failing_version_is_rolled_back_and_a_good_one_promoted(sky: SkyLite, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.yaml"
    v1.write_text(TASK.format(status=200, label="v1"))
    endpoint = sky.run("serve", "up", str(v1), "-n", "web").stdout.rsplit(" ", 1)[1].strip()
    old = replicas(sky)
    assert sorted(old) == [1, 2]

    # A version whose replicas pass their probe but answer 500 on `/`: rolled back at the first step.
    bad = tmp_path / "bad.yaml"
    bad.write_text(TASK.format(status=500, label="bad"))
    with Load(endpoint) as load:
        result = sky.run("serve", "update", "web", str(bad), "--mode", "canary", "--max-error-rate", "0.02", "-y",
                         "--timeout", "120", check=False, timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    said = " ".join(result.stderr.split())
    assert "web: version 2 did not roll out: version 2 rolled back: 5xx 100% (" in said
    assert "at 20%, limit 2%" in said
    assert "Canary steps" in result.stdout and "1. 20% on 1 new replica, bake 5s" in " ".join(result.stdout.split())
    # The old replicas kept every request they had: none failed, and the 500s were the canary's only.
    assert [a for a in load.answers if a[1] not in (200, 500)] == []
    assert {body.split(" ")[0] for _, status, body in load.answers if status == 500} == {"bad"}
    # Version 3 is version 1's task again; both old replicas kept their processes (reused, not replaced).
    wait_until(lambda: replicas(sky) and set(replicas(sky)) == {1, 2}, timeout=60,
               message="the canary's replica drained and gone")
    after = replicas(sky)
    assert {rid: (v, s) for rid, (v, s, _) in after.items()} == {1: (3, "READY"), 2: (3, "READY")}
    assert {rid: i for rid, (_, _, i) in after.items()} == {rid: i for rid, (_, _, i) in old.items()}
    history = sky.run("serve", "history", "web").stdout
    assert "version 2 rolled back" in " ".join(history.split())
    events = " ".join(sky.run("serve", "status", "web", "--events", "50").stdout.split())
    assert "version 2 rolled back: 5xx 100%" in events
    assert http_get(endpoint + "/")[1].startswith("v1 ")

    # A good version: promoted through 20% and 50% to 100%; its share at 20% measured at the endpoint.
    good = tmp_path / "good.yaml"
    good.write_text(TASK.format(status=200, label="v2"))
    seen: list[tuple[float, int, str]] = []
    with Load(endpoint) as load:
        update = threading.Thread(target=lambda: seen.append((0.0, sky.run(
            "serve", "update", "web", str(good), "--mode", "canary", "-y", "--timeout", "150",
            check=False, timeout=240).returncode, "")))
        update.start()
        at_20 = wait_until(lambda: canary_percent(sky) == (20, "stepping") and time.monotonic(), timeout=90,
                           message="the split at 20%")
        after_20 = wait_until(lambda: canary_percent(sky) != (20, "stepping") and time.monotonic(), timeout=90,
                              message="the step after 20%")
        update.join(240)
    assert seen and seen[0][1] == 0, "the good version's update did not succeed"
    window = [body for when, status, body in load.answers if at_20 + 1.0 <= when <= after_20 - 1.0 and status == 200]
    assert len(window) >= 25, len(window)
    share = sum(1 for body in window if body.startswith("v2 ")) / len(window)
    assert 0.08 <= share <= 0.35, (share, len(window))
    assert [a for a in load.answers if a[1] != 200] == []
    # Done once no old replica serves; the drained ones go SKY_LITE_DRAIN_SECONDS later.
    final = wait_until(lambda: (rows := replicas(sky)) and len(rows) == 2 and rows, timeout=60,
                       message="the old replicas drained and gone")
    assert all(v == 4 and s == "READY" for v, s, _ in final.values())
    assert not set(final) & {1, 2}  # the old replicas drained once it was promoted
    canary = sky.status("web")["services"][0]["canary"]
    assert (canary["phase"], canary["percent"]) == ("promoted", 100)
    assert http_get(endpoint + "/")[1].startswith("v2 ")


def test_a_rolling_update_with_auto_rollback_is_rolled_back_without_a_gap(sky: SkyLite, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.yaml"
    v1.write_text(TASK.format(status=200, label="v1"))
    endpoint = sky.run("serve", "up", str(v1), "-n", "web").stdout.rsplit(" ", 1)[1].strip()
    bad = tmp_path / "bad.yaml"
    bad.write_text(TASK.format(status=500, label="bad"))
    with Load(endpoint) as load:
        result = sky.run("serve", "update", "web", str(bad), "--auto-rollback", "--bake", "5s", "-y",
                         "--timeout", "150", check=False, timeout=240)
        assert result.returncode == 1, result.stdout + result.stderr
        said = " ".join(result.stderr.split())
        assert "web: version 2 did not roll out: version 2 rolled back: 5xx 100% (" in said
        assert "after taking traffic, limit 2%" in said
        # The rollback (version 3, version 1's task) serves v1 again, the bad replicas drained and gone.
        final = wait_until(lambda: (rows := replicas(sky)) and {v for v, _, _ in rows.values()} == {3}
                           and all(s == "READY" for _, s, _ in rows.values()) and rows, timeout=120,
                           message="version 3 alone and READY")
        assert len(final) == 2
        wait_until(lambda: http_get(endpoint + "/")[1].startswith("v1 "), timeout=30, message="v1 answering")
    # Every request had a replica to answer it: only the versions' own answers, no 503 for want of one.
    assert {status for _, status, _ in load.answers} <= {200, 500}
    assert {body.split(" ")[0] for _, status, body in load.answers if status == 500} == {"bad"}
    history = " ".join(sky.run("serve", "history", "web").stdout.split())
    assert "version 2 rolled back: 5xx 100%" in history
