"""Failures stay inside their boundary: a provider that raises anything, from any method, costs only its
own cloud's decisions for the pass; an unreadable or unplannable service costs only itself."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller import plan, reconcile
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.pass_types import PassPlan, ServiceSnapshot
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.base import Instance, LaunchOutcome, LaunchRequest, ReplicaLog
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaStatus, ServiceStatus
from skyserve_lite.state.store import UNFENCED, Store

LOCAL = "service: {replicas: 1}\nrun: python serve.py\n"
AWS = "resources: {cloud: aws, region: us-east-1, image_id: ami-1}\nservice: {replicas: 1}\nrun: python serve.py\n"


class ProfileNotFound(Exception):  # the shape of a vendor error nobody translated (botocore's, say)
    pass


ERRORS: list[Callable[[], Exception]] = [
    lambda: ProfileNotFound("The config profile (prod) could not be found"),
    lambda: NotADirectoryError(20, "Not a directory"),
    lambda: KeyError("Reservations"),
    lambda: RuntimeError("boom"),
]


class RaisingProvider:
    """A fake whose method ``failing`` raises ``error`` (every other method works)."""

    def __init__(self, name: str, failing: str, error: Callable[[], Exception]) -> None:
        self.name = name
        self.fake = FakeProvider(name=name)
        self.failing = failing
        self.error = error

    def _maybe_raise(self, method: str) -> None:
        if method == self.failing:
            raise self.error()

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        self._maybe_raise("launch")
        return self.fake.launch(requests)

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        self._maybe_raise("list_instances")
        return self.fake.list_instances(regions)

    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        self._maybe_raise("find_instances")
        return self.fake.find_instances(instance_ids, regions)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self._maybe_raise("terminate")
        self.fake.terminate(instance_ids)

    def release_service(self, service: str) -> None:
        self._maybe_raise("release_service")
        self.fake.release_service(service)

    def read_log(self, service: str, replica_id: int, instance_id: str | None, region: str | None
                 ) -> ReplicaLog | None:
        self._maybe_raise("read_log")
        return None

    def abandon(self) -> None:
        self._maybe_raise("abandon")


class Fleet:
    """Two services: ``good`` on a working local fake, ``bad`` on a cloud whose provider raises."""

    def __init__(self, home: Path, aws: RaisingProvider) -> None:
        self.store = Store.open(home)
        self.clock = FakeClock()
        self.local = FakeProvider(name="local")
        self.aws = aws
        self.lbs = FakeLoadBalancerRunner()
        settings = ControllerSettings(drain_seconds=0)
        self.reconciler = Reconciler(self.store, {"local": self.local, "aws": aws}, FakeProber(), self.lbs,
                                     self.clock, settings)
        for name, text, port in (("good", LOCAL, 30001), ("bad", AWS, 30002)):
            self.store.create_service(name, SubmittedTask(text, f"/t/{name}.yaml", parse_task(text)), port,
                                      self.clock.now())

    def tick(self) -> None:
        self.clock.advance(1)
        self.reconciler.reconcile_once()

    def status(self, name: str) -> ServiceStatus:
        return self.store.get_service(name).status


@pytest.fixture(params=range(len(ERRORS)), ids=["vendor", "oserror", "keyerror", "runtimeerror"])
def error(request: pytest.FixtureRequest) -> Callable[[], Exception]:
    index: int = request.param
    return ERRORS[index]


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[Callable[[str, Callable[[], Exception]], Fleet]]:
    made: list[Fleet] = []

    def make(failing: str, error: Callable[[], Exception]) -> Fleet:
        fleet = Fleet(tmp_path / "home", RaisingProvider("aws", failing, error))
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.store.close()


def test_an_inventory_that_raises_leaves_the_other_cloud_s_service_going(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet], error: Callable[[], Exception]) -> None:
    fleet = make_fleet("list_instances", error)
    fleet.tick()
    fleet.tick()
    assert fleet.status("good") is ServiceStatus.READY
    assert [r.status for r in fleet.store.list_replicas("good")] == [ReplicaStatus.READY]
    # Nothing is decided blind for the cloud that could not be listed: its replica stays as launched.
    assert [r.status for r in fleet.store.list_replicas("bad")] == [ReplicaStatus.PROVISIONING]
    assert sorted(name for name, _port in fleet.lbs.started) == ["bad", "good"]


def test_a_launch_that_raises_leaves_the_rest_of_the_pass_done(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet], error: Callable[[], Exception]) -> None:
    fleet = make_fleet("launch", error)
    fleet.tick()
    (bad,) = fleet.store.list_replicas("bad")
    assert (bad.status, bad.instance_id) == (ReplicaStatus.PROVISIONING, None)
    assert bad.status_reason is not None and "launch will be retried" in bad.status_reason
    assert type(error()).__name__ in bad.status_reason
    # The steps after the launches ran: load balancers, statuses, events of both services.
    assert sorted(name for name, _port in fleet.lbs.started) == ["bad", "good"]
    assert fleet.status("bad") is ServiceStatus.REPLICA_INIT
    assert any("launch failed" in e.message for e in fleet.store.list_events("bad"))
    fleet.tick()
    assert fleet.status("good") is ServiceStatus.READY


def test_a_terminate_that_raises_is_asked_again_next_pass(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet], error: Callable[[], Exception]) -> None:
    fleet = make_fleet("terminate", error)
    fleet.tick()
    fleet.tick()
    fleet.store.mark_deleting(["good", "bad"])
    fleet.tick()
    fleet.tick()
    assert fleet.store.find_service("good") is None  # the working cloud's service went
    assert [r.status for r in fleet.store.list_replicas("bad")] == [ReplicaStatus.SHUTTING_DOWN]
    fleet.aws.failing = ""
    fleet.tick()
    fleet.tick()
    assert fleet.store.find_service("bad") is None


def test_a_release_that_raises_keeps_the_service_until_it_succeeds(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet], error: Callable[[], Exception]) -> None:
    fleet = make_fleet("release_service", error)
    fleet.tick()
    fleet.store.mark_deleting(["good", "bad"])
    for _ in range(3):
        fleet.tick()
    assert fleet.store.find_service("good") is None
    assert fleet.store.find_service("bad") is not None
    assert any("releasing aws resources failed" in e.message for e in fleet.store.list_events("bad"))
    fleet.aws.failing = ""
    fleet.tick()
    assert fleet.store.find_service("bad") is None


def test_abandon_that_raises_still_abandons_the_other_providers(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet], error: Callable[[], Exception]) -> None:
    fleet = make_fleet("abandon", error)
    fleet.reconciler.abandon()
    assert [c.method for c in fleet.local.calls] == ["abandon"]


def test_an_unreadable_service_is_skipped_and_its_instances_are_not_orphans(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet]) -> None:
    fleet = make_fleet("", RuntimeError)
    fleet.tick()
    (bad,) = fleet.store.list_replicas("bad")
    assert bad.instance_id is not None
    # The stored task of "bad" is damaged: that service cannot be read, the other one goes on.
    with fleet.store._write(UNFENCED) as tx:
        db = tx.db
        db.execute("UPDATE versions SET text = ? WHERE service = ?", ("service: [", "bad"))
    reconciler = Reconciler(fleet.store, {"local": fleet.local, "aws": fleet.aws}, FakeProber(), fleet.lbs,
                            fleet.clock, ControllerSettings(drain_seconds=0))
    fleet.clock.advance(1)
    reconciler.reconcile_once()
    assert fleet.status("good") is ServiceStatus.READY
    assert fleet.aws.fake.calls_to("terminate") == []
    assert fleet.store.list_replicas("bad") == [bad]


def test_a_service_whose_planning_raises_is_skipped_and_the_others_are_planned(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet], monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = make_fleet("", RuntimeError)
    fleet.tick()
    def failing_for_bad(snapshot: ServiceSnapshot, *args: Any) -> PassPlan:
        if snapshot.service.name == "bad":
            raise ZeroDivisionError("a planning bug")
        return plan.plan_service_pass(snapshot, *args)

    monkeypatch.setattr(reconcile, "plan_service_pass", failing_for_bad)
    fleet.tick()
    assert fleet.status("good") is ServiceStatus.READY
    assert fleet.status("bad") is ServiceStatus.REPLICA_INIT  # left as it was
    assert fleet.aws.fake.calls_to("terminate") == []  # its instance is no orphan


def test_a_lookup_by_id_that_raises_leaves_the_pass_to_the_listing(
        make_fleet: Callable[[str, Callable[[], Exception]], Fleet], error: Callable[[], Exception]) -> None:
    fleet = make_fleet("find_instances", error)
    fleet.tick()
    fleet.aws.fake.unlisted.update(fleet.aws.fake.instances)  # the listing lags: a lookup by id is tried
    fleet.tick()
    assert fleet.status("good") is ServiceStatus.READY
    assert [r.status for r in fleet.store.list_replicas("bad")] == [ReplicaStatus.PROVISIONING]  # waits
