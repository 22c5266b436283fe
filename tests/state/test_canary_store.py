"""The canary rollout as the store keeps it: a restarted controller reads the very step it stored, a
person's command survives until the controller acted on it, per-version counts add up across load
balancers, and the load balancer's view carries the split."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.errors import NotFoundError
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings, CanaryState, Command
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, StoredCanary
from skyserve_lite.state.store import Store

TEXT = "service:\n  replicas: 2\nrun: echo hi\n"
SETTINGS = CanarySettings(steps=(10, 50), bake_seconds=30, max_error_rate=0.05, min_requests=20, max_extensions=1)


def _store(tmp_path: Path) -> Store:
    store = Store.open(tmp_path)
    store.create_service("svc", SubmittedTask(text=TEXT, source="svc.yaml", spec=parse_task(TEXT)), 30001, now=1.0)
    return store


def test_a_reopened_store_gives_back_the_stored_step(tmp_path: Path) -> None:
    store = _store(tmp_path)
    state = CanaryState(version=2, settings=SETTINGS, step=1, window_start=1234.5, extensions=1, verdict="passed")
    store.put_canary("svc", state, 10)
    store.close()
    again = Store.open(tmp_path)
    assert again.list_canaries() == {"svc": StoredCanary(state, 10, None)}


def test_a_command_waits_until_the_controller_acted_on_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    state = CanaryState(version=2, settings=SETTINGS)
    store.put_canary("svc", state, 0, fenced=False)
    store.request_canary_command("svc", Command.PAUSE)
    # A pass that acted on nothing (or on another command) leaves the person's command in place.
    store.put_canary("svc", state, 0)
    store.put_canary("svc", state, 0, done_command=Command.ABORT)
    assert store.list_canaries("svc")["svc"].command is Command.PAUSE
    store.put_canary("svc", CanaryState(version=2, settings=SETTINGS, paused=True), 0, done_command=Command.PAUSE)
    stored = store.list_canaries("svc")["svc"]
    assert (stored.command, stored.state.paused) == (None, True)


def test_a_command_for_a_service_without_a_canary_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(NotFoundError, match="has no canary rollout"):
        store.request_canary_command("svc", Command.PROMOTE)


def test_version_counts_from_several_load_balancers_add_up(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.record_version_counts("svc", {(1, 100, "2xx"): 90, (2, 100, "5xx"): 3, (2, 100, "2xx"): 7})
    store.record_version_counts("svc", {(1, 100, "2xx"): 10, (2, 101, "5xx"): 2, (2, 99, "failed"): 1})
    assert store.count_versions_since("svc", 100) == {1: {"2xx": 100}, 2: {"2xx": 7, "5xx": 5}}
    assert store.count_versions_since("svc", 0)[2] == {"2xx": 7, "5xx": 5, "failed": 1}


def test_the_lb_view_carries_the_split_while_stepping(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rows = store.add_replicas("svc", 2, ReplicaRecord(service="", replica_id=0, version=1,
                                                     status=ReplicaStatus.READY, cloud="local", launched_at=1.0,
                                                     status_since=1.0, launch_token="t"))
    store.put_replicas([ReplicaRecord(**{**r.__dict__, "url": f"http://127.0.0.1:{9000 + r.replica_id}",
                                         "version": r.replica_id}) for r in rows])
    view = store.get_lb_view("svc")
    assert view is not None and view.split == ()
    store.put_canary("svc", CanaryState(version=2, settings=SETTINGS, window_start=5.0), 10)
    view = store.get_lb_view("svc")
    assert view is not None and view.split == ()  # version 2 is not the current version: nothing to split
    store.add_version("svc", SubmittedTask(text=TEXT, source="svc.yaml", spec=parse_task(TEXT)), "canary", 2.0)
    view = store.get_lb_view("svc")
    assert view is not None and (view.versions, view.split) == ((1, 2), ((2, 10),))
    store.put_canary("svc", CanaryState(version=2, settings=SETTINGS, phase=CanaryPhase.ROLLED_BACK), 0)
    view = store.get_lb_view("svc")
    assert view is not None and view.split == ()


def test_a_deleted_service_takes_its_canary_and_counts(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put_canary("svc", CanaryState(version=2, settings=SETTINGS), 0)
    store.record_version_counts("svc", {(2, 100, "2xx"): 1})
    store.delete_service("svc")
    assert store.list_canaries() == {}
    assert store.count_versions_since("svc", 0) == {}
