"""Service leases in the store, on both engines: claims are compare-and-set on the token, a takeover moves
the token on, and a write fenced by a stale token writes nothing for that service."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.leases import Fence, Lease, LeasePlan
from skyserve_lite.state.models import AutoscalerObservation, ReplicaRecord, ReplicaStatus, ServiceStatus
from skyserve_lite.state.store import Store

TEXT = "service:\n  replicas: 1\nrun: echo hi\n"
TTL = 30.0


def task() -> SubmittedTask:
    return SubmittedTask(text=TEXT, source="/tmp/svc.yaml", spec=parse_task(TEXT))


def template() -> ReplicaRecord:
    return ReplicaRecord(service="", replica_id=0, version=1, status=ReplicaStatus.PROVISIONING,
                         cloud="local", launched_at=1.0, status_since=1.0, launch_token="tok")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "home")
    opened.create_service("a", task(), 30001, 1.0)
    opened.create_service("b", task(), 30002, 1.0)
    yield opened
    opened.close()


def claim(store: Store, me: str, now: float, *services: str) -> dict[str, int]:
    leases = {lease.service: lease for lease in store.list_leases()}
    plan = LeasePlan(claims=tuple(leases[name] for name in services), heartbeat=True)
    return store.apply_leases(me, "host", plan, now, TTL)


def test_services_never_claimed_have_token_zero_and_no_owner(store: Store) -> None:
    assert store.list_leases() == [Lease("a", None, 0.0, 0), Lease("b", None, 0.0, 0)]
    assert store.list_controllers() == {}


def test_a_claim_takes_the_lease_with_token_one_and_writes_the_loops_row(store: Store) -> None:
    assert claim(store, "one", 100.0, "a") == {"a": 1}
    assert store.list_leases()[0] == Lease("a", "one", 100.0 + TTL, 1)
    assert store.list_controllers() == {"one": 100.0}


def test_of_two_claims_read_at_the_same_token_only_the_first_takes_the_lease(store: Store) -> None:
    stale = store.list_leases()  # both loops read the leases before either claimed
    plan = LeasePlan(claims=(stale[0],))
    assert store.apply_leases("one", "host", plan, 100.0, TTL) == {"a": 1}
    assert store.apply_leases("two", "host", plan, 100.0, TTL) == {}
    assert store.list_leases()[0].owner == "one"


def test_a_takeover_of_an_expired_lease_moves_the_token_on(store: Store) -> None:
    claim(store, "one", 100.0, "a")
    assert claim(store, "two", 100.0 + TTL, "a") == {"a": 2}  # expired at 130: taken over
    assert store.list_leases()[0] == Lease("a", "two", 130.0 + TTL, 2)
    # The old owner's renewal, with the token it held, changes nothing.
    renewal = LeasePlan(renewals=(Lease("a", "one", 130.0, 1),))
    assert store.apply_leases("one", "host", renewal, 131.0, TTL) == {}
    assert store.list_leases()[0] == Lease("a", "two", 130.0 + TTL, 2)


def test_a_release_keeps_the_row_and_its_token_with_no_owner(store: Store) -> None:
    claim(store, "one", 100.0, "a")
    (held, _) = store.list_leases()
    assert store.apply_leases("one", "host", LeasePlan(releases=(held,)), 101.0, TTL) == {}
    assert store.list_leases()[0] == Lease("a", None, 0.0, 1)
    assert claim(store, "two", 102.0, "a") == {"a": 2}


def test_a_deleted_services_lease_goes_with_it(store: Store) -> None:
    claim(store, "one", 100.0, "a", "b")
    store.delete_service("a")
    assert [lease.service for lease in store.list_leases()] == ["b"]


def test_forget_controller_removes_the_loops_row(store: Store) -> None:
    claim(store, "one", 100.0, "a")
    store.forget_controller("one")
    assert store.list_controllers() == {}


def test_writes_fenced_by_a_stale_token_write_nothing_for_that_service(store: Store) -> None:
    """Loop "one" planned with token 1 for both services, paused, and "two" took "a" over (token 2). Every
    write "one" makes afterwards for "a" is dropped; its writes for "b", still its own, commit."""
    claim(store, "one", 100.0, "a", "b")
    claim(store, "two", 100.0 + TTL, "a")
    replica_a = dataclasses.replace(template(), service="a", replica_id=1)
    replica_b = dataclasses.replace(template(), service="b", replica_id=1)
    state = AutoscalerState(version=1, target=3, upscale_count=0, downscale_count=0, last_decision_at=None)
    observation = AutoscalerObservation(policy="fixed", raw_target=3)
    with store.fenced(Fence("one", {"a": 1, "b": 1})):
        assert store.add_replica_batches([("a", 2, template()), ("b", 1, template())]) == [
            None, [dataclasses.replace(template(), service="b", replica_id=1)]]
        store.put_replicas([replica_a, replica_b], {"a": (1,), "b": (1,)})
        store.set_service_statuses([("a", ServiceStatus.READY, None), ("b", ServiceStatus.READY, None)])
        store.put_autoscaler_states([("a", state, observation), ("b", state, observation)])
        store.add_events([(1.0, "a", None, "replica", "from one"), (1.0, "b", None, "replica", "from one")])
        store.set_load_balancer("a", 4242, "round_robin")
        store.delete_service("a")
    assert [r.service for r in store.list_replicas()] == ["b"]
    a, b = store.get_service("a"), store.get_service("b")
    assert (a.status, a.active_versions, a.lb_pid, a.next_replica_id) == (ServiceStatus.CONTROLLER_INIT, None, None, 1)
    assert (b.status, b.active_versions, b.next_replica_id) == (ServiceStatus.READY, (1,), 2)
    assert store.get_autoscaler_state("a") is None and store.get_autoscaler_state("b") is not None
    assert [e.message for e in store.list_events("a")] == [] and [e.message for e in store.list_events("b")] == [
        "from one"]


def test_the_new_owners_fenced_writes_commit(store: Store) -> None:
    claim(store, "one", 100.0, "a")
    claim(store, "two", 100.0 + TTL, "a")
    with store.fenced(Fence("two", {"a": 2})):
        store.set_service_statuses([("a", ServiceStatus.READY, None)])
        store.delete_replicas([("a", 1)])
    assert store.get_service("a").status is ServiceStatus.READY


def test_outside_a_fence_writes_are_not_fenced(store: Store) -> None:
    """A sole controller without leases (and the CLI) writes as before."""
    claim(store, "two", 100.0, "a")
    store.set_service_statuses([("a", ServiceStatus.READY, None)])
    assert store.get_service("a").status is ServiceStatus.READY


@pytest.mark.parametrize(("now", "fence", "asked", "lost"), [
    # Held with the token the pass planned with, unexpired: nothing lost.
    (140.0, Fence("two", {"a": 2}), {"a"}, set()),
    # "one" planned with token 1 for "a"; "two" took it over at 130: lost. "b" is still one's.
    (140.0, Fence("one", {"a": 1, "b": 1}), {"a", "b"}, {"a"}),
    # "b" (one's, expires at 155) expired by the loop's own clock, though nobody claimed it yet: lost.
    (155.0, Fence("one", {"a": 1, "b": 1}), {"b"}, {"b"}),
    # A service the fence does not name (an orphan's) that exists: another loop's to claim, lost.
    (140.0, Fence("two", {"a": 2}), {"b"}, {"b"}),
    # ... and one that is gone from the database is not: its orphans are this loop's to terminate.
    (140.0, Fence("two", {"a": 2}), {"gone"}, set()),
])
def test_find_lost_leases_names_the_services_the_fence_no_longer_covers(
        store: Store, now: float, fence: Fence, asked: set[str], lost: set[str]) -> None:
    claim(store, "one", 100.0, "a")
    claim(store, "one", 125.0, "b")
    claim(store, "two", 100.0 + TTL, "a")
    with store.fenced(fence):
        assert store.find_lost_leases(asked, now) == lost


def test_find_lost_leases_outside_a_fence_finds_nothing(store: Store) -> None:
    claim(store, "one", 100.0, "a")
    assert store.find_lost_leases({"a", "b"}, 1000.0) == frozenset()


def test_a_fenced_write_naming_many_services_drops_only_the_lost_ones(store: Store) -> None:
    """Past 50 services a fenced write reads every lease row of the loop rather than the named ones: the
    same rule either way."""
    for index in range(60):
        store.create_service(f"s{index:02}", task(), 31000 + index, 1.0)
    names = [f"s{index:02}" for index in range(60)]
    claim(store, "one", 100.0, *names)
    claim(store, "two", 100.0 + TTL, "s07")
    with store.fenced(Fence("one", dict.fromkeys(names, 1))):
        store.set_service_statuses([(name, ServiceStatus.READY, None) for name in names])
    assert [name for name in names if store.get_service(name).status is not ServiceStatus.READY] == ["s07"]
