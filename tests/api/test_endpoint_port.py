"""The endpoint's port is chosen inside the transaction that stores it: two `serve up` at once in one home
never choose the same port, even when checking a port on the host is slow. And `serve status` says when a
service's endpoint answers as something else."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.api import LocalController, ServiceView, check_endpoints
from skyserve_lite.clock import FakeClock
from skyserve_lite.endpoint_identity import EndpointIdentity
from skyserve_lite.errors import SkyLiteError
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ServiceRecord, ServiceStatus

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


def _view(name: str, status: ServiceStatus) -> ServiceView:
    service = ServiceRecord(name=name, current_version=1, status=status, status_reason=None, lb_port=30001,
                            lb_pid=None, lb_policy="least_load", deleting=False, created_at=0.0, next_replica_id=2)
    return ServiceView(service=service, policy="Fixed 1 replica", load_balancing_policy="least_load", replicas=(),
                       events=(), controller_id="c1")


def test_status_says_when_a_ready_service_endpoint_answers_as_something_else() -> None:
    answers: dict[str, EndpointIdentity | str] = {"http://127.0.0.1:30001": EndpointIdentity("web", "c2", 9)}
    asked: list[str] = []

    def ask(endpoint: str) -> EndpointIdentity | str:
        asked.append(endpoint)
        return answers[endpoint]

    ready, starting = _view("web", ServiceStatus.READY), _view("api", ServiceStatus.REPLICA_INIT)
    checked = check_endpoints([ready, starting], ask)
    assert checked[0].endpoint_problem == ("http://127.0.0.1:30001 is the endpoint of service 'web' of controller "
                                           "c2 (pid 9), not of this service yet")
    assert checked[1] == starting  # not expected to answer yet: not asked
    assert asked == ["http://127.0.0.1:30001"]
    answers["http://127.0.0.1:30001"] = EndpointIdentity("web", "c1", 9)
    assert check_endpoints([ready], ask)[0].endpoint_problem is None
