"""The state store: files and modes, migrations, versions kept verbatim, ids never reused."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.errors import (
    NotFoundError,
    StateBusyError,
    StateConflictError,
    StateDamagedError,
    StateUnwritableError,
    UsageError,
)
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceStatus
from skyserve_lite.state.schema import MIGRATIONS
from skyserve_lite.state.sqlite import split_statements
from skyserve_lite.state.store import HOME_MARKER, UNFENCED, Store, prepare_home

TEXT = "# my service\nservice:\n  replicas: 2   # two of them\nrun: echo hi\n"


def task(text: str = TEXT) -> SubmittedTask:
    return SubmittedTask(text=text, source="/tmp/svc.yaml", spec=parse_task(text))


def template(version: int = 1) -> ReplicaRecord:
    return ReplicaRecord(service="", replica_id=0, version=version, status=ReplicaStatus.PROVISIONING,
                         cloud="local", launched_at=1.0, status_since=1.0, launch_token="tok")


@pytest.mark.sqlite_only(reason="the database file's mode; on PostgreSQL there is no file")
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


@pytest.mark.parametrize(("script", "statements"), [
    ("CREATE TABLE a (x TEXT DEFAULT ';'); -- a; comment\nCREATE TABLE b (y);\n  \t\r\n",
     ["CREATE TABLE a (x TEXT DEFAULT ';');", " -- a; comment\nCREATE TABLE b (y);"]),
    ("CREATE TRIGGER t AFTER INSERT ON a BEGIN UPDATE a SET x = 1; DELETE FROM b; END;",
     ["CREATE TRIGGER t AFTER INSERT ON a BEGIN UPDATE a SET x = 1; DELETE FROM b; END;"]),
    ("SELECT 1; SELECT 2 -- no semicolon after the last", ["SELECT 1;", " SELECT 2 -- no semicolon after the last"]),
    ("SELECT 1;\n-- only a comment after", ["SELECT 1;"]),
])
def test_a_migration_script_is_split_into_whole_statements(script: str, statements: list[str]) -> None:
    assert list(split_statements(script)) == statements


def test_a_migration_script_ending_inside_a_statement_is_refused() -> None:
    with pytest.raises(ValueError, match="incomplete statement"):
        list(split_statements("SELECT 1; CREATE TRIGGER t AFTER INSERT ON a BEGIN UPDATE a SET x = 1;"))


TRIGGERS = {
    "sqlite": "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'",
    "postgresql": "SELECT DISTINCT trigger_name, event_object_table FROM information_schema.triggers",
}


EVENTS = ("inserted", "updated", "deleted")


def test_the_counters_have_their_triggers(tmp_path: Path, store_engine: str) -> None:
    """A migration that rebuilt a counted table would drop its triggers, and its counter would never move
    again: the controller would read those rows once and never again."""
    store = Store.open(tmp_path)
    triggers = {row[0]: row[1] for row in store._db.execute(TRIGGERS[store_engine])}
    counted = {f"{table}_{event}": table for table in ("services", "autoscaler_state") for event in EVENTS}
    per_service = {f"{table}_changed_{event}": table for table in ("services", "replicas", "versions",
                                                                    "autoscaler_state", "replica_terminations",
                                                                    "canary_rollouts")
                   for event in EVENTS}
    assert {name: table for name, table in triggers.items() if name in counted or "_changed_" in name} == {
        **counted, **per_service}
    store.close()


def test_a_rolled_back_write_leaves_no_read_of_its_rows_behind(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    assert store.list_services()[0].status_reason is None
    with pytest.raises(RuntimeError), store._write(UNFENCED) as tx:
        db = tx.db
        db.execute("UPDATE services SET status_reason = 'never committed'")
        assert store.list_services()[0].status_reason == "never committed"  # read inside, at counter G+1
        raise RuntimeError("rolled back")
    other = Store.open(tmp_path)  # another process's commit brings the counter to G+1 again
    other.set_service_status("svc", ServiceStatus.READY, "committed elsewhere")
    other.close()
    assert store.list_services()[0].status_reason == "committed elsewhere"
    store.close()


def test_the_services_counter_moves_with_each_write_and_only_then(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    generation = store._services_generation
    start = generation()
    store.create_service("svc", task(), 30001, now=5.0)
    created = generation()
    store.mark_deleting(["nope"])  # matches no row
    assert generation() == created
    store.set_service_status("svc", ServiceStatus.READY, None)
    assert start != created != generation()
    store.close()


def test_services_are_listed_in_the_order_of_their_names_bytes(tmp_path: Path) -> None:
    """As SQLite sorts text, whatever the locale of a PostgreSQL database (its columns are COLLATE "C")."""
    store = Store.open(tmp_path)
    for port, name in enumerate(["b", "B", "a-2", "a1", "_z"], start=30001):
        store.create_service(name, task(), port, now=5.0)
    assert [s.name for s in store.list_services()] == ["B", "_z", "a-2", "a1", "b"]
    store.close()


def test_times_keep_every_digit(tmp_path: Path) -> None:
    """Floats round-trip exactly (PostgreSQL's REAL would keep 6 digits: the schema says DOUBLE PRECISION)."""
    store = Store.open(tmp_path)
    now = 1764672000.123456
    store.create_service("svc", task(), 30001, now=now)
    assert store.get_service("svc").created_at == now
    store.close()


def test_current_versions_are_each_services_current_one(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    assert store.list_current_versions() == {}
    store.create_service("a", task(), 30001, now=5.0)
    store.create_service("b", task(), 30002, now=5.0)
    updated = "service:\n  replicas: 3\nrun: echo hi\n"
    store.add_version("b", task(updated), "rolling", now=6.0)
    current = store.list_current_versions()
    assert {name: (record.version, record.text) for name, record in current.items()} == {
        "a": (1, TEXT), "b": (2, updated)}
    assert current["b"] == store.get_version("b", 2)


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


def test_batches_of_several_services_are_recorded_in_one_transaction(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("a", task(), 30001, now=5.0)
    store.create_service("b", task(), 30002, now=5.0)
    with store.counting() as counts:
        added = store.add_replica_batches([("a", 2, template()), ("gone", 3, template()), ("b", 1, template()),
                                           ("a", 1, template(version=2))])
    assert counts.transactions == 1
    # None for a service that no longer exists; the same service twice takes its ids in order.
    assert [None if rows is None else [(r.service, r.replica_id, r.version) for r in rows] for rows in added] == [
        [("a", 1, 1), ("a", 2, 1)], None, [("b", 1, 1)], [("a", 3, 2)]]
    assert [r.replica_id for r in store.list_replicas("a")] == [1, 2, 3]
    assert [r.replica_id for r in store.add_replicas("a", 1, template())] == [4]  # the counters were stored
    assert [r.replica_id for r in store.add_replicas("b", 1, template())] == [2]
    with pytest.raises(NotFoundError, match="no service named 'gone'"):
        store.add_replicas("gone", 1, template())


def test_put_replicas_changes_a_row_in_place_and_adds_a_new_one(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=5.0)
    (row,) = store.add_replicas("svc", 1, template())
    ready = ReplicaRecord(**{**row.__dict__, "status": ReplicaStatus.READY, "url": "http://127.0.0.1:9"})
    other = ReplicaRecord(**{**row.__dict__, "replica_id": 7})
    store.put_replicas([ready, other])
    assert store.list_replicas("svc") == [ready, other]


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
                                             "url": "http://127.0.0.1:1", "accelerator": "L4:1"})])
    view = store.get_lb_view("svc")
    assert view is not None
    assert view.ready_urls == ("http://127.0.0.1:1",)
    assert view.accelerators == ("L4:1",)  # what each ready replica landed on, for instance-aware balancing
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


@pytest.mark.sqlite_only(reason="a file deleted or replaced under the store")
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


# --- the state directory: created private, an existing one left as it is --------------------------------
def test_a_created_home_is_marked_as_sky_lites(tmp_path: Path) -> None:
    home = tmp_path / "home"
    prepare_home(home)
    marker = home / HOME_MARKER
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o711, 0o700], ids=oct)
def test_an_existing_home_keeps_its_mode(tmp_path: Path, mode: int) -> None:
    home = tmp_path / "mine"
    home.mkdir()
    home.chmod(mode)
    Store.open(home).close()
    assert stat.S_IMODE(home.stat().st_mode) == mode
    assert not (home / HOME_MARKER).exists()  # only a directory sky-lite creates is marked


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o775, 0o770, 0o722], ids=oct)
def test_an_existing_home_others_can_write_is_refused_and_left_alone(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(UsageError) as caught:
        Store.open(shared)
    assert str(caught.value).startswith(f"refusing to use {shared} as the state directory: other users can "
                                        f"write to it (mode {mode:o})")
    assert f"chmod go-w {shared}" in str(caught.value)
    assert caught.value.exit_code == 2
    assert stat.S_IMODE(shared.stat().st_mode) == mode
    assert list(shared.iterdir()) == []


def test_a_home_sky_lite_created_stays_usable_when_made_group_writable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Store.open(home).close()
    home.chmod(0o770)
    Store.open(home).close()
    assert stat.S_IMODE(home.stat().st_mode) == 0o770


def test_a_marker_that_is_not_a_file_does_not_make_a_home_sky_lites(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / HOME_MARKER).mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(UsageError, match="other users can write to it"):
        prepare_home(shared)


def test_a_home_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        Store.open(tmp_path / "file")


# --- opening at the same time ----------------------------------------------------------------------------
@pytest.mark.sqlite_only(reason="a fresh SQLite file per home; PostgreSQL: test_postgresql_store")
def test_threads_opening_a_fresh_home_at_once_all_get_the_store(tmp_path: Path) -> None:
    # The race is rare per home (without the retry, 4 to 12 openers lost in 100 homes of 3 openers):
    # the next test makes the losing moment certain.
    errors: list[BaseException] = []
    for trial in range(60):
        home = tmp_path / f"home-{trial}"
        barrier = threading.Barrier(3)

        def open_it(home: Path = home, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                Store.open(home).close()
            except BaseException as exc:  # collected and reported below, with the others
                errors.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


@pytest.mark.sqlite_only(reason="SQLite's own locking of a fresh file")
def test_an_open_waits_for_a_writer_sqlite_answers_locked_at_once_for(tmp_path: Path) -> None:
    # What the loser of two fresh opens meets: the winner writes the not-yet-WAL file (a RESERVED lock),
    # and SQLite answers `PRAGMA journal_mode=WAL` with "database is locked" at once, without waiting.
    writer = sqlite3.connect(tmp_path / "state.db", isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE scratch (x)")
    release = threading.Timer(0.3, lambda: writer.execute("ROLLBACK"))
    release.start()
    try:
        store = Store.open(tmp_path)
    finally:
        release.join()
        writer.close()
    assert store.schema_version == len(MIGRATIONS)
    store.close()


def _open_and_create(home: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        store = Store.open(Path(home))
        try:
            store.create_service("svc", task(), 30001, now=1.0)
        finally:
            store.close()
        results.put("created")
    except StateConflictError as exc:
        results.put(f"conflict: {exc}")
    except BaseException as exc:  # reported to the test, not lost in the child
        results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.sqlite_only(reason="a fresh SQLite file per trial; PostgreSQL: test_postgresql_store")
def test_processes_creating_on_a_fresh_home_at_once_get_one_winner_and_clean_conflicts(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    for trial in range(5):
        home = tmp_path / f"home-{trial}"
        barrier, results = context.Barrier(6), context.Queue()
        processes = [context.Process(target=_open_and_create, args=(str(home), barrier, results))
                     for _ in range(6)]
        for process in processes:
            process.start()
        outcomes = sorted(results.get(timeout=30) for _ in processes)
        for process in processes:
            process.join(timeout=30)
        assert outcomes[0] == "conflict: service 'svc' already exists; change it with " \
                              "`sky-lite serve update svc TASK.yaml`", outcomes
        assert outcomes.count("created") == 1 and len(set(outcomes)) == 2, outcomes


# --- a damaged database ----------------------------------------------------------------------------------
def _real_database(tmp_path: Path) -> bytes:
    store = Store.open(tmp_path / "real")
    for number in range(20):
        store.create_service(f"svc-{number}", task(TEXT + "#" * 3000 + "\n"), 30001 + number, now=1.0)
    store.close()  # the last connection to close checkpoints the WAL into the file
    return (tmp_path / "real" / "state.db").read_bytes()


@pytest.mark.sqlite_only(reason="a damaged SQLite file")
@pytest.mark.parametrize("damage", ["garbage", "zeros", "text", "truncated-half", "truncated-header"])
def test_a_damaged_database_is_one_clear_error_at_open(tmp_path: Path, damage: str) -> None:
    real = _real_database(tmp_path)
    content = {"garbage": bytes(range(256)) * 40, "zeros": bytes(4096), "text": b"not a database\n",
               "truncated-half": real[:len(real) // 2], "truncated-header": real[:60]}[damage]
    home = tmp_path / "home"
    prepare_home(home)
    (home / "state.db").write_bytes(content)
    started = time.monotonic()
    with pytest.raises(StateDamagedError) as caught:
        Store.open(home)
    assert time.monotonic() - started < 3
    message = str(caught.value)
    assert message.startswith(f"the state database {home / 'state.db'} is damaged")
    assert "sky-lite serve down --all --force" in message and "move state.db" in message
    assert caught.value.exit_code == 1
    assert (home / "state.db").read_bytes() == content  # left for the operator to look at


@pytest.mark.sqlite_only(reason="a damaged SQLite file")
def test_damage_a_later_query_finds_is_the_same_clear_error(tmp_path: Path) -> None:
    real = bytearray(_real_database(tmp_path))
    page = 4096
    # Damage only the versions table's own pages (found with SQLite's page map), so opening still works and
    # the query that reads a version finds the damage, however the schema's pages lie.
    with sqlite3.connect(tmp_path / "real" / "state.db") as db:
        pages = [int(row[0]) for row in db.execute(
            "SELECT pageno FROM dbstat WHERE name = 'versions' AND pagetype != 'internal'")]
    db.close()
    assert pages
    for number in pages:
        offset = (number - 1) * page
        real[offset + 8:offset + page] = b"\xff" * (page - 8)
    (tmp_path / "home").mkdir(mode=0o700)
    (tmp_path / "home" / "state.db").write_bytes(bytes(real))
    store = Store.open(tmp_path / "home")
    with pytest.raises(StateDamagedError, match="is damaged"):
        for service in store.list_services():
            store.get_version(service.name, 1)
    store.close()


@pytest.mark.sqlite_only(reason="a damaged SQLite file")
def test_a_database_emptied_under_a_process_that_holds_it_is_damaged_not_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The open waits out its whole bound here (a fresh file being created looks the same for a moment).
    monkeypatch.setattr("skyserve_lite.state.sqlite._OPEN_WAIT_SECONDS", 1.0)
    holder = Store.open(tmp_path)
    holder.create_service("svc", task(), 30001, now=1.0)  # WAL frames and shared memory held by `holder`
    os.truncate(tmp_path / "state.db", 0)
    started = time.monotonic()
    with pytest.raises(StateDamagedError, match="empty or truncated, and another process still has it open"):
        Store.open(tmp_path)
    assert time.monotonic() - started < 3
    holder.close()


@pytest.mark.sqlite_only(reason="SQLite's file lock; PostgreSQL: test_postgresql_store")
def test_a_locked_healthy_database_is_waited_for_then_a_clear_busy_error(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("skyserve_lite.state.sqlite._OPEN_WAIT_SECONDS", 0.5)
    Store.open(tmp_path).close()
    blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # holds the write lock every open takes for its migration check
    with pytest.raises(StateBusyError, match="stayed locked by another process"):
        Store.open(tmp_path)
    blocker.execute("ROLLBACK")
    blocker.close()
    Store.open(tmp_path).close()


@pytest.mark.sqlite_only(reason="the home's copy of the id; PostgreSQL keeps it in meta only")
def test_the_controller_id_is_kept_outside_the_database_too(tmp_path: Path) -> None:
    """`serve down --all --force` finds the cloud instances by it when state.db is damaged."""
    store = Store.open(tmp_path)
    assert (tmp_path / "controller-id").read_text().strip() == store.controller_id
    assert (tmp_path / "controller-id").stat().st_mode & 0o777 == 0o600
    store.close()


@pytest.mark.sqlite_only(reason="SQLite's page limit stands for a full disk")
def test_a_full_disk_is_one_clear_error_and_nothing_is_half_written(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_service("a", SubmittedTask("service: {replicas: 1}\nrun: x\n", "/t.yaml",
                                            parse_task("service: {replicas: 1}\nrun: x\n")), 30001, 0.0)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from now on
    big = "x" * 200_000
    with pytest.raises(StateUnwritableError, match=r"cannot write the state database .*database or disk is full"):
        store.add_events([(0.0, "a", None, "service", big)])
    assert [e.message for e in store.list_events("a") if e.message == big] == []
    store.close()
