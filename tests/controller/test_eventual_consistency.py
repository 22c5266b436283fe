"""A cloud's inventory lags its launches (EC2 documents it): an instance RunInstances returned but
DescribeInstances does not list yet is not gone. Provider-independent rules, on the fake provider:
launches are neither failed nor forgotten within the visibility grace, and `serve down` keeps every
launch it recorded until the cloud has shown its instance gone."""

from __future__ import annotations

import dataclasses

from skyserve_lite.providers.base import Instance, InstanceState
from skyserve_lite.providers.fake import Call
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceStatus

from .conftest import Harness


def test_launches_the_inventory_does_not_list_yet_are_not_failed(harness: Harness) -> None:
    harness.provider.lagging = True
    harness.provider.found_by_id = False  # lookups by id lag as well
    harness.create(replicas=3)
    for _ in range(30):  # 30 s of passes without the instances being listed
        harness.tick()
    assert harness.statuses() == {1: "PROVISIONING", 2: "PROVISIONING", 3: "PROVISIONING"}
    assert harness.service().status is not ServiceStatus.FAILED
    assert len(harness.provider.calls_to("launch")) == 1  # nothing relaunched
    assert harness.provider.calls_to("terminate") == []
    assert all(r.status_reason == "launched; the cloud's inventory does not list the instance yet"
               for r in harness.replicas())
    harness.provider.catch_up()
    harness.tick()
    assert set(harness.statuses().values()) == {"READY"}


def test_an_unlisted_instance_found_by_id_is_used_at_once(harness: Harness) -> None:
    harness.provider.lagging = True  # the listing lags; a lookup by id sees the instances
    harness.create(replicas=2)
    harness.tick()
    harness.tick()
    assert set(harness.statuses().values()) == {"READY"}
    lookups = harness.provider.calls_to("find_instances")
    assert lookups and set(lookups[-1].args) == {r.instance_id for r in harness.replicas()}
    harness.provider.catch_up()
    before = len(harness.provider.calls_to("find_instances"))
    harness.tick()
    assert len(harness.provider.calls_to("find_instances")) == before  # nothing missing: no lookup


def test_a_launch_never_listed_fails_only_after_the_grace(harness: Harness) -> None:
    harness.provider.lagging = True
    harness.provider.found_by_id = False
    harness.create(replicas=1)
    harness.tick()
    harness.tick(harness.settings.instance_visibility_grace_seconds + 1)
    row = harness.replicas()[0]
    assert (row.replica_id, row.status, row.status_reason) == (1, ReplicaStatus.FAILED, "the instance disappeared")


def test_down_while_the_inventory_lags_keeps_the_launch_until_its_instance_is_terminated(harness: Harness) -> None:
    harness.create(replicas=1)
    now = harness.clock.now()
    # The executor recorded its intent, the cloud started the instance, the controller crashed before
    # recording the id; the inventory does not list it yet.
    harness.store.add_replicas("svc", 1, ReplicaRecord(
        service="svc", replica_id=0, version=1, status=ReplicaStatus.PROVISIONING, cloud="local",
        launched_at=now, status_since=now, launch_token="tok-1"))
    harness.provider.add_instance(Instance(instance_id="i-late", service="svc", replica_id=1, version=1,
                                           state=InstanceState.RUNNING, url="http://u"))
    harness.provider.unlisted.add("i-late")
    harness.store.mark_deleting(["svc"])
    for _ in range(10):
        harness.tick()
    assert harness.store.find_service("svc") is not None  # the launch it recorded is not forgotten
    assert [r.status for r in harness.replicas()] == [ReplicaStatus.SHUTTING_DOWN]
    harness.provider.catch_up()
    harness.tick()
    assert harness.replicas()[0].instance_id == "i-late"  # adopted as soon as it is listed
    harness.tick(harness.settings.drain_seconds)
    assert Call("terminate", ("i-late",)) in harness.provider.calls
    assert harness.provider.instances["i-late"].state is InstanceState.TERMINATED
    harness.tick()
    assert harness.store.find_service("svc") is None


def test_the_failure_limit_trips_even_when_fewer_terminal_rows_are_kept(harness: Harness) -> None:
    harness.settings = dataclasses.replace(harness.settings, keep_terminal_replicas=2, failure_limit=5)
    harness.reconciler._settings = harness.settings
    harness.create(replicas=1)
    for _ in range(20):
        harness.tick()
        for row in harness.replicas():
            if row.status.is_live and row.instance_id:
                harness.provider.set_state(row.instance_id, InstanceState.EXITED, "run exited with code 1")
    assert len(harness.provider.calls_to("launch")) == 5  # not 20: launching stopped at the limit
    assert harness.service().status is ServiceStatus.FAILED
