"""`serve down NAME --replica-id N` as the controller carries it out: the replica drains and is terminated,
the launch step of the same pass replaces it when the policy still wants it, and the request is forgotten
only once its replica is no longer live."""

from __future__ import annotations

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.errors import NotFoundError, StateConflictError
from skyserve_lite.providers.base import InstanceState
from skyserve_lite.providers.fake import Call

from .conftest import Harness


def ready(harness: Harness, replicas: int) -> None:
    harness.create(replicas=replicas)
    harness.tick()
    harness.tick()
    assert set(harness.statuses().values()) == {"READY"}


def test_a_requested_replica_drains_is_replaced_in_the_same_pass_then_terminated(harness: Harness) -> None:
    ready(harness, 2)
    harness.store.request_replica_termination("svc", 1, harness.clock.now())
    plan = harness.tick()
    assert harness.statuses() == {1: "SHUTTING_DOWN", 2: "READY", 3: "PROVISIONING"}
    assert harness.replicas()[0].status_reason == "terminated by the operator (serve down --replica-id)"
    assert harness.provider.calls_to("launch")[-1] == Call("launch", (("svc", 3, 1),))
    assert plan.requests_done == (("svc", 1),)
    assert harness.store.list_replica_terminations() == {}
    # Out of traffic at once; terminated once drained (5 s), like any scale-down.
    view = harness.store.get_lb_view("svc")
    assert view is not None and harness.replicas()[0].url not in view.ready_urls
    first = harness.provider.instance_for("svc", 1).instance_id
    harness.tick(5)
    assert Call("terminate", (first,)) in harness.provider.calls_to("terminate")
    harness.tick()
    assert harness.statuses() == {2: "READY", 3: "READY"}


def test_a_request_waits_while_the_replicas_inventory_is_unknown(harness: Harness) -> None:
    ready(harness, 1)
    harness.store.request_replica_termination("svc", 1, harness.clock.now())
    harness.provider.fail_inventory()
    plan = harness.tick()
    assert harness.statuses() == {1: "READY"}
    assert plan.requests_done == ()
    assert list(harness.store.list_replica_terminations()) == [("svc", 1)]
    harness.tick()
    assert harness.statuses()[1] == "SHUTTING_DOWN"
    assert harness.store.list_replica_terminations() == {}


def test_a_request_for_a_replica_that_failed_meanwhile_is_just_forgotten(harness: Harness) -> None:
    ready(harness, 1)
    harness.store.request_replica_termination("svc", 1, harness.clock.now())
    harness.provider.set_state(harness.provider.instance_for("svc", 1).instance_id, InstanceState.EXITED, "exit 1")
    plan = harness.tick()
    assert harness.statuses()[1] == "FAILED"
    assert plan.requests_done == (("svc", 1),)
    assert harness.store.list_replica_terminations() == {}


def test_a_steady_pass_after_the_request_is_done_writes_nothing(harness: Harness) -> None:
    ready(harness, 1)
    harness.store.request_replica_termination("svc", 1, harness.clock.now())
    harness.tick()
    harness.tick(5)
    harness.tick()
    harness.tick()
    assert harness.tick().is_empty


def test_the_request_is_checked_before_anything_is_stored(harness: Harness) -> None:
    ready(harness, 2)
    controller = LocalController(harness.home, start_daemon=False)
    with pytest.raises(NotFoundError, match=r"service 'svc' has no replica 7 \(its replicas: 1, 2\)"):
        controller.request_replica_termination("svc", [1, 7])
    with pytest.raises(NotFoundError, match="no service named 'nope'"):
        controller.request_replica_termination("nope", [1])
    assert harness.store.list_replica_terminations() == {}
    harness.provider.set_state(harness.provider.instance_for("svc", 2).instance_id, InstanceState.EXITED, "exit 1")
    harness.tick()
    with pytest.raises(StateConflictError, match="replica 2 of 'svc' is FAILED already: nothing to terminate"):
        controller.request_replica_termination("svc", [2])
    controller.request_replica_termination("svc", [1])
    controller.request_replica_termination("svc", [1])  # idempotent
    assert list(harness.store.list_replica_terminations()) == [("svc", 1)]
    harness.store.mark_deleting(["svc"])
    with pytest.raises(StateConflictError, match="shutting down already"):
        controller.request_replica_termination("svc", [1])
