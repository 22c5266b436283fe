"""The CLI's polling loops (`serve up` waiting for READY, `serve down` waiting for the services to go) on
an injected clock: they poll, give up at their deadline with what is stuck, and never sleep for real."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController, ServiceView
from skyserve_lite.clock import FakeClock
from skyserve_lite.endpoint_identity import EndpointIdentity
from skyserve_lite.errors import WaitTimeoutError
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceRecord, ServiceStatus
from skyserve_lite.waits import wait_until_ready

TEXT = "service: {replicas: 1}\nrun: python serve.py\n"


def view(status: ServiceStatus, replicas: Sequence[ReplicaRecord] = (), reason: str | None = None) -> ServiceView:
    service = ServiceRecord(name="svc", current_version=1, status=status, status_reason=reason, lb_port=30001,
                            lb_pid=None, lb_policy="least_load", deleting=False, created_at=0.0, next_replica_id=2)
    return ServiceView(service=service, policy="Fixed 1 replica", load_balancing_policy="least_load",
                       replicas=tuple(replicas), events=(), controller_id="c1")


OURS = EndpointIdentity("svc", "c1", 4242)
NOTHING = "nothing answers at http://127.0.0.1:30001 (ConnectionRefusedError)"


def replica(status: ReplicaStatus, reason: str | None = None) -> ReplicaRecord:
    return ReplicaRecord(service="svc", replica_id=1, version=1, status=status, cloud="local", launched_at=0.0,
                         status_since=0.0, launch_token="t", status_reason=reason)


class ScriptedController:
    """Answers ``get_status`` with the next view of a script (the last one repeats)."""

    def __init__(self, views: Sequence[ServiceView]) -> None:
        self._views: Iterator[ServiceView] = iter(views)
        self._last = views[0]
        self.polls = 0

    def get_status(self, names: Sequence[str] = ()) -> list[ServiceView]:
        self.polls += 1
        self._last = next(self._views, self._last)
        return [self._last]


def test_waits_until_ready_and_listening_polling_on_the_clock() -> None:
    clock = FakeClock()
    controller = ScriptedController([view(ServiceStatus.CONTROLLER_INIT), view(ServiceStatus.REPLICA_INIT),
                                     view(ServiceStatus.READY), view(ServiceStatus.READY)])
    answers: Iterator[EndpointIdentity | str] = iter([NOTHING, OURS])
    seen: list[ServiceStatus] = []
    ready = wait_until_ready(controller, "svc", 60, on_progress=lambda v: seen.append(v.service.status),
                             poll_seconds=0.5, ask_identity=lambda _endpoint: next(answers), clock=clock)
    assert ready.service.status is ServiceStatus.READY
    assert seen == [ServiceStatus.CONTROLLER_INIT, ServiceStatus.REPLICA_INIT, ServiceStatus.READY,
                    ServiceStatus.READY]
    assert clock.sleeps == [0.5, 0.5, 0.5]


def test_a_scaled_to_zero_service_counts_as_answering() -> None:
    controller = ScriptedController([view(ServiceStatus.NO_REPLICA)])
    result = wait_until_ready(controller, "svc", 5, ask_identity=lambda _e: OURS, clock=FakeClock())
    assert result.service.status is ServiceStatus.NO_REPLICA


def test_gives_up_at_the_deadline_naming_the_replica_that_holds_it_back() -> None:
    clock = FakeClock()
    stuck = view(ServiceStatus.REPLICA_INIT, [replica(ReplicaStatus.STARTING, "HTTP 503")])
    controller = ScriptedController([stuck])
    with pytest.raises(WaitTimeoutError, match=r"not READY after 3s: replica 1 is STARTING: HTTP 503"):
        wait_until_ready(controller, "svc", 3, poll_seconds=1, ask_identity=lambda _e: NOTHING, clock=clock)
    assert controller.polls == 4  # at 0, 1, 2 and 3 seconds
    assert sum(clock.sleeps) == 3


def test_a_failed_service_stops_the_wait_at_once() -> None:
    clock = FakeClock()
    controller = ScriptedController([view(ServiceStatus.FAILED, reason="3 replicas failed")])
    with pytest.raises(WaitTimeoutError, match="service svc FAILED: 3 replicas failed"):
        wait_until_ready(controller, "svc", 600, ask_identity=lambda _e: OURS, clock=clock)
    assert clock.sleeps == []


@pytest.mark.parametrize(("answer", "problem"), [
    # Another state directory's service of the same name on the port: the name is not enough.
    (EndpointIdentity("svc", "c2", 777), "is the endpoint of service 'svc' of controller c2 (pid 777)"),
    (EndpointIdentity("other", "c1", 778), "is the endpoint of service 'other' of controller c1 (pid 778)"),
    # Something that accepts connections but is no load balancer of ours.
    ("http://127.0.0.1:30001 is not a sky-lite load balancer (/.sky-lite/identity answered 404)", "answered 404"),
    (NOTHING, "nothing answers"),
])
def test_a_ready_service_whose_endpoint_answers_as_something_else_is_not_ready(
        answer: EndpointIdentity | str, problem: str) -> None:
    clock = FakeClock()
    controller = ScriptedController([view(ServiceStatus.READY)])
    with pytest.raises(WaitTimeoutError, match=r"not READY after 2s: its replicas are, but .*" + re.escape(problem)):
        wait_until_ready(controller, "svc", 2, poll_seconds=1, ask_identity=lambda _e: answer, clock=clock)
    assert controller.polls == 3


def test_a_view_from_a_host_without_controller_ids_accepts_the_service_name() -> None:
    plain = dataclasses.replace(view(ServiceStatus.READY), controller_id=None)
    result = wait_until_ready(ScriptedController([plain]), "svc", 5, ask_identity=lambda _e: OURS, clock=FakeClock())
    assert result.service.status is ServiceStatus.READY


@pytest.fixture
def home_with_service(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    task = SubmittedTask(text=TEXT, source="/t/svc.yaml", spec=parse_task(TEXT))
    LocalController(home, FakeClock(), start_daemon=False).create_service("svc", task)
    return home


class DeletingClock(FakeClock):
    """A clock whose ``sleep`` also lets "the controller" remove the service after some polls."""

    def __init__(self, home: Path, after_sleeps: int) -> None:
        super().__init__()
        self.home, self.after = home, after_sleeps

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if len(self.sleeps) == self.after:
            from skyserve_lite.state.store import Store

            store = Store.open(self.home)
            store.delete_service("svc")
            store.close()


def test_finish_down_polls_until_the_service_is_gone(home_with_service: Path) -> None:
    clock = DeletingClock(home_with_service, after_sleeps=3)
    LocalController(home_with_service, clock, start_daemon=False).finish_down(["svc"], 30, poll_seconds=0.2)
    assert clock.sleeps == [0.2, 0.2, 0.2]


def test_finish_down_times_out_saying_what_is_left(home_with_service: Path) -> None:
    clock = FakeClock()
    controller = LocalController(home_with_service, clock, start_daemon=False)
    with pytest.raises(WaitTimeoutError, match=r"still shutting down after 1s: svc"):
        controller.finish_down(["svc"], 1, poll_seconds=0.25)
    assert sum(clock.sleeps) == pytest.approx(1.0)
    assert [v.service.name for v in controller.get_status(["svc"])] == ["svc"]
