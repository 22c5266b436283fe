"""What a pass costs the store, counted rather than timed: a steady pass over unchanged state writes
nothing, the statements a pass sends do not grow with the number of replicas, and the controller's reuse
of the replicas it read last never hides a change another process made."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from skyserve_lite.controller.snapshots import ServiceReads, VersionCache, read_snapshot
from skyserve_lite.providers.base import InstanceState
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import LbReport, ReplicaStatus, ServiceStatus
from skyserve_lite.state.store import Store

from .conftest import TASK, Harness


def settled(tmp_path: Path, services: int, replicas: int) -> Harness:
    harness = Harness(tmp_path / f"home-{services}x{replicas}")
    for index in range(services):
        harness.create(f"svc-{index}", replicas=replicas)
    harness.tick()
    harness.tick()
    assert {r.status for r in harness.store.list_replicas()} == {ReplicaStatus.READY}
    return harness


def test_a_steady_pass_writes_nothing(tmp_path: Path) -> None:
    harness = settled(tmp_path, 3, 20)
    harness.tick(10)  # past the heartbeat (one row every 5 s) and into a new minute's history samples
    with harness.store.counting() as counts:
        plan = harness.tick(1)
    assert plan.is_empty
    assert (counts.writes, counts.rows_written, counts.transactions) == (0, 0, 0)
    harness.store.close()


def steady_reads(tmp_path: Path, services: int, replicas: int) -> int:
    """The statements a steady pass sends over ``services`` settled services of ``replicas`` each."""
    harness = settled(tmp_path, services, replicas)
    harness.tick(10)
    with harness.store.counting() as counts:
        harness.tick(1)
    harness.store.close()
    return counts.reads


@pytest.mark.parametrize("services", [1, 4])
def test_statements_per_pass_do_not_grow_with_replicas(tmp_path: Path, services: int) -> None:
    few, many = steady_reads(tmp_path, services, 2), steady_reads(tmp_path, services, 200)
    assert few == many, f"{few} statements with 2 replicas a service, {many} with 200"


def test_statements_per_pass_do_not_grow_with_services(tmp_path: Path) -> None:
    few, many = steady_reads(tmp_path, 2, 2), steady_reads(tmp_path, 30, 2)
    assert few == many, f"{few} statements with 2 services, {many} with 30"


def test_the_first_pass_writes_its_launches_in_transactions_that_do_not_grow_with_replicas(
        tmp_path: Path) -> None:
    def launch_pass(replicas: int) -> tuple[int, int]:
        harness = Harness(tmp_path / f"home-{replicas}")
        harness.create("svc", replicas=replicas)
        with harness.store.counting() as counts:
            harness.tick()
        assert len(harness.replicas()) == replicas
        harness.store.close()
        return counts.transactions, counts.reads

    assert launch_pass(10) == launch_pass(300)  # a batch is a transaction, whatever its size


def test_an_update_of_every_service_is_written_in_transactions_that_do_not_grow_with_services(
        tmp_path: Path) -> None:
    def launch_transactions(services: int) -> int:
        harness = Harness(tmp_path / f"home-{services}-services")
        for index in range(services):
            harness.create(f"svc-{index}", replicas=3)
        harness.tick()  # the first pass starts the load balancers and writes statuses: counted apart
        for index in range(services):
            harness.update(TASK.format(replicas=5), name=f"svc-{index}")
        with harness.store.counting() as counts:
            plan = harness.tick()
        assert sum(batch.count for batch in plan.launches) == 2 * services
        assert all(len(harness.replicas(f"svc-{index}")) == 5 for index in range(services))
        harness.store.close()
        return counts.transactions

    # The intents of every batch in one transaction, every outcome in another, the statuses in a third.
    assert launch_transactions(2) == launch_transactions(12)


def test_replicas_read_again_once_another_process_changed_one(tmp_path: Path) -> None:
    harness = settled(tmp_path, 1, 3)
    first = harness.store.list_replicas()
    with harness.store.counting() as counts:
        again = harness.store.list_replicas()
    assert again == first and counts.reads == 1  # the generation only: nothing changed
    other = Store.open(harness.home)  # another process's connection
    changed = dataclasses.replace(first[0], status_reason="changed elsewhere")
    other.put_replicas([changed])
    assert harness.store.list_replicas()[0].status_reason == "changed elsewhere"
    other.delete_replicas([("svc-0", first[1].replica_id)])
    assert [r.replica_id for r in harness.store.list_replicas()] == [first[0].replica_id, first[2].replica_id]
    other.close()
    harness.store.close()


def test_services_and_autoscaler_states_read_again_once_another_process_changed_one(tmp_path: Path) -> None:
    harness = settled(tmp_path, 2, 1)
    services, states = harness.store.list_services(), harness.store.list_autoscaler_states()
    with harness.store.counting() as counts:
        again, states_again = harness.store.list_services(), harness.store.list_autoscaler_states()
    assert counts.reads == 2  # the generation, once for each: nothing changed
    assert all(a is b for a, b in zip(again, services, strict=True)) and states_again == states
    other = Store.open(harness.home)  # another process's connection, each kind of write
    other.set_service_status("svc-0", ServiceStatus.REPLICA_INIT, "changed elsewhere")
    changed = harness.store.list_services()
    assert changed[0].status_reason == "changed elsewhere" and changed[1] is services[1]
    state, observed = states["svc-1"]
    other.put_autoscaler_states([("svc-1", dataclasses.replace(state, target=5), observed)])
    assert harness.store.list_autoscaler_states()["svc-1"][0].target == 5
    other.mark_deleting(["svc-1"])
    assert harness.store.list_services()[1].deleting
    text = TASK.format(replicas=1)
    other.create_service("svc-2", SubmittedTask(text=text, source="/t.yaml", spec=parse_task(text)), 30099, 0.0)
    assert [s.name for s in harness.store.list_services()] == ["svc-0", "svc-1", "svc-2"]
    other.delete_service("svc-2")
    assert [s.name for s in harness.store.list_services()] == ["svc-0", "svc-1"]
    other.close()
    harness.store.close()


def test_a_pass_reads_every_service_as_reading_each_alone_would(tmp_path: Path) -> None:
    harness = settled(tmp_path, 3, 2)
    now = harness.clock.now()
    harness.store.record_request_counts("svc-1", {int(now) - 5: 7, int(now) - 90: 100})  # one outside the window
    harness.store.record_lb_report("svc-2", LbReport(reported_at=now - 1, in_flight=(("http://x", 3),), waiting=2))
    harness.store.request_replica_termination("svc-0", 1, now)
    reads = ServiceReads.read_all(harness.store, now, harness.settings)
    for service in harness.store.list_services():
        replicas = harness.store.list_replicas(service.name)
        together = read_snapshot(harness.store, service, replicas, now, harness.settings, lambda _pid: True,
                                 VersionCache(), reads)
        alone = read_snapshot(harness.store, service, replicas, now, harness.settings, lambda _pid: True,
                              VersionCache())
        assert together == alone
    assert reads.requests == {"svc-1": 7}
    assert reads.terminate_requested == {"svc-0": frozenset({1})}
    harness.store.close()


def test_a_service_whose_state_cannot_be_decoded_leaves_the_others_reconciled(tmp_path: Path) -> None:
    harness = settled(tmp_path, 2, 1)
    harness.store._db.execute("UPDATE autoscaler_state SET observed_json = '{\"unknown\": 1}' WHERE service = 'svc-1'")
    first = harness.provider.instance_for("svc-0", 1).instance_id
    harness.provider.set_state(first, InstanceState.EXITED, "exit 1")
    harness.tick()
    assert harness.store.list_replicas("svc-0")[0].status is ReplicaStatus.FAILED  # svc-0 still reconciled
    harness.store.close()


def test_reading_sees_one_committed_state(tmp_path: Path) -> None:
    harness = settled(tmp_path, 1, 1)
    other = Store.open(harness.home)
    with harness.store.reading():
        before = harness.store.get_service("svc-0").status_reason
        other.set_service_status("svc-0", harness.store.get_service("svc-0").status, "written meanwhile")
        assert harness.store.get_service("svc-0").status_reason == before  # the same snapshot
    assert harness.store.get_service("svc-0").status_reason == "written meanwhile"
    other.close()
    harness.store.close()
