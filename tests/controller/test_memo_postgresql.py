"""Two controllers on one PostgreSQL database: what one of them (or any process) writes for a service is
seen by the other's next pass. The other's memo of the service was made at the service's change counter,
which the database's triggers moved: the pass reads the service again and acts on what it finds, while a
service nobody wrote stays settled."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import AutoscalerObservation, ReplicaStatus, ServiceStatus, replace_replica
from skyserve_lite.state.store import Store

from .conftest import TASK, Harness


@pytest.fixture
def harness(postgres_harness: Harness) -> Harness:
    """Every test of this module on PostgreSQL."""
    return postgres_harness


@pytest.fixture
def other(harness: Harness, tmp_path: Path) -> Iterator[Store]:
    """The second controller's store: its own home and connection, the same database."""
    store = Store.open(tmp_path / "other-home")
    assert store.engine == "postgresql" and store.location == harness.store.location
    yield store
    store.close()


def _replica_failed(store: Store) -> None:
    """The other controller (say, after a takeover) marked a replica FAILED."""
    (first, *_) = store.list_replicas("svc")
    store.put_replicas([replace_replica(first, status=ReplicaStatus.FAILED, status_reason="failed elsewhere")])


def _service_row(store: Store) -> None:
    store.set_service_status("svc", ServiceStatus.REPLICA_INIT, "written elsewhere")


def _new_version(store: Store) -> None:
    text = TASK.format(replicas=3)
    store.add_version("svc", SubmittedTask(text=text, source="/tasks/svc.yaml", spec=parse_task(text)), "rolling", 1.0)


def _autoscaler_row(store: Store) -> None:
    store.put_autoscaler_states([("svc", AutoscalerState(version=1, target=1),
                                  AutoscalerObservation(policy="fixed", raw_target=1))])


def _termination_requested(store: Store) -> None:
    store.request_replica_termination("svc", 2, 1.0)


WRITES: dict[str, tuple[Callable[[Store], None], Callable[[ServiceSnapshot], bool]]] = {
    # What the other store wrote, and how the next snapshot of svc shows it.
    "replica row": (_replica_failed, lambda s: s.replicas[0].status_reason == "failed elsewhere"),
    "service row": (_service_row, lambda s: s.service.status_reason == "written elsewhere"),
    "new version": (_new_version, lambda s: s.service.current_version == 2),
    "autoscaler row": (_autoscaler_row, lambda s: s.autoscaler is not None and s.autoscaler.target == 1),
    "termination request": (_termination_requested, lambda s: s.terminate_requested == frozenset({2})),
}


@pytest.mark.parametrize("write", WRITES, ids=list(WRITES))
def test_a_write_through_another_controllers_store_is_seen_by_the_next_pass(
        harness: Harness, other: Store, carried: list[str], read: list[ServiceSnapshot], write: str) -> None:
    for name in ("svc", "quiet"):
        harness.create(name, replicas=2)
    for _ in range(4):
        harness.tick()
    assert harness.statuses("svc") == {1: "READY", 2: "READY"}
    carried.clear()
    harness.tick()
    assert carried == ["quiet", "svc"]  # both settled: neither is planned whole
    before = harness.store.list_service_generations()
    make, shown = WRITES[write]
    make(other)
    after = harness.store.list_service_generations()
    assert after["svc"] > before["svc"] and after["quiet"] == before["quiet"]
    carried.clear()
    read.clear()
    harness.tick()
    assert carried == ["quiet"]  # svc's memo was made at the old counter: planned whole again
    (snapshot,) = [s for s in read if s.service.name == "svc"]
    assert shown(snapshot)
