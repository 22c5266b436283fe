"""The endpoint's port is chosen inside the transaction that stores it: two `serve up` at once in one home
never choose the same port, even when checking a port on the host is slow."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import SkyLiteError
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task

TEXT = "service: {replicas: 1}\nrun: python serve.py\n"
TRIES = 10


def _task() -> SubmittedTask:
    return SubmittedTask(text=TEXT, source="/t/svc.yaml", spec=parse_task(TEXT))


def test_two_serve_ups_at_once_in_one_home_never_collide_on_a_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    is_free = procs.is_port_free

    def slow_is_port_free(port: int, host: str = "127.0.0.1") -> bool:
        time.sleep(0.02)  # a host check that takes a while: the window between choosing and storing widens
        return is_free(port, host)

    monkeypatch.setattr(procs, "is_port_free", slow_is_port_free)
    for attempt in range(TRIES):
        home = tmp_path / f"home{attempt}"
        LocalController(home, FakeClock(), start_daemon=False).get_status()  # the store exists before the race
        start = threading.Barrier(2)
        failures: list[SkyLiteError] = []

        def up(name: str, home: Path = home, start: threading.Barrier = start,
               failures: list[SkyLiteError] = failures) -> None:
            controller = LocalController(home, FakeClock(), start_daemon=False)
            start.wait()
            try:
                controller.create_service(name, _task())
            except SkyLiteError as exc:
                failures.append(exc)

        threads = [threading.Thread(target=up, args=(name,)) for name in ("one", "two")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert failures == [], f"try {attempt + 1}: {failures}"
        ports = {view.service.name: view.service.lb_port
                 for view in LocalController(home, FakeClock(), start_daemon=False).get_status()}
        assert set(ports) == {"one", "two"} and ports["one"] != ports["two"], ports
