"""Damaged and deleted state with real processes: nothing a home started survives it.

Replicas start children that leave their process group (`setsid`), so stopping a process group is not
enough; `sky.processes()` finds everything by the `SKY_LITE_HOME` the processes carry.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.forcedown import find_load_balancers

from .conftest import SkyLite, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TASK = """\
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 30
  replicas: 2
run: |
  setsid sleep 1000 &
  exec python3 -m http.server $PORT --bind 127.0.0.1
"""


def serve(sky: SkyLite, tmp_path: Path) -> str:
    """`serve up` of TASK as service `web`; its endpoint once READY."""
    (tmp_path / "web.yaml").write_text(TASK)
    sky.run("serve", "up", str(tmp_path / "web.yaml"), "--name", "web")
    endpoint = str(sky.status("web")["services"][0]["endpoint"])
    # supervisor, wrapper, http.server and the escaped sleep per replica; the controller; the load balancer's
    # processes (one, or a parent and its workers: all there once the endpoint answers)
    wait_until(lambda: len(sky.processes()) == 2 * 4 + 1 + lb_processes(sky), message="every process of the service")
    return endpoint


def lb_processes(sky: SkyLite) -> int:
    found = len(find_load_balancers(Path(os.path.realpath(sky.home))))
    assert found >= 1
    return found


def is_listening(endpoint: str) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))) == 0


def test_force_down_with_a_garbage_database_stops_everything_and_is_safe_to_run_twice(
        sky: SkyLite, tmp_path: Path) -> None:
    endpoint = serve(sky, tmp_path)
    # Without the controller id nothing reaches a cloud from this test (a store may also write it here).
    (sky.home / "controller-id").unlink(missing_ok=True)
    with open(sky.home / "state.db", "r+b") as db:  # garbage in place: the running processes keep the file
        db.write(b"this is not an SQLite database\n" * 1024)

    first = sky.run("serve", "down", "--all", "--force", "-y", timeout=60)

    lines = first.stdout.splitlines()
    assert lines[0].startswith("Stopped the controller (pid ")
    assert lines[1].startswith("Stopped the load balancer of web (pid")  # "pids" with workers
    assert [line.split(" (")[0] for line in lines[2:4]] == ["Stopped replica 1 of web", "Stopped replica 2 of web"]
    assert lines[4].startswith("Cloud instances were not searched")
    assert sky.processes() == []
    assert not is_listening(endpoint)

    again = sky.run("serve", "down", "--all", "--force", "-y", timeout=60)
    assert again.stdout.splitlines()[0] == f"Nothing that {sky.home} started was running."


def test_deleting_the_home_after_a_controller_restart_stops_every_replica(sky: SkyLite, tmp_path: Path) -> None:
    serve(sky, tmp_path)
    controller = int((sky.home / "controller.pid").read_text().split()[0])
    os.kill(controller, signal.SIGTERM)
    wait_until(lambda: not procs.is_alive(controller), message="the controller to stop")
    sky.run("controller", "start")  # a new controller: it spawned none of the replicas
    assert len(sky.processes()) == 2 * 4 + 1 + lb_processes(sky)

    shutil.rmtree(sky.home)

    wait_until(lambda: sky.processes() == [], timeout=30, message="every process of the deleted home to stop")
