"""The README's story with real processes: up, curl through the load balancer, status, logs, down."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from .conftest import SkyLite, http_get, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FAST_PROBE = """\
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: {delay}
    timeout_seconds: 2
  replicas: {replicas}
run: |
  {run}
"""


def write_task(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_minimal_example_up_curl_status_logs_down(sky: SkyLite) -> None:
    result = sky.run("serve", "up", "examples/serve/minimal.yaml")
    match = re.fullmatch(r"Service minimal is READY at (http://127\.0\.0\.1:\d+)\n", result.stdout)
    assert match, result.stdout
    endpoint = match.group(1)

    answers = {http_get(endpoint + "/")[1] for _ in range(6)}
    assert answers == {"Hello from replica 1\n", "Hello from replica 2\n"}

    status = sky.status()
    (service,) = status["services"]
    assert {k: service[k] for k in ("name", "status", "version", "active_versions", "endpoint", "policy",
                                    "load_balancing_policy")} == {
        "name": "minimal", "status": "READY", "version": 1, "active_versions": [1], "endpoint": endpoint,
        "policy": "Fixed 2 replicas", "load_balancing_policy": "least_load"}
    assert [(r["replica_id"], r["version"], r["status"], r["cloud"], r["is_spot"]) for r in service["replicas"]] \
        == [(1, 1, "READY", "local", False), (2, 1, "READY", "local", False)]
    for replica in service["replicas"]:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", replica["url"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", replica["launched_at"])
        assert replica["instance_id"].startswith("local-")

    table = sky.run("serve", "status").stdout
    assert "minimal" in table and "READY" in table and endpoint in table

    replica_log = sky.run("serve", "logs", "minimal", "1", "--no-follow").stdout
    assert '"GET / HTTP/1.1" 200' in replica_log
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", line) for line in replica_log.splitlines())
    assert "listening on 127.0.0.1" in sky.run("serve", "logs", "minimal", "--load-balancer", "--no-follow").stdout
    controller_log = sky.run("serve", "logs", "minimal", "--controller", "--no-follow").stdout
    assert "service minimal replica 1: launching version 1 on local" in controller_log
    assert sky.run("serve", "logs", "minimal", "1", "--no-follow", "--tail", "1").stdout.count("\n") == 1
    assert sky.processes(), "controller, load balancer and replicas should be running"

    down = sky.run("serve", "down", "minimal", "-y")
    assert down.stdout == "Service minimal is down.\n"
    assert sky.processes() == []
    assert sky.status()["services"] == []
    assert not _port_open(endpoint), "the load balancer should have stopped listening"


def _port_open(endpoint: str) -> bool:
    import socket

    port = int(endpoint.rsplit(":", 1)[1])
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_killed_replica_is_replaced_and_traffic_keeps_flowing(sky: SkyLite, tmp_path: Path) -> None:
    run = "exec python3 -m http.server $PORT --bind 127.0.0.1 --directory " + str(tmp_path / "www")
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    task = write_task(tmp_path, "web", FAST_PROBE.format(delay=60, replicas=2, run=run))
    endpoint = sky.run("serve", "up", str(task)).stdout.rsplit(" ", 1)[1].strip()

    victim = next(r for r in sky.status("web")["services"][0]["replicas"] if r["replica_id"] == 1)
    # The README's recipe: the running replica's process group, from `serve status --pid`.
    os.killpg(int(sky.run("serve", "status", "web", "--replica-id", "1", "--pid").stdout), signal.SIGKILL)
    # Every request still succeeds: the load balancer retries a dead replica's request on the other one.
    for _ in range(10):
        assert http_get(endpoint + "/health")[0] == 200

    def replaced() -> bool:
        replicas = sky.status("web")["services"][0]["replicas"]
        states = {r["replica_id"]: r["status"] for r in replicas}
        return states.get(1) == "FAILED" and states.get(3) == "READY" and states.get(2) == "READY"

    wait_until(replaced, timeout=60, message="replica 1 to be replaced by replica 3")
    failed = next(r for r in sky.status("web")["services"][0]["replicas"] if r["replica_id"] == 1)
    assert failed["instance_id"] == victim["instance_id"]
    assert failed["status_reason"].startswith("the workload exited")


def test_broken_run_fails_up_with_the_reason(sky: SkyLite, tmp_path: Path) -> None:
    task = write_task(tmp_path, "broken", FAST_PROBE.format(delay=60, replicas=1,
                                                             run="echo boom >&2; exit 7"))
    result = sky.run("serve", "up", str(task), "--timeout", "60", check=False)
    assert result.returncode == 1
    assert "service broken FAILED" in result.stderr
    assert "run exited with code 7" in result.stderr
    assert "Traceback" not in result.stderr
    assert "boom" in sky.run("serve", "logs", "broken", "1", "--no-follow").stdout
    assert "service broken replica 1: FAILED: the workload exited (run exited with code 7)" in sky.run(
        "serve", "logs", "broken", "--controller", "--no-follow").stdout


def test_up_timeout_names_the_stuck_replica_and_why(sky: SkyLite, tmp_path: Path) -> None:
    # Serves files, but there is no /health: the probe gets 404 and the replica stays STARTING.
    run = "exec python3 -m http.server $PORT --bind 127.0.0.1"
    task = write_task(tmp_path, "stuck", FAST_PROBE.format(delay=600, replicas=1, run=run))
    result = sky.run("serve", "up", str(task), "--timeout", "4", check=False)
    assert result.returncode == 1
    assert "service stuck is not READY after 4s" in result.stderr
    assert re.search(r"replica 1 is STARTING: running, waiting for the readiness probe on :\d+ \(\d+s of 600s\); "
                     r"HTTP 404", result.stderr), result.stderr
    assert "sky-lite serve logs stuck 1" in result.stderr


def test_no_wait_returns_once_the_controller_holds_the_service(sky: SkyLite) -> None:
    result = sky.run("serve", "up", "examples/serve/minimal.yaml", "-n", "quick", "--no-wait")
    assert result.stdout.startswith("Service quick submitted")
    assert sky.status("quick")["services"][0]["name"] == "quick"
    again = sky.run("serve", "up", "examples/serve/minimal.yaml", "-n", "quick", check=False)
    assert again.returncode == 1
    assert "sky-lite serve update quick" in again.stderr


def test_invalid_task_changes_nothing(sky: SkyLite, tmp_path: Path) -> None:
    task = write_task(tmp_path, "bad", "service:\n  replicas: 0\nrun: echo\n")
    result = sky.run("serve", "up", str(task), check=False)
    assert result.returncode == 2
    assert result.stderr == f"Error: {task}: service.replicas: must be at least 1, got 0\n"
    assert not sky.home.exists()


def test_deleting_the_state_directory_stops_the_controller_and_its_replicas(sky: SkyLite, tmp_path: Path) -> None:
    import shutil

    task = write_task(tmp_path, "sleeper", FAST_PROBE.format(delay=600, replicas=2, run="exec sleep 300"))
    sky.run("serve", "up", str(task), "--no-wait")
    wait_until(lambda: sum(1 for p in sky.processes() if _cmdline(p) == b"sleep\x00300\x00") == 2,
               timeout=30, message="two replica processes")
    shutil.rmtree(sky.home)
    # Nothing is left to reconcile: the controller stops and takes the replicas it started with it,
    # instead of relaunching "vanished" replicas into a deleted directory; the load balancer stops too.
    wait_until(lambda: sky.processes() == [], timeout=30,
               message="controller, load balancer and replicas gone")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
