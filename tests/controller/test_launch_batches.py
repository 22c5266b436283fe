"""The executor's launches: every batch's intents in one transaction, each batch launched, every outcome in
one transaction; a service deleted between the pass's read and its launches costs only its own batches."""

from __future__ import annotations

from skyserve_lite.controller.executor import Executor
from skyserve_lite.controller.pass_types import LaunchBatch, PassPlan

from .conftest import Harness


def _executor(harness: Harness) -> Executor:
    return Executor(harness.store, {"local": harness.provider}, harness.lbs, harness.clock)


def _batch(harness: Harness, service: str, count: int, retry: bool = False) -> LaunchBatch:
    spec = harness.store.get_version(service, 1).spec
    rows = tuple(harness.replicas(service)[:1]) if retry else ()
    return LaunchBatch(service=service, version=1, cloud="local", is_spot=False, count=count, retry=rows,
                       specs={1: spec})


def test_a_batch_of_a_service_deleted_meanwhile_is_not_launched_and_the_others_are_stored(harness: Harness) -> None:
    harness.create("svc", replicas=1)
    harness.create("gone", replicas=1)
    harness.tick()
    gone = _batch(harness, "gone", count=1, retry=True)
    kept = _batch(harness, "svc", count=1)
    harness.store.delete_service("gone")
    launched_before = len(harness.provider.instances)
    _executor(harness).apply(PassPlan(launches=(gone, kept)))
    rows = harness.replicas("svc")
    assert len(rows) == 2 and all(r.instance_id is not None for r in rows)  # svc's new replica, confirmed
    assert harness.replicas("gone") == []
    assert len(harness.provider.instances) == launched_before + 1  # nothing launched for the deleted service


def test_a_retry_of_a_service_deleted_meanwhile_is_left_to_the_orphan_rule(harness: Harness) -> None:
    harness.create("svc", replicas=1)
    harness.create("gone", replicas=1)
    harness.tick()
    retry = _batch(harness, "gone", count=0, retry=True)  # nothing new: its service is not read again
    kept = _batch(harness, "svc", count=1)
    harness.store.delete_service("gone")
    _executor(harness).apply(PassPlan(launches=(retry, kept)))
    assert len(harness.replicas("svc")) == 2 and harness.replicas("gone") == []
    plan = harness.tick()  # the instance re-sent for the deleted service's row is claimed by no row
    assert any(e.kind == "orphan" and e.service == "gone" for e in plan.events)
