"""Every controller host serves every service: the load balancers each host keeps (``HostLoadBalancers``), one
process per service and host whoever starts it, their load reports summed per service, and the controllers
and endpoints `controller status` and `serve status` list."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.cli.host_commands import render_controllers
from skyserve_lite.cli.render import endpoint_lines, find_endpoints
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.fleet import ControllerView, find_controller_views
from skyserve_lite.controller.lb_runner import (
    FakeLoadBalancerRunner,
    HostedService,
    HostLbPlan,
    HostLoadBalancers,
    ProcessLoadBalancerRunner,
    lb_pid_path,
    plan_host_lbs,
    stop_host_lbs,
)
from skyserve_lite.controller.leases import LeaseSettings, plan_leases
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import LbReport
from skyserve_lite.state.store import ControllerRow, Store, sum_lb_reports

TASK = "service:\n  readiness_probe: /\n  replicas: 1\nrun: python -m http.server $PORT\n"


def report(at: float, waiting: int = 0, **in_flight: int) -> LbReport:
    return LbReport(reported_at=at, waiting=waiting, in_flight=tuple(sorted(in_flight.items())))


@pytest.mark.parametrize(("reports", "expected"), [
    ([report(10, 1, a=2)], report(10, 1, a=2)),
    # Two hosts' load balancers of one service: added up, as of the newest.
    ([report(10, 1, a=2), report(11, 0, a=1, b=3)], report(11, 1, a=3, b=3)),
    # A host that stopped reporting 10 s before the newest still counts; 10.5 s, it is gone.
    ([report(10, 2, a=1), report(20, 0, a=1)], report(20, 2, a=2)),
    ([report(9.5, 2, a=1), report(20, 0, a=1)], report(20, 0, a=1)),
])
def test_sum_lb_reports(reports: list[LbReport], expected: LbReport) -> None:
    assert sum_lb_reports(reports) == expected


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "home")
    for port, name in enumerate(("api", "web"), start=30001):
        opened.create_service(name, SubmittedTask(text=TASK, source="/t.yaml", spec=parse_task(TASK)), port, 100.0)
    try:
        yield opened
    finally:
        opened.close()


def test_each_load_balancer_reports_apart_and_the_readers_sum(store: Store) -> None:
    store.record_lb_report("web", report(100, 1, a=2), "host-a/127.0.0.2:30002")
    store.record_lb_report("web", report(101, 0, a=1), "host-b/127.0.0.3:30002")
    store.record_lb_report("web", report(102, 2, a=1), "host-a/127.0.0.2:30002")  # replaces its own only
    assert store.get_lb_report("web") == report(102, 2, a=2)
    assert store.list_lb_reports() == {"web": report(102, 2, a=2)}
    assert store.get_lb_report("api") is None
    # Request counts of several load balancers add up as they are written.
    store.record_request_counts("web", {100: 3})
    store.record_request_counts("web", {100: 4})
    assert store.count_requests("web", 100) == 7


def test_every_controller_is_listed_with_what_it_owns(store: Store) -> None:
    settings = LeaseSettings(ttl_seconds=30, renew_seconds=10)
    for loop, host, now in (("loop-a", "127.0.0.2", 100.0), ("loop-b", "127.0.0.3", 101.0)):
        plan = plan_leases(store.list_leases(), now, loop, store.list_controllers(), settings)
        store.apply_leases(loop, host, plan, now, settings.ttl_seconds)
    rows = store.list_controller_rows()
    assert [(row.loop_id, row.host, row.renewed_at) for row in rows] == [
        ("loop-a", "127.0.0.2", 100.0), ("loop-b", "127.0.0.3", 101.0)]
    # Two services, the first loop alone at first: it claimed its share of one live loop, both.
    assert rows[0].services == ("api", "web") and rows[1].services == ()


@pytest.mark.parametrize(("now", "live"), [(129.0, {"a": True, "b": True}), (130.5, {"a": False, "b": True}),
                                           (200.0, {"a": False, "b": False})])
def test_find_controller_views(now: float, live: dict[str, bool]) -> None:
    rows = [ControllerRow("b", "127.0.0.3", 90.0, 101.0, ("web",)), ControllerRow("a", "127.0.0.2", 90.0, 100.0)]
    views = find_controller_views(rows, now, ttl_seconds=30.0)
    assert {view.loop_id: view.live for view in views} == live
    # Live ones first, then by host.
    assert [view.loop_id for view in views] == sorted("ab", key=lambda i: (not live[i], i))


def test_render_controllers() -> None:
    views = [ControllerView("host-a-41-abc123", "127.0.0.2", ("api", "web"), 95.0, True),
             ControllerView("host-b-42-def456", "127.0.0.3", (), 40.0, False)]
    assert render_controllers(views, now=100.0) == [
        "Controllers sharing the database (1 live):",
        "ID                HOST       SERVICES  LAST RENEWAL  LIVE",
        "host-a-41-abc123  127.0.0.2  api,web   5s ago        yes",
        "host-b-42-def456  127.0.0.3  -         60s ago       no",
    ]


@pytest.mark.parametrize(("endpoint", "views", "expected"), [
    ("http://127.0.0.1:30001", [], [("http://127.0.0.1:30001", False)]),
    ("https://203.0.113.5:30001",
     [ControllerView("a", "203.0.113.5", (), 0, True), ControllerView("b", "203.0.113.6", (), 0, False),
      ControllerView("c", "203.0.113.5", (), 0, False), ControllerView("d", "::1", (), 0, True)],
     [("https://203.0.113.5:30001", True), ("https://203.0.113.6:30001", False), ("https://[::1]:30001", True)]),
])
def test_find_endpoints(endpoint: str, views: list[ControllerView], expected: list[tuple[str, bool]]) -> None:
    assert find_endpoints(endpoint, 30001, views) == expected


def test_endpoint_lines_only_with_several_hosts() -> None:
    one = [("web", [("http://127.0.0.1:30001", True)])]
    assert endpoint_lines(one) == []
    two = [("web", [("http://127.0.0.2:30001", True), ("http://127.0.0.3:30001", False)])]
    assert endpoint_lines(two) == ["Endpoints of web: http://127.0.0.2:30001 (live), http://127.0.0.3:30001 (not live)"]


@pytest.mark.parametrize(("services", "running", "taken", "started", "stopped"), [
    ([HostedService("api", 30001), HostedService("web", 30002)], set(), set(), ["api", "web"], []),
    ([HostedService("api", 30001), HostedService("web", 30002)], {("api", 30001)}, set(), ["web"], []),
    # A port moved by the owner: this host starts one at the new port and stops the one at the old.
    ([HostedService("api", 30005)], {("api", 30001)}, set(), ["api"], [("api", 30001)]),
    # Being deleted: none started; the running one ends by itself.
    ([HostedService("api", 30001, deleting=True)], {("api", 30001)}, set(), [], []),
    # Gone: stopped (it has ended by itself, or is ending: its pid file is forgotten).
    ([], {("api", 30001)}, set(), [], [("api", 30001)]),
    # A port another process holds here: left to the owner's pass, which moves it (unless pinned).
    ([HostedService("api", 30001)], set(), {30001}, [], []),
])
def test_plan_host_lbs(services: list[HostedService], running: set[tuple[str, int]], taken: set[int],
                       started: list[str], stopped: list[tuple[str, int]]) -> None:
    plan = plan_host_lbs(services, running, lambda port: port not in taken)
    assert [service.name for service in plan.start] == started
    assert list(plan.stop) == stopped


@dataclass(frozen=True)
class Row:
    name: str
    lb_port: int
    deleting: bool = False


class Services:
    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = list(rows)

    def list_services(self) -> list[Row]:
        return self.rows


def test_host_load_balancers_start_each_service_once() -> None:
    runner = FakeLoadBalancerRunner()
    services = Services([Row("api", 30001), Row("web", 30002)])
    clock = FakeClock()
    host = HostLoadBalancers(services, runner, clock.now, sweep_seconds=10)
    assert [(s.name, s.port) for s in host.reconcile_host_lbs().start] == [("api", 30001), ("web", 30002)]
    assert host.reconcile_host_lbs() == HostLbPlan()  # steady: nothing more
    crashed = runner.find_running("web", 30002)
    assert crashed is not None
    runner.crash(crashed)
    clock.advance(9)
    assert host.reconcile_host_lbs() == HostLbPlan()  # not looked at until the sweep is due...
    clock.advance(1)
    assert [(s.name, s.port) for s in host.reconcile_host_lbs().start] == [("web", 30002)]  # ...10 s on
    # A change of the services is acted on at once.
    services.rows.append(Row("new", 30003))
    services.rows[0] = Row("api", 30004)  # the owner moved its port
    plan = host.reconcile_host_lbs()
    assert [(s.name, s.port) for s in plan.start] == [("api", 30004), ("new", 30003)]
    assert plan.stop == (("api", 30001),)
    assert runner.started == [("api", 30001), ("web", 30002), ("web", 30002), ("api", 30004), ("new", 30003)]
    assert sorted(runner.list_running()) == [("api", 30004), ("new", 30003), ("web", 30002)]


@pytest.fixture
def fake_lb(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A process that looks like a load balancer of the home to ``ProcessLoadBalancerRunner`` (its command
    line names the module and the home), recorded as the one of service web at port 30002."""
    home = tmp_path / "home"
    home.mkdir()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "skyserve_lite.lb", str(home)],
                               start_new_session=True)
    path = lb_pid_path(home, "web", 30002)
    path.parent.mkdir()
    procs.write_pid_file(path, procs.RecordedProcess.of(process.pid))
    try:
        yield home, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
        process.wait()


def test_a_running_load_balancer_is_not_started_again(fake_lb: tuple[Path, subprocess.Popen[bytes]]) -> None:
    home, process = fake_lb
    runner = ProcessLoadBalancerRunner(home, "127.0.0.2")
    assert runner.find_running("web", 30002) == process.pid
    assert runner.start("web", 30002) == process.pid  # the owner's executor after HostLoadBalancers: the same
    assert runner.find_running("web", 30003) is None and runner.find_running("api", 30002) is None
    assert runner.list_running() == {("web", 30002): process.pid}


def test_the_port_of_this_homes_own_load_balancer_counts_as_free(fake_lb: tuple[Path, subprocess.Popen[bytes]]
                                                                 ) -> None:
    """The owner's executor checks a service's port before it starts its load balancer; where this host's
    ``HostLoadBalancers`` runs one at that port already, the port is the service's, not taken (else the
    owner would move the endpoint to another port at every takeover)."""
    home, _process = fake_lb
    with socket.socket() as holder:  # what the load balancer does: listen on the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        runner = ProcessLoadBalancerRunner(home, "127.0.0.1")
        assert runner.is_port_free(port) is False  # another process's
        lb_pid_path(home, "web", 30002).rename(lb_pid_path(home, "web", port))
        assert runner.is_port_free(port) is True


def test_stop_host_lbs_stops_this_hosts_load_balancers(fake_lb: tuple[Path, subprocess.Popen[bytes]]) -> None:
    home, process = fake_lb
    assert stop_host_lbs(home) == ["web.30002"]
    assert process.wait(timeout=30) != 0
    assert not lb_pid_path(home, "web", 30002).exists()
    assert stop_host_lbs(home) == []  # idempotent
