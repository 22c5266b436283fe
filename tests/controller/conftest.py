from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller import plan as plan_module
from skyserve_lite.controller import reconcile as reconcile_module
from skyserve_lite.controller import snapshots as snapshots_module
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.plan import InstanceIndex, PassPlan, ReplicaKey, ServiceSnapshot
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.controller.settled import ServiceMemos
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ServiceRecord
from skyserve_lite.state.store import Store
from tests.postgres import PostgresServer

TASK = """\
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 60
  replicas: {replicas}
run: python -m http.server $PORT
"""


class Harness:
    """A reconciler wired to fakes that record what it did."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.store = Store.open(home)
        self.clock = FakeClock()
        self.provider = FakeProvider(name="local")
        self.prober = FakeProber()
        self.lbs = FakeLoadBalancerRunner()
        self.settings = ControllerSettings(probe_failure_grace_seconds=180, provision_timeout_seconds=600,
                                           failure_limit=3, drain_seconds=5)
        self.reconciler = Reconciler(self.store, {"local": self.provider}, self.prober, self.lbs, self.clock,
                                     self.settings)

    def create(self, name: str = "svc", replicas: int = 2, text: str | None = None) -> ServiceRecord:
        text = text or TASK.format(replicas=replicas)
        task = SubmittedTask(text=text, source="/tasks/svc.yaml", spec=parse_task(text))
        return self.store.create_service(name, task, 30001 + len(self.store.list_services()),
                                         self.clock.now())

    def update(self, text: str, mode: str = "rolling", name: str = "svc") -> int:
        task = SubmittedTask(text=text, source="/tasks/svc.yaml", spec=parse_task(text))
        return self.store.add_version(name, task, mode, self.clock.now()).version

    def tick(self, seconds: float = 1.0) -> PassPlan:
        self.clock.advance(seconds)
        return self.reconciler.reconcile_once()

    def replicas(self, name: str = "svc") -> list[ReplicaRecord]:
        return self.store.list_replicas(name)

    def statuses(self, name: str = "svc") -> dict[int, str]:
        return {r.replica_id: r.status.value for r in self.replicas(name)}

    def service(self, name: str = "svc") -> ServiceRecord:
        return self.store.get_service(name)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "home")
    yield h
    h.store.close()


@pytest.fixture
def postgres_harness(tmp_path: Path, postgres_server: PostgresServer,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """A ``Harness`` whose store is a database of its own on the session's PostgreSQL server (through
    ``SKY_LITE_DB_URL``, as a controller finds it), dropped after the test."""
    database = postgres_server.create_database()
    monkeypatch.setenv("SKY_LITE_DB_URL", postgres_server.url(database))
    h = Harness(tmp_path / "home")
    assert h.store.engine == "postgresql"
    yield h
    h.store.close()
    postgres_server.drop_database(database)


@pytest.fixture(autouse=True)
def settled_services_plan_what_a_whole_pass_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """In every controller test, each service's plan as the controller makes it (skipping what a settled
    service would decide again) is checked against the plan of the whole pass over the same inputs."""
    whole = plan_module.plan_service_pass

    def checked(snapshot: ServiceSnapshot, index: InstanceIndex, probes: Mapping[ReplicaKey, ProbeResult],
                now: float, settings: ControllerSettings, settled: ServiceMemos | None = None) -> PassPlan:
        made = whole(snapshot, index, probes, now, settings, settled)
        if settled is not None:
            assert made == whole(snapshot, index, probes, now, settings), snapshot.service.name
        return made

    monkeypatch.setattr(reconcile_module, "plan_service_pass", checked)


@pytest.fixture(autouse=True)
def snapshots_handed_back_equal_what_a_fresh_read_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """In every controller test, a snapshot a pass is handed back from the last pass (nothing it reads
    changed) is checked against the snapshot built afresh from the same reads (the same rows and values:
    what it checks is the comparison that hands one back, not the store's reads)."""
    read = snapshots_module.read_snapshot

    def checked(*args: Any, **kwargs: Any) -> ServiceSnapshot:
        made = read(*args, **kwargs)
        last = kwargs.get("last", args[8] if len(args) > 8 else None)
        if made is last:
            fresh = read(*args[:8], **{k: v for k, v in kwargs.items() if k != "last"})
            assert fresh == made, made.service.name
        return made

    monkeypatch.setattr(reconcile_module, "read_snapshot", checked)


@pytest.fixture
def carried(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the services found settled (not planned whole), pass after pass."""
    names: list[str] = []
    carry = ServiceMemos.carry

    def recording(self: ServiceMemos, snapshot: ServiceSnapshot) -> None:
        names.append(snapshot.service.name)
        carry(self, snapshot)

    monkeypatch.setattr(ServiceMemos, "carry", recording)
    yield names


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ServiceSnapshot]]:
    """Every snapshot the passes were handed, in order."""
    snapshots: list[ServiceSnapshot] = []
    read_snapshot = vars(reconcile_module)["read_snapshot"]  # as the autouse check above wraps it

    def recording(*args: object, **kwargs: object) -> ServiceSnapshot:
        snapshot: ServiceSnapshot = read_snapshot(*args, **kwargs)
        snapshots.append(snapshot)
        return snapshot

    monkeypatch.setattr(reconcile_module, "read_snapshot", recording)
    yield snapshots
