"""What only the PostgreSQL engine has: a migration under an advisory lock whatever the number of openers,
writers one at a time, logins with a password shown nowhere, an unreachable server, a lost connection, a
store opened read-only. The store's other tests run on PostgreSQL too (tests/state/conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.errors import (
    NotFoundError,
    StateBusyError,
    StateConflictError,
    StateUnavailableError,
    StateUnwritableError,
)
from skyserve_lite.state import pg
from skyserve_lite.state.dialect import LOCK_CLASS, MIGRATION_LOCK, WRITE_LOCK
from skyserve_lite.state.models import ServiceStatus
from skyserve_lite.state.schema import MIGRATIONS
from skyserve_lite.state.store import UNFENCED, Store
from skyserve_lite.userconfig import set_config, show_config
from tests.postgres import PASSWORD, PASSWORD_USER, PostgresServer
from tests.state.test_store import task

pytestmark = pytest.mark.postgresql_only


def database() -> str:
    """This test's database (``store_engine`` made it and named it in ``SKY_LITE_DB_URL``)."""
    return os.environ["SKY_LITE_DB_URL"].rsplit("/", 1)[1]


@pytest.fixture
def password_database(postgres_server: PostgresServer) -> Iterator[str]:
    """A database ``PASSWORD_USER`` owns (it logs in with ``PASSWORD`` only)."""
    name = postgres_server.create_database(owner=PASSWORD_USER)
    yield name
    postgres_server.drop_database(name)


# --- opening at the same time ----------------------------------------------------------------------------
def _open_counting_migrations(home: str, url: str, barrier: Any, results: Any) -> None:
    os.environ["SKY_LITE_DB_URL"] = url
    ran: list[str] = []
    run_script = pg.PgConnection.run_script

    def counted(self: pg.PgConnection, script: str) -> None:
        ran.append(script)
        run_script(self, script)

    pg.PgConnection.run_script = counted  # type: ignore[method-assign]  # this child process only
    barrier.wait()
    try:
        store = Store.open(Path(home))
        results.put((len(ran), store.controller_id, store.schema_version))
        store.close()
    except BaseException as exc:  # reported to the test, not lost in the child
        results.put((f"{type(exc).__name__}: {exc}", "", 0))


def test_four_processes_opening_a_fresh_database_at_once_migrate_it_once(
        tmp_path: Path, postgres_server: PostgresServer) -> None:
    context = multiprocessing.get_context("fork")
    for trial in range(3):
        name = postgres_server.create_database()
        barrier, results = context.Barrier(4), context.Queue()
        processes = [context.Process(target=_open_counting_migrations,
                                     args=(str(tmp_path / f"home-{trial}-{n}"), postgres_server.url(name),
                                           barrier, results)) for n in range(4)]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=60) for _ in processes]
        for process in processes:
            process.join(timeout=30)
        postgres_server.drop_database(name)
        assert sorted(ran for ran, _, _ in outcomes) == [0, 0, 0, len(MIGRATIONS)], outcomes
        assert len({controller_id for _, controller_id, _ in outcomes}) == 1, outcomes
        assert {version for _, _, version in outcomes} == {len(MIGRATIONS)}


def test_a_migration_waits_for_the_migration_lock_and_migrates_nothing_without_it(
        tmp_path: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # What makes one migrator of many, whatever else serializes the writers: the session advisory lock.
    monkeypatch.setattr(pg, "LOCK_TIMEOUT_MS", 300)
    with postgres_server.admin(database()) as other:
        other.execute(f"SELECT pg_advisory_lock({LOCK_CLASS}, {MIGRATION_LOCK})")  # another opener migrating
        with pytest.raises(StateBusyError, match="stayed locked by another process"):
            Store.open(tmp_path)
        assert other.execute("SELECT to_regclass('schema_version')").fetchone() == (None,)  # nothing ran
        other.execute(f"SELECT pg_advisory_unlock({LOCK_CLASS}, {MIGRATION_LOCK})")
    store = Store.open(tmp_path)
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


def test_processes_creating_on_a_fresh_database_at_once_get_one_winner_and_clean_conflicts(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(6), context.Queue()
    processes = [context.Process(target=_open_and_create, args=(str(tmp_path / f"home-{n}"), barrier, results))
                 for n in range(6)]
    for process in processes:
        process.start()
    outcomes = sorted(results.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    assert outcomes[0] == "conflict: service 'svc' already exists; change it with " \
                          "`sky-lite serve update svc TASK.yaml`", outcomes
    assert outcomes.count("created") == 1 and len(set(outcomes)) == 2, outcomes


def test_a_write_waits_for_another_writer_then_fails_busy(tmp_path: Path, postgres_server: PostgresServer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg, "LOCK_TIMEOUT_MS", 300)
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=1.0)
    with postgres_server.admin(database()) as other:
        other.execute(f"BEGIN; SELECT pg_advisory_xact_lock({LOCK_CLASS}, {WRITE_LOCK})")  # another writer
        with pytest.raises(StateBusyError, match=r"^the state database postgresql://postgres@127\.0\.0\.1:\d+/\w+ "
                                                 r"stayed locked by another process"):
            store.set_service_status("svc", ServiceStatus.READY, None)
        assert store.get_service("svc").status is ServiceStatus.CONTROLLER_INIT  # reads never wait
        other.execute("ROLLBACK")
    store.set_service_status("svc", ServiceStatus.READY, None)
    assert store.get_service("svc").status is ServiceStatus.READY
    store.close()


# --- where the state is ----------------------------------------------------------------------------------
def test_the_controller_id_is_in_the_database_and_not_in_the_home(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{12}", store.controller_id)
    assert list(tmp_path.iterdir()) == []  # no state.db, no controller-id file: both are in the database
    other_home = Store.open(tmp_path / "another-home")  # another controller host, the same database
    assert other_home.controller_id == store.controller_id
    other_home.close()
    store.close()


def test_open_without_create_refuses_an_empty_database_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=r"^no state store in postgresql://"):
        Store.open(tmp_path / "gone", create=False)
    assert not (tmp_path / "gone").exists()
    Store.open(tmp_path / "home").close()
    Store.open(tmp_path / "gone", create=False).close()  # the schema is there now: any home opens it


def test_a_store_opened_read_only_reads_and_refuses_every_write(tmp_path: Path) -> None:
    writer = Store.open(tmp_path)
    writer.create_service("web", task(), 30001, now=5.0)
    writer.close()
    store = Store.open_read_only(tmp_path)
    assert store.read_only and store.get_service("web").lb_port == 30001
    writes: list[Callable[[], object]] = [lambda: store.mark_deleting(["web"]), lambda: store.record_pass(9.0),
                                          lambda: store.add_events([(9.0, "web", None, "service", "x")])]
    for write in writes:
        with pytest.raises(StateUnwritableError, match=r"^the state database postgresql://\S+ was opened "
                                                       r"read-only: nothing was changed$"):
            write()
    # The server refuses too, whatever got past the store.
    with pytest.raises(StateUnwritableError, match="read-only transaction"):
        store._db.execute("UPDATE services SET deleting = 1")
    assert store.get_service("web").deleting is False
    store.close()


def test_an_empty_database_opened_read_only_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StateUnwritableError, match=rf"opened read-only, \(schema 0\) needs migrating to schema "
                                                   rf"{len(MIGRATIONS)}"):
        Store.open_read_only(tmp_path)


# --- logins and the password ----------------------------------------------------------------------------
def test_a_password_in_the_url_logs_in_and_is_shown_nowhere(
        tmp_path: Path, postgres_server: PostgresServer, password_database: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("SKY_LITE_DB_URL", postgres_server.url(password_database, PASSWORD_USER, PASSWORD))
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=1.0)
    assert store.location == f"postgresql://{PASSWORD_USER}:***@127.0.0.1:{postgres_server.port}/{password_database}"
    assert isinstance(store._db, pg.PgConnection)
    shown = [store.location, repr(store._db), repr(vars(store._db)), str(store._db.url), caplog.text]
    assert all(PASSWORD not in text for text in shown)
    store.close()

    monkeypatch.setenv("SKY_LITE_DB_URL", postgres_server.url(password_database, PASSWORD_USER, "wrong"))
    with pytest.raises(StateUnavailableError) as caught:
        Store.open(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"cannot use the state database postgresql://{PASSWORD_USER}:***@127.0.0.1:")
    assert "password authentication failed" in message and "wrong" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # psycopg's chain is dropped


def test_a_password_set_with_config_is_kept_in_the_homes_password_file(
        tmp_path: Path, postgres_server: PostgresServer, password_database: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SKY_LITE_DB_URL")
    url = postgres_server.url(password_database, PASSWORD_USER, PASSWORD)
    shown = f"postgresql://{PASSWORD_USER}:***@127.0.0.1:{postgres_server.port}/{password_database}"
    assert set_config(tmp_path, "db_url", url) == shown
    assert show_config(tmp_path)["db_url"] == shown
    assert PASSWORD not in (tmp_path / "config.json").read_text()
    assert stat.S_IMODE((tmp_path / "pgpass").stat().st_mode) == 0o600

    store = Store.open(tmp_path)  # through libpq's password file alone
    store.create_service("svc", task(), 30001, now=1.0)
    assert store.location == shown
    store.close()

    set_config(tmp_path, "db_url", None)
    assert not (tmp_path / "pgpass").exists()
    assert "db_url" not in show_config(tmp_path)


def test_an_unreachable_server_is_one_clear_error(tmp_path: Path, postgres_server: PostgresServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = PostgresServer(postgres_server.bin_dir, postgres_server.root, port=1, os_user=None)
    monkeypatch.setenv("SKY_LITE_DB_URL", stopped.url("state", "sky", "pw-9"))
    with pytest.raises(StateUnavailableError, match=r"^cannot use the state database postgresql://sky:\*\*\*@"
                                                    r"127\.0\.0\.1:1/state \(.*refused") as caught:
        Store.open(tmp_path)
    assert "pw-9" not in str(caught.value) and caught.value.exit_code == 1


# --- a lost connection -----------------------------------------------------------------------------------
def _end_other_sessions(server: PostgresServer) -> int:
    with server.admin() as admin:
        return len(admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database(),)).fetchall())


def test_a_connection_lost_between_transactions_is_opened_again(tmp_path: Path,
                                                                postgres_server: PostgresServer) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=1.0)
    assert _end_other_sessions(postgres_server) == 1  # the server restarted, a failover
    assert [s.name for s in store.list_services()] == ["svc"]
    store.set_service_status("svc", ServiceStatus.READY, None)
    assert store.get_service("svc").status is ServiceStatus.READY
    store.close()


def test_a_connection_lost_inside_a_transaction_fails_it_and_the_next_one_reconnects(
        tmp_path: Path, postgres_server: PostgresServer) -> None:
    store = Store.open(tmp_path)
    store.create_service("svc", task(), 30001, now=1.0)
    lost = pytest.raises(StateUnavailableError, match="lost in the middle of a transaction")
    with lost, store._write(UNFENCED) as tx:
        db = tx.db
        db.execute("UPDATE services SET status_reason = 'half'")
        _end_other_sessions(postgres_server)
        with pytest.raises(StateUnavailableError, match=r"^cannot use the state database"):
            db.execute("UPDATE services SET status = 'READY'")
        db.execute("UPDATE services SET status = 'READY'")  # never outside the transaction it was part of
    assert store.get_service("svc").status_reason is None  # nothing of it committed
    store.set_service_status("svc", ServiceStatus.READY, "whole")
    assert store.get_service("svc").status_reason == "whole"
    store.close()
