"""The state store: files and modes, migrations, versions kept verbatim, ids never reused."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from skyserve_lite.errors import NotFoundError, StateConflictError
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceStatus
from skyserve_lite.state.schema import MIGRATIONS
from skyserve_lite.state.store import Store

TEXT = "# my service\nservice:\n  replicas: 2   # two of them\nrun: echo hi\n"


def task(text: str = TEXT) -> SubmittedTask:
    return SubmittedTask(text=text, source="/tmp/svc.yaml", spec=parse_task(text))


def template(version: int = 1) -> ReplicaRecord:
    return ReplicaRecord(service="", replica_id=0, version=version, status=ReplicaStatus.PROVISIONING,
                         cloud="local", launched_at=1.0, status_since=1.0, launch_token="tok")


def test_home_is_private_and_database_is_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "new" / "home"
    Store.open(home).close()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "state.db").stat().st_mode) == 0o600


def test_migrations_run_once_and_reopening_keeps_data(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    assert store.schema_version == len(MIGRATIONS)
    store.create_service("svc", task(), 30001, now=5.0)
    controller_id = store.controller_id
    store.close()
    again = Store.open(tmp_path)
    assert again.schema_version == len(MIGRATIONS)
    assert again.controller_id == controller_id
    assert again.get_service("svc").lb_port == 30001


def test_version_text_is_stored_exactly_as_submitted(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    version = store.get_version("svc", 1)
    assert version.text == TEXT
    assert version.spec == parse_task(TEXT)
    assert store.get_service("svc").status is ServiceStatus.CONTROLLER_INIT


def test_existing_name_is_a_conflict_and_changes_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    with pytest.raises(StateConflictError, match="sky-lite serve update svc"):
        store.create_service("svc", task("service: {replicas: 5}\nrun: x\n"), 30002, now=6.0)
    assert [v.version for v in store.list_versions("svc")] == [1]
    assert store.get_version("svc", 1).text == TEXT


def test_unknown_service_and_version_are_not_found(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    with pytest.raises(NotFoundError, match="no service named 'nope'"):
        store.get_service("nope")
    store.create_service("svc", task(), 30001, now=5.0)
    with pytest.raises(NotFoundError, match="no version 9"):
        store.get_version("svc", 9)


def test_replica_ids_are_never_reused(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    first = store.add_replicas("svc", 2, template())
    store.delete_replicas([("svc", 1), ("svc", 2)])
    second = store.add_replicas("svc", 1, template())
    assert [r.replica_id for r in first + second] == [1, 2, 3]


def test_replica_rows_round_trip_as_typed_values(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    (row,) = store.add_replicas("svc", 1, template())
    assert store.list_replicas("svc") == [row]
    assert isinstance(store.list_replicas("svc")[0].status, ReplicaStatus)


def test_lb_view_lists_ready_urls_and_hides_a_deleting_service(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    rows = store.add_replicas("svc", 2, template())
    store.put_replicas([rows[0].__class__(**{**rows[0].__dict__, "status": ReplicaStatus.READY,
                                             "url": "http://127.0.0.1:1"})])
    view = store.get_lb_view("svc")
    assert view is not None
    assert view.ready_urls == ("http://127.0.0.1:1",)
    assert view.policy == "least_load"
    store.mark_deleting(["svc"])
    assert store.get_lb_view("svc") is None
    assert store.get_lb_view("unknown") is None


def test_request_counts_add_up_and_old_seconds_are_dropped(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.record_request_counts("svc", {100: 3, 101: 4})
    store.record_request_counts("svc", {101: 1})
    assert store.count_requests("svc", since_second=100) == 8
    assert store.count_requests("svc", since_second=101) == 5
    store.record_request_counts("svc", {5000: 1}, keep_seconds=60)
    assert store.count_requests("svc", since_second=0) == 1


def test_deleting_a_service_drops_versions_and_replicas(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    store.add_replicas("svc", 1, template())
    store.delete_service("svc")
    assert store.find_service("svc") is None
    assert store.list_replicas("svc") == []
    assert store.list_versions("svc") == []
    # The name is free again, and its ids start over with the new service.
    store.create_service("svc", task(), 30001, now=6.0)
    assert store.add_replicas("svc", 1, template())[0].replica_id == 1


def test_a_store_notices_its_file_deleted_or_replaced(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    assert store.is_current()
    (tmp_path / "state.db").unlink()
    assert not store.is_current()
    Store.open(tmp_path).close()  # someone creates a new, empty store at the same path
    assert not store.is_current()


def test_open_without_create_refuses_a_missing_store(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no state store"):
        Store.open(tmp_path / "gone", create=False)
    assert not (tmp_path / "gone").exists()
