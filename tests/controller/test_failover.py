"""Three controller loops in one process on one PostgreSQL database, one fake cloud, one FakeClock: services
spread over the loops; a loop that stops renewing (killed between a launch's intent and its cloud call, or
after the call) loses its services within the lease TTL; a loop paused past its lease writes nothing when it
wakes. Every time: no replica launched twice, no instance left without its replica row."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.leases import LeaseHolder, LeaseSettings
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.store import Store
from tests.postgres import PostgresServer

from .conftest import TASK

TTL, RENEW, INTERVAL = 30.0, 10.0, 2.0
SERVICES = ("a", "b", "c")


class Killed(BaseException):
    """The process died here: nothing after it runs (not an ``Exception``: no handler of the pass catches it)."""


@dataclass
class Cloud:
    """One loop's view of the shared fake cloud: ``on_launch`` may kill the loop before or after the call,
    or pause it (run the other loops meanwhile)."""

    shared: FakeProvider
    on_launch: Any = None  # "before" | "after" | a callable run after the call, before its outcome is stored
    on_list: Any = None  # a callable run once before the next listing (a loop paused after reading its leases)
    name: str = "local"
    launched: list[tuple[str, int]] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)  # instance ids this loop asked to terminate

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        if callable(self.on_list):
            pause, self.on_list = self.on_list, None
            pause()
        return self.shared.list_instances(regions)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self.terminated.extend(instance_ids)
        self.shared.terminate(instance_ids)

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        if self.on_launch == "before":
            raise Killed()
        outcomes = self.shared.launch(requests)
        self.launched.extend((r.service, r.replica_id) for r in requests)
        if self.on_launch == "after":
            raise Killed()
        if callable(self.on_launch):
            pause, self.on_launch = self.on_launch, None
            pause()
        return outcomes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


class Fleet:
    def __init__(self, tmp_path: Path, count: int) -> None:
        self.clock = FakeClock()
        self.cloud = FakeProvider(name="local")
        self.settings = ControllerSettings(drain_seconds=2, lease_ttl_seconds=TTL, lease_renew_seconds=RENEW)
        self.stores = [Store.open(tmp_path / f"home{n}") for n in range(count)]
        self.clouds = [Cloud(self.cloud) for _ in range(count)]
        self.loops = [Reconciler(store, {"local": cloud}, FakeProber(), FakeLoadBalancerRunner(), self.clock,
                                 self.settings, leases=LeaseHolder(store, self.clock, f"loop{n}", f"host{n}",
                                                                   LeaseSettings(TTL, RENEW)))
                      for n, (store, cloud) in enumerate(zip(self.stores, self.clouds, strict=True))]
        self.alive = set(range(count))
        text = TASK.format(replicas=2)
        for port, name in enumerate(SERVICES, start=30001):
            self.stores[0].create_service(name, SubmittedTask(text=text, source="/t.yaml", spec=parse_task(text)),
                                          port, self.clock.now())

    def run(self, seconds: float) -> None:
        """Every live loop passes every ``INTERVAL`` for ``seconds``; one killed mid-pass is dead from then."""
        for _ in range(int(seconds / INTERVAL)):
            self.clock.advance(INTERVAL)
            for n in sorted(self.alive):
                try:
                    self.loops[n].reconcile_once()
                except Killed:
                    self.alive.discard(n)

    def owners(self) -> dict[str, str | None]:
        return {lease.service: lease.owner for lease in self.stores[0].list_leases()}

    def check_converged(self) -> None:
        """Every service 2 READY replicas; every live instance claimed by exactly one replica row; no
        (service, replica id) with two live instances."""
        store = self.stores[0]
        live = [i for i in self.cloud.instances.values() if i.state is not InstanceState.TERMINATED]
        assert [key for key, n in Counter((i.service, i.replica_id) for i in live).items() if n > 1] == []
        rows = store.list_replicas()
        claimed = {r.instance_id for r in rows if r.instance_id is not None and not r.status.is_terminal}
        assert {i.instance_id for i in live} == claimed  # nothing leaked, nothing missing
        for name in SERVICES:
            assert sorted(r.status.value for r in store.list_replicas(name) if not r.status.is_terminal) == [
                "READY", "READY"], name


@pytest.fixture
def fleet(tmp_path: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    database = postgres_server.create_database()
    monkeypatch.setenv("SKY_LITE_DB_URL", postgres_server.url(database))
    made = Fleet(tmp_path, 3)
    assert made.stores[0].engine == "postgresql"
    yield made
    for store in made.stores:
        store.close()
    postgres_server.drop_database(database)


def test_services_spread_one_per_loop_and_converge(fleet: Fleet) -> None:
    fleet.run(12)
    assert sorted(str(owner) for owner in fleet.owners().values()) == ["loop0", "loop1", "loop2"]
    fleet.check_converged()
    assert len(fleet.cloud.instances) == 6  # each replica launched once, whoever owned it first


def test_services_created_later_spread_over_the_live_loops_only(fleet: Fleet) -> None:
    fleet.run(12)
    text = TASK.format(replicas=2)

    def create(names: str, port: int) -> None:
        for offset, name in enumerate(names):  # through another loop's store, as a second host's CLI would
            fleet.stores[1].create_service(name, SubmittedTask(text=text, source="/t.yaml", spec=parse_task(text)),
                                           port + offset, fleet.clock.now())

    def loads() -> list[int]:
        return sorted(Counter(fleet.owners().values()).values())

    # 3 new services over 3 live loops holding one each: ceil(6 / 3) = 2 each, none to the first to look.
    create("def", 30011)
    fleet.run(12)
    assert Counter(fleet.owners().values()) == {"loop0": 2, "loop1": 2, "loop2": 2}
    # loop2 stops renewing (kill -9): its 2 are taken over, and 6 more services go to the 2 live loops only,
    # ceil(12 / 2) = 6 each.
    fleet.alive.discard(2)
    fleet.run(TTL + 2 * INTERVAL)
    create("ghijkl", 30021)
    fleet.run(12)
    assert Counter(fleet.owners().values()) == {"loop0": 6, "loop1": 6}, loads()
    for name in "defghijkl":  # and each of them is acted on by its owner
        assert sorted(r.status.value for r in fleet.stores[0].list_replicas(name) if not r.status.is_terminal) == [
            "READY", "READY"], name


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_loop_killed_mid_launch_loses_its_services_within_the_ttl_without_duplicates_or_leaks(
        fleet: Fleet, when: str) -> None:
    fleet.run(12)
    victim = fleet.owners()["b"]
    assert victim is not None
    n = int(victim.removeprefix("loop"))
    # Its replica of b fails: the replacement's intent is written, and the loop dies at the cloud call.
    failed = next(r for r in fleet.stores[0].list_replicas("b") if r.instance_id is not None)
    assert failed.instance_id is not None
    fleet.cloud.set_state(failed.instance_id, InstanceState.EXITED, "run exited with code 1")
    fleet.clouds[n].on_launch = when
    fleet.run(INTERVAL)
    assert n not in fleet.alive
    died_at = fleet.clock.now()
    intent = max(fleet.stores[0].list_replicas("b"), key=lambda r: r.replica_id)
    assert intent.instance_id is None and intent.replica_id > failed.replica_id  # written before the call

    while fleet.owners()["b"] == victim and fleet.clock.now() - died_at <= TTL + INTERVAL:
        fleet.run(INTERVAL)
    owner = fleet.owners()["b"]
    assert owner is not None and owner != victim
    # Its last renewal was at most RENEW before it died; the lease lapses TTL after it, claimed next pass.
    assert TTL - RENEW < fleet.clock.now() - died_at <= TTL + INTERVAL
    fleet.run(6)
    fleet.check_converged()
    launched = Counter((i.service, i.replica_id) for i in fleet.cloud.instances.values())
    assert launched[("b", intent.replica_id)] == 1  # adopted (after) or sent once (before), never twice


def test_a_paused_loop_that_wakes_after_a_takeover_writes_nothing_for_the_service(fleet: Fleet) -> None:
    fleet.run(12)
    victim = fleet.owners()["c"]
    assert victim is not None
    n = int(victim.removeprefix("loop"))
    others = sorted(fleet.alive - {n})
    store = fleet.stores[0]

    def pause() -> None:
        """The loop stalls inside its cloud call for 40 s while the others go on."""
        for _ in range(int((TTL + 10) / INTERVAL)):
            fleet.clock.advance(INTERVAL)
            for other in others:
                fleet.loops[other].reconcile_once()

    failed = next(r for r in store.list_replicas("c") if r.instance_id is not None)
    assert failed.instance_id is not None
    fleet.cloud.set_state(failed.instance_id, InstanceState.EXITED, "run exited with code 1")
    fleet.clouds[n].on_launch = pause
    events_before = len(store.list_events("c", limit=1000))
    fleet.loops[n].reconcile_once()  # plans with its token, launches, stalls, then stores its outcomes
    new_owner = fleet.owners()["c"]
    assert new_owner is not None and new_owner != victim
    # What the woken loop wrote after the takeover was dropped: its launch outcome and its events.
    intent = max(store.list_replicas("c"), key=lambda r: r.replica_id)
    woke_events = [e for e in store.list_events("c", limit=1000)[events_before:] if e.time == fleet.clock.now()]
    assert woke_events == []
    fleet.run(6)
    fleet.check_converged()
    assert Counter((i.service, i.replica_id) for i in fleet.cloud.instances.values())[("c", intent.replica_id)] == 1


def test_a_loop_paused_between_reading_its_leases_and_terminating_terminates_nothing_of_a_lost_service(
        fleet: Fleet) -> None:
    """The loop reads its leases and its replica rows, then stalls 40 s at its cloud listing. Meanwhile the
    others take its service over and replace a failed replica. When it wakes, the listing shows the new
    owner's instance, which its stale rows do not claim: by its plan an orphan. Its rows are fenced; the
    termination is a cloud call, and only the re-check of the lease before the call stops it."""
    fleet.run(12)
    victim = fleet.owners()["c"]
    assert victim is not None
    n = int(victim.removeprefix("loop"))
    others = sorted(fleet.alive - {n})
    store = fleet.stores[0]
    failed = next(r for r in store.list_replicas("c") if r.instance_id is not None)
    assert failed.instance_id is not None
    fleet.cloud.set_state(failed.instance_id, InstanceState.EXITED, "run exited with code 1")

    def pause() -> None:
        for _ in range(int((TTL + 10) / INTERVAL)):
            fleet.clock.advance(INTERVAL)
            for other in others:
                fleet.loops[other].reconcile_once()

    fleet.clouds[n].on_list = pause
    fleet.loops[n].reconcile_once()
    new_owner = fleet.owners()["c"]
    assert new_owner is not None and new_owner != victim
    mine = {r.instance_id for r in store.list_replicas("c") if r.instance_id is not None}
    fresh = mine - {failed.instance_id}
    assert fresh  # the new owner's replacement, unknown to the paused loop's rows
    assert [i for i in fleet.clouds[n].terminated if fleet.cloud.instances[i].service == "c"] == []
    assert all(fleet.cloud.instances[i].state is not InstanceState.TERMINATED for i in fresh)
    fleet.run(6)
    fleet.check_converged()


def test_instances_of_a_service_created_and_launched_by_another_loop_after_this_pass_read_the_services_are_not_orphans(
        fleet: Fleet) -> None:
    """Loop A reads the services (a, b, c); before it lists the cloud, a service d is created and loop B
    claims it and launches its replicas. A's listing then holds d's instances, which no row A read
    claims: only the re-read of the services (d exists, so it is another loop's) keeps A from planning
    them as orphans."""
    fleet.run(12)
    a, b = 0, 1
    text = TASK.format(replicas=2)

    def create_and_launch_elsewhere() -> None:
        fleet.stores[b].create_service("d", SubmittedTask(text=text, source="/t.yaml", spec=parse_task(text)),
                                       30004, fleet.clock.now())
        fleet.loops[b].reconcile_once()

    fleet.clouds[a].on_list = create_and_launch_elsewhere
    plan = fleet.loops[a].reconcile_once()
    assert fleet.owners()["d"] == f"loop{b}"
    launched = [i.instance_id for i in fleet.cloud.instances.values() if i.service == "d"]
    assert len(launched) == 2
    assert [t for t in plan.terminations if t.service == "d"] == []
    assert [e for e in plan.events if e.kind == "orphan"] == []
    assert all(fleet.cloud.instances[i].state is not InstanceState.TERMINATED for i in launched)
