"""What `serve status` reads and asks: every service's load balancer endpoints in one query, and each endpoint
asked who it is once, though a service's own endpoint is also its host's (``api.check_status_endpoints``). The
asking is a fake that records the urls it was asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.api import LocalController, ServiceView, check_status_endpoints
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.fleet import ControllerView
from skyserve_lite.endpoint_identity import EndpointIdentity
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import LbEndpoint, ServiceRecord, ServiceStatus
from skyserve_lite.state.store import Store

TEXT = "service: {replicas: 1}\nrun: python serve.py\n"
REFUSED = "nothing answers (ConnectionRefusedError: [Errno 111] Connection refused)"


def test_status_of_every_service_reads_the_load_balancer_endpoints_in_one_query(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    store = Store.open(home)
    try:
        for port, name in enumerate(("api", "web", "worker"), start=30001):
            store.create_service(name, SubmittedTask(text=TEXT, source="/t/svc.yaml", spec=parse_task(TEXT)),
                                 port, 0.0)
        store.record_lb_endpoint(LbEndpoint("web", "host-a", "127.0.0.1:30002", 100, 1.0))
        store.record_lb_endpoint(LbEndpoint("api", "host-a", "127.0.0.1:30001", 101, 1.0))
    finally:
        store.close()
    asked: list[list[str]] = []
    list_lb_endpoints_of = Store.list_lb_endpoints_of

    def recording(self: Store, services: list[str]) -> dict[str, tuple[LbEndpoint, ...]]:
        asked.append(list(services))
        return list_lb_endpoints_of(self, services)

    def one_service(self: Store, service: str) -> list[LbEndpoint]:
        raise AssertionError(f"the endpoints of {service!r} read alone")

    monkeypatch.setattr(Store, "list_lb_endpoints_of", recording)
    monkeypatch.setattr(Store, "list_lb_endpoints", one_service)
    controller = LocalController(home, FakeClock(), start_daemon=False)
    views = {view.service.name: view for view in controller.get_status()}
    assert asked == [["api", "web", "worker"]]  # one query for the three services
    assert [e.pid for e in views["web"].lb_endpoints] == [100]
    assert [e.pid for e in views["api"].lb_endpoints] == [101]
    assert views["worker"].lb_endpoints == ()
    asked.clear()
    (view,) = controller.get_status(["web"])  # named: that service's rows, still not per service
    assert asked == [["web"]] and [e.pid for e in view.lb_endpoints] == [100]


def _view(name: str, port: int, status: ServiceStatus = ServiceStatus.READY) -> ServiceView:
    service = ServiceRecord(name=name, current_version=1, status=status, status_reason=None, lb_port=port,
                            lb_pid=None, lb_policy="least_load", deleting=False, created_at=0.0, next_replica_id=2,
                            endpoint_host="127.0.0.5")
    return ServiceView(service=service, policy="Fixed 1 replica", load_balancing_policy="least_load", replicas=(),
                       events=(), controller_id="c1")


def _controller(host: str) -> ControllerView:
    return ControllerView(loop_id=f"{host}-1-aaaaaa", host=host, services=(), renewed_at=0.0, live=True)


def test_each_endpoint_is_asked_once_though_a_service_endpoint_is_also_its_hosts() -> None:
    answers: dict[str, EndpointIdentity | str] = {
        "http://127.0.0.5:30001": EndpointIdentity("web", "c1", 7),
        "http://127.0.0.6:30001": EndpointIdentity("web", "c1", 8),
        "http://127.0.0.5:30002": EndpointIdentity("api", "c2", 9),  # another state's service at api's port
    }
    asked: list[str] = []

    def ask(url: str) -> EndpointIdentity | str:
        asked.append(url)
        return answers.get(url, REFUSED)

    views = [_view("web", 30001), _view("api", 30002), _view("batch", 30003, ServiceStatus.REPLICA_INIT)]
    web, api, batch = check_status_endpoints(views, [_controller("127.0.0.5"), _controller("127.0.0.6")], ask)
    # web's and api's own endpoints (127.0.0.5, this host's address) once each, though each is also the
    # endpoint of host 127.0.0.5; every other host endpoint once.
    assert sorted(asked) == sorted(["http://127.0.0.5:30001", "http://127.0.0.5:30002", "http://127.0.0.5:30003",
                                    "http://127.0.0.6:30001", "http://127.0.0.6:30002", "http://127.0.0.6:30003"])
    # The one answer serves both: the endpoint problem and the host endpoint's liveness.
    assert web.endpoint_problem is None
    assert [(e.url, e.live) for e in web.endpoints] == [("http://127.0.0.5:30001", True),
                                                         ("http://127.0.0.6:30001", True)]
    assert api.endpoint_problem is not None and "controller c2" in api.endpoint_problem
    assert [e.live for e in api.endpoints] == [False, False]
    assert batch.endpoint_problem is None  # not expected to answer yet: its own endpoint not asked for it
    assert [e.live for e in batch.endpoints] == [False, False]
