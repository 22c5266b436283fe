"""The store of a state directory this process cannot write: how it is opened (``state.access``), that its
reads work and its writes are refused naming the directory, and the refusals of the files beside it.

The real thing (a read-only mount, commands run against it) is tests/cli/test_read_only_home_cli.py; here the
switch itself, on directories root could write.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from skyserve_lite.errors import StateUnwritableError
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.access import (
    HomeFiles,
    StoreAccess,
    find_refusal_in_home,
    observe_home,
    plan_store_access,
)
from skyserve_lite.state.dialect import SQLITE
from skyserve_lite.state.schema import MIGRATIONS
from skyserve_lite.state.store import DB_NAME, Store, prepare_home

# A read-only state directory is the SQLite file's case; a read-only store on PostgreSQL is in
# test_postgresql_store.py.
pytestmark = pytest.mark.sqlite_only(reason="the SQLite file of a read-only home")

TEXT = "service:\n  replicas: 1\nrun: echo hi\n"


def task() -> SubmittedTask:
    return SubmittedTask(text=TEXT, source="/tmp/svc.yaml", spec=parse_task(TEXT))


def listing(home: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(home.iterdir())}


def store_with_service(home: Path) -> None:
    store = Store.open(home)
    store.create_service("web", task(), 30001, now=5.0)
    store.close()


@pytest.mark.parametrize(("found", "access"), [
    pytest.param(HomeFiles(writable=True, database=True, wal=True, shm=True), StoreAccess.READ_WRITE,
                 id="writable"),
    pytest.param(HomeFiles(writable=True, database=False, wal=False, shm=False), StoreAccess.READ_WRITE,
                 id="writable-empty: the store is created"),
    pytest.param(HomeFiles(writable=False, database=True, wal=True, shm=True), StoreAccess.READ_ONLY,
                 id="a-writer-has-it-open: read its log through its index"),
    pytest.param(HomeFiles(writable=False, database=True, wal=False, shm=False), StoreAccess.IMMUTABLE,
                 id="closed-cleanly: the database file alone"),
    pytest.param(HomeFiles(writable=False, database=True, wal=False, shm=True), StoreAccess.IMMUTABLE,
                 id="an-index-without-log: nothing in a log"),
    pytest.param(HomeFiles(writable=False, database=True, wal=True, shm=False), StoreAccess.WAL_WITHOUT_INDEX,
                 id="a-log-without-index: refused, not read stale"),
    pytest.param(HomeFiles(writable=False, database=False, wal=False, shm=False), StoreAccess.NO_DATABASE,
                 id="nothing-to-read"),
])
def test_plan_store_access(found: HomeFiles, access: StoreAccess) -> None:
    assert plan_store_access(found) is access


def test_observe_home_sees_the_files_of_a_writer(tmp_path: Path) -> None:
    assert observe_home(tmp_path, tmp_path / DB_NAME) == HomeFiles(writable=True, database=False, wal=False,
                                                                    shm=False)
    writer = Store.open(tmp_path)
    assert observe_home(tmp_path, tmp_path / DB_NAME) == HomeFiles(writable=True, database=True, wal=True,
                                                                    shm=True)
    writer.close()
    assert observe_home(tmp_path, tmp_path / DB_NAME) == HomeFiles(writable=True, database=True, wal=False,
                                                                    shm=False)


def test_a_closed_store_is_read_without_creating_a_file(tmp_path: Path) -> None:
    store_with_service(tmp_path)
    before = listing(tmp_path)

    store = Store.open_read_only(tmp_path)
    with store.reading():
        assert [s.name for s in store.list_services()] == ["web"]
        assert store.get_version("web", 1).text == TEXT
    store.close()

    assert listing(tmp_path) == before  # no -wal, no -shm: an immutable read needs neither


def test_a_change_still_in_a_writers_log_is_read(tmp_path: Path) -> None:
    writer = Store.open(tmp_path)
    writer.create_service("web", task(), 30001, now=5.0)  # in the -wal only: the writer is still open

    reader = Store.open_read_only(tmp_path)

    assert reader.get_service("web").lb_port == 30001
    writer.create_service("api", task(), 30002, now=6.0)
    assert [s.name for s in reader.list_services()] == ["api", "web"]
    reader.close()
    writer.close()


WRITES: list[tuple[str, Callable[[Store], object]]] = [
    ("create_service", lambda store: store.create_service("other", task(), 30009, now=9.0)),
    ("add_version", lambda store: store.add_version("web", task(), "rolling", 9.0)),
    ("mark_deleting", lambda store: store.mark_deleting(["web"])),
    ("add_events", lambda store: store.add_events([(9.0, "web", None, "service", "hello")])),
    ("record_pass", lambda store: store.record_pass(9.0)),
    ("record_request_counts", lambda store: store.record_request_counts("web", {9: 1})),
]


@pytest.mark.parametrize("write", [pytest.param(call, id=name) for name, call in WRITES])
def test_every_write_is_refused_naming_the_directory(tmp_path: Path, write: Callable[[Store], object]) -> None:
    store_with_service(tmp_path)
    before = listing(tmp_path)
    store = Store.open_read_only(tmp_path)

    with pytest.raises(StateUnwritableError, match=rf"^the state directory {tmp_path} is read-only: nothing was"):
        write(store)

    assert store.get_service("web").deleting is False
    store.close()
    assert listing(tmp_path) == before


def test_a_log_without_its_index_is_refused(tmp_path: Path) -> None:
    writer = Store.open(tmp_path / "live")
    writer.create_service("web", task(), 30001, now=5.0)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (DB_NAME, DB_NAME + "-wal"):  # a copy that left the -shm behind
        shutil.copy(tmp_path / "live" / name, copy / name)
    writer.close()

    with pytest.raises(StateUnwritableError, match=rf"{copy} is read-only, and state.db-wal holds changes"):
        Store.open_read_only(copy)


def test_no_store_to_read(tmp_path: Path) -> None:
    with pytest.raises(StateUnwritableError, match=rf"{tmp_path} is read-only and holds no state database"):
        Store.open_read_only(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_store_that_needs_migrating_is_refused(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / DB_NAME) as old:
        old.executescript(SQLITE.render(MIGRATIONS[0]) + "PRAGMA user_version = 1;")
    old.close()

    with pytest.raises(StateUnwritableError, match=rf"database \(schema 1\) needs migrating to schema "
                                                   rf"{len(MIGRATIONS)}"):
        Store.open_read_only(tmp_path)


def test_a_state_directory_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StateUnwritableError, match=rf"cannot create the state directory {tmp_path}/file/home"):
        prepare_home(tmp_path / "file" / "home")


@pytest.mark.parametrize(("code", "name", "expected"), [
    pytest.param(errno.EROFS, "home/controller.lock",
                 "the state directory {home} is read-only ({home}/controller.lock: Read-only file system); "
                 "nothing was changed; make it writable, or run this where it is", id="read-only-mount"),
    pytest.param(errno.EACCES, "home/blobs/x",
                 "cannot use {home}/blobs/x in the state directory {home} (Permission denied); make the directory "
                 "writable by you, or set SKY_LITE_HOME to one that is", id="no-permission"),
    pytest.param(errno.EROFS, "elsewhere/task.yaml", None, id="a-file-elsewhere"),
    pytest.param(errno.EROFS, "home-other/x", None, id="a-sibling-with-the-same-prefix"),
    pytest.param(errno.ENOSPC, "home/state.db", None, id="another-error"),
])
def test_find_refusal_in_home(tmp_path: Path, code: int, name: str, expected: str | None) -> None:
    home = tmp_path / "home"
    exc = OSError(code, os.strerror(code), str(tmp_path / name))

    refusal = find_refusal_in_home(exc, home)

    assert (None if refusal is None else str(refusal)) == (
        None if expected is None else expected.format(home=home))
