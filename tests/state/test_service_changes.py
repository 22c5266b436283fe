"""The counter per service (``Store.list_service_generations``), on both engines: every kind of write to a row
a controller pass reads of a service moves that service's counter and no other's; writes to what a pass reads
afresh every pass (request counts, load reports) move none."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.plan.canary import CanaryState, Command
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import AutoscalerObservation, LbReport, ReplicaRecord, ReplicaStatus, ServiceStatus
from skyserve_lite.state.store import Store

TEXT = "service:\n  replicas: 1\nrun: echo hi\n"


def task() -> SubmittedTask:
    return SubmittedTask(text=TEXT, source="/tmp/svc.yaml", spec=parse_task(TEXT))


def replica(replica_id: int = 1) -> ReplicaRecord:
    return ReplicaRecord(service="a", replica_id=replica_id, version=1, status=ReplicaStatus.PROVISIONING,
                         cloud="local", launched_at=1.0, status_since=1.0, launch_token="tok")


def _nothing(store: Store) -> None:
    pass


def _a_replica(store: Store) -> None:
    store.put_replicas([replica()])


def _a_canary(store: Store) -> None:
    store.put_canary("a", CanaryState(version=1), 10, fenced=False)


Write = Callable[[Store], object]

WRITES: dict[str, tuple[Write, Write, bool]] = {
    # name: (what is there first, the write to service "a", whether a's counter moves)
    "status": (_nothing, lambda s: s.set_service_status("a", ServiceStatus.READY, None), True),
    "deleting": (_nothing, lambda s: s.mark_deleting(["a"]), True),
    "new version": (_nothing, lambda s: s.add_version("a", task(), "rolling", 2.0), True),
    "replica added": (_nothing, _a_replica, True),
    "replica changed": (_a_replica, lambda s: s.put_replicas([dataclasses.replace(replica(),
                                                                                 status=ReplicaStatus.READY)]), True),
    "replica deleted": (_a_replica, lambda s: s.delete_replicas([("a", 1)]), True),
    "autoscaler": (_nothing, lambda s: s.put_autoscaler_states([("a", AutoscalerState(version=1, target=2),
                                                                  AutoscalerObservation(policy="fixed",
                                                                                        raw_target=2))]), True),
    "termination request": (_nothing, lambda s: s.request_replica_termination("a", 1, 3.0), True),
    "canary rollout": (_nothing, _a_canary, True),
    "canary command": (_a_canary, lambda s: s.request_canary_command("a", Command.PAUSE), True),
    # Read afresh by every pass: no counter.
    "request counts": (_nothing, lambda s: s.record_request_counts("a", {100: 3}), False),
    "load report": (_nothing, lambda s: s.record_lb_report("a", LbReport(reported_at=1.0)), False),
}


@pytest.mark.parametrize("write", WRITES, ids=list(WRITES))
def test_a_write_moves_its_services_counter_only(tmp_path: Path, write: str) -> None:
    store = Store.open(tmp_path)
    store.create_service("a", task(), 30001, 1.0)
    store.create_service("b", task(), 30002, 1.0)
    prepare, make, moves = WRITES[write]
    prepare(store)
    before = store.list_service_generations()
    make(store)
    after = store.list_service_generations()
    assert (after["a"] > before["a"]) is moves
    assert after["b"] == before["b"]
    store.close()


def test_a_service_created_again_under_its_name_counts_on(tmp_path: Path) -> None:
    """What a controller kept of the deleted service can never match the new one's counter."""
    store = Store.open(tmp_path)
    store.create_service("a", task(), 30001, 1.0)
    first = store.list_service_generations()["a"]
    store.delete_service("a")
    deleted = store.list_service_generations()["a"]
    store.create_service("a", task(), 30001, 2.0)
    assert first < deleted < store.list_service_generations()["a"]
    store.close()
