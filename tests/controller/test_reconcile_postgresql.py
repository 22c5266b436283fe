"""Whole controller passes with the state in PostgreSQL (fake provider, prober and load balancers): a small
fleet launched, made ready, updated and taken down, the same as on SQLite; what another process writes is
seen; a steady pass writes nothing. The store's own tests cover both engines statement by statement
(tests/state); this is the controller on top of the PostgreSQL one."""

from __future__ import annotations

import pytest

from skyserve_lite.providers.base import InstanceState
from skyserve_lite.providers.fake import Call
from skyserve_lite.state.models import ReplicaStatus, ServiceStatus
from skyserve_lite.state.store import Store

from .conftest import TASK, Harness


@pytest.fixture
def harness(postgres_harness: Harness) -> Harness:
    """Every test of this module on PostgreSQL."""
    return postgres_harness


def test_a_small_fleet_is_launched_made_ready_updated_and_taken_down(harness: Harness) -> None:
    harness.create("web", replicas=2)
    harness.create("api", replicas=1)
    harness.tick()
    assert {(c.method, c.args) for c in harness.provider.calls_to("launch")} == {
        ("launch", (("web", 1, 1), ("web", 2, 1))), ("launch", (("api", 1, 1),))}
    assert sorted(harness.lbs.started) == [("api", 30002), ("web", 30001)]
    harness.tick()
    assert harness.statuses("web") == {1: "READY", 2: "READY"} and harness.statuses("api") == {1: "READY"}
    assert harness.service("web").status is ServiceStatus.READY

    # A replica that exits is replaced under a new id.
    first = harness.provider.instance_for("web", 1)
    harness.provider.set_state(first.instance_id, InstanceState.EXITED, "run exited with code 1")
    harness.tick()
    assert harness.statuses("web") == {1: "FAILED", 2: "READY", 3: "PROVISIONING"}

    # A rolling update replaces every replica of web and keeps api as it is.
    harness.update(TASK.format(replicas=2).replace("http.server", "http.server --bind 127.0.0.1"), name="web")
    for _ in range(8):
        harness.tick(2)
    live = [r for r in harness.replicas("web") if not r.status.is_terminal]
    assert all(r.version == 2 and r.status is ReplicaStatus.READY for r in live) and len(live) == 2
    assert harness.service("web").active_versions == (2,)
    assert harness.statuses("api") == {1: "READY"}

    # `serve down` from another process: the controller sees it and takes the service down.
    api_instance = harness.provider.instance_for("api", 1).instance_id
    cli = Store.open(harness.home)
    cli.mark_deleting(["api"])
    cli.close()
    for _ in range(4):
        harness.tick(5)
    assert harness.store.find_service("api") is None
    assert Call("terminate", (api_instance,)) in harness.provider.calls_to("terminate")
    assert [s.name for s in harness.store.list_services()] == ["web"]


def test_a_steady_pass_writes_nothing_and_another_processs_change_is_read(harness: Harness) -> None:
    harness.create("web", replicas=3)
    harness.tick()
    harness.tick()
    harness.tick(10)  # past the heartbeat and into a new minute's samples
    with harness.store.counting() as counts:
        plan = harness.tick(1)
    assert plan.is_empty
    assert (counts.writes, counts.rows_written, counts.transactions) == (0, 0, 0)

    other = Store.open(harness.home)  # another process writes one replica row
    [row] = [r for r in other.list_replicas("web") if r.replica_id == 2]
    other.put_replicas([row.__class__(**{**row.__dict__, "status": ReplicaStatus.NOT_READY})])
    other.close()
    assert {r.replica_id: r.status for r in harness.store.list_replicas("web")}[2] is ReplicaStatus.NOT_READY
    harness.tick()  # its probe passes: READY again, written by this controller
    assert harness.statuses("web") == {1: "READY", 2: "READY", 3: "READY"}
