"""The SQLite side of the store: one file per state directory, in WAL mode, through ``sqlite3``.

The default engine (no ``SKY_LITE_DB_URL``, no ``db_url``): ``$SKY_LITE_HOME/state.db``, mode 0600, read and
written side by side by the controller, the load balancers and the CLI. Every write is one short
``BEGIN IMMEDIATE`` transaction, which takes the database's one write lock: a migration needs nothing more.
``sqlite3`` errors about the file or its locks are translated here, in one place, at every query and fetch.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from skyserve_lite.errors import SkyLiteError, StateBusyError, StateDamagedError, StateUnwritableError
from skyserve_lite.state.access import StoreAccess
from skyserve_lite.state.dialect import SQLITE

_T = TypeVar("_T")
# How long opening the store (creating it, its PRAGMAs, its migrations) keeps trying while another process
# holds the database. Two `serve up` on a fresh home meet at `PRAGMA journal_mode=WAL`, where SQLite answers
# "locked" at once rather than calling its busy handler; the winner is done in milliseconds, so 5 s is
# plenty for it and still an answer "within seconds" when something holds the file for good.
_OPEN_WAIT_SECONDS = 5.0
# How long a query of an open store waits for another writer (every write is one short transaction).
_BUSY_TIMEOUT_SECONDS = 30.0
_SQLITE_MAGIC = b"SQLite format 3\0"
# sqlite3's messages for a file it cannot read, for Pythons without ``sqlite_errorname`` (3.10).
_DAMAGE_MESSAGES = frozenset({"file is not a database", "database disk image is malformed", "disk I/O error"})
_UNWRITABLE_MESSAGES = frozenset({"database or disk is full", "attempt to write a readonly database",
                                  "unable to open database file"})


def _translate(path: Path, exc: sqlite3.DatabaseError) -> SkyLiteError | None:
    """sky-lite's error for an ``sqlite3`` one, or None when it is not about the file or its locks (a
    constraint or an SQL mistake is a bug here, and keeps its own type and traceback)."""
    name = str(getattr(exc, "sqlite_errorname", ""))
    text = str(exc)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or text in ("database is locked", "database table is locked"):
        return StateBusyError(f"the state database {path} stayed locked by another process ({text}); "
                              "try again in a moment")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR_READ", "SQLITE_IOERR_SHORT_READ")) or (
            not name and text in _DAMAGE_MESSAGES):
        return _damaged(path, text)
    if name.startswith(("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR")) or (
            not name and text in _UNWRITABLE_MESSAGES):
        # Nothing was written: every write is one transaction, rolled back whole.
        return StateUnwritableError(f"cannot write the state database {path} ({text}): free some space or make "
                                    f"{path.parent} writable, then try again; nothing was changed")
    return None


def _damaged(path: Path, problem: str) -> StateDamagedError:
    return StateDamagedError(str(path), (
        f"the state database {path} is damaged or not a sky-lite database ({problem}). Stop what this state "
        f"directory started with `sky-lite serve down --all --force`, which works without it; then move "
        f"{path.name} and any {path.name}-wal and {path.name}-shm beside it out of {path.parent}, and the next "
        "command starts with an empty state"))


def _guarded(path: Path, call: Callable[..., _T], *args: Any) -> _T:
    try:
        return call(*args)
    except sqlite3.DatabaseError as exc:
        translated = _translate(path, exc)
        if translated is None:
            raise
        raise translated from exc


class SqliteConnection(sqlite3.Connection):
    """The store's SQLite connection (``connection.StoreConnection``): every query and every fetch of its
    rows raises ``StateDamagedError`` or ``StateBusyError`` for what ``_translate`` recognises. The one place
    ``sqlite3`` errors are translated, so a damage found by any query of any method (not only at open) is one
    clear error."""

    dialect = SQLITE

    def __init__(self, database: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(database, *args, **kwargs)
        self.db_path = Path(database)
        self.location = str(self.db_path)
        # The file this connection opened (device, inode): ``is_current``.
        self.identity: tuple[int, int] | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self.cursor(_Cursor).execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        return self.cursor(_Cursor).executemany(sql, parameters)

    def is_current(self) -> bool:
        return file_identity(self.db_path) == self.identity

    def needs_migration(self, version: int) -> bool:
        # Always: the check runs under the write lock every open takes (``BEGIN IMMEDIATE``), which is all
        # that keeps two openers of a fresh file from migrating it twice, and costs a millisecond.
        return True

    def migrating(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the write transaction's lock is the migration's

    def read_schema_version(self) -> int:
        return int(self.execute("PRAGMA user_version").fetchone()[0])

    def write_schema_version(self, version: int) -> None:
        self.execute(f"PRAGMA user_version = {int(version)}")

    def run_script(self, script: str) -> None:
        for statement in split_statements(script):
            self.execute(statement)

    def prepare(self, migrate: Callable[[], None]) -> None:
        """Set the connection up (WAL, foreign keys) and run ``migrate``, waiting out other openers of the
        same file for a few seconds (``_retry_while_busy``)."""
        def set_up() -> None:
            self.execute("PRAGMA journal_mode=WAL")
            self.execute("PRAGMA synchronous=NORMAL")
            self.execute("PRAGMA foreign_keys=ON")
            migrate()

        _retry_while_busy(self.db_path, self, set_up)
        self.wait_when_busy()

    def wait_when_busy(self) -> None:
        """From now on a query waits ``_BUSY_TIMEOUT_SECONDS`` for another writer before it fails."""
        self.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_SECONDS * 1000)}")


def connect(path: Path) -> SqliteConnection:
    """A read-write connection to the database file ``path`` (created 0600 when missing), not yet
    ``prepare``d. Its directory is the caller's to check (``store.prepare_home``, ``state.access``)."""
    if not path.exists():
        # Create the file with 0600 before SQLite writes anything into it.
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(path, 0o600)
    connection = sqlite3.connect(path, timeout=_OPEN_WAIT_SECONDS, isolation_level=None,
                                 check_same_thread=False, factory=SqliteConnection)
    connection.identity = file_identity(path)
    return connection


def connect_read_only(path: Path, access: StoreAccess) -> SqliteConnection:
    """A connection that only reads ``path`` (``access`` is READ_ONLY or IMMUTABLE: ``state.access``),
    creating no file, not even SQLite's ``-shm`` index."""
    uri = f"{path.absolute().as_uri()}?mode=ro" + ("&immutable=1" if access is StoreAccess.IMMUTABLE else "")
    connection = _guarded(path, lambda: sqlite3.connect(
        uri, uri=True, timeout=_OPEN_WAIT_SECONDS, isolation_level=None, check_same_thread=False,
        factory=SqliteConnection))
    connection.db_path = path
    connection.location = str(path)
    connection.identity = file_identity(path)
    return connection


def file_identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


class _Cursor(sqlite3.Cursor):
    """A cursor of ``SqliteConnection``: SQLite reads rows lazily, so a damaged page may surface at any fetch."""

    @property
    def _path(self) -> Path:
        connection = self.connection
        return connection.db_path if isinstance(connection, SqliteConnection) else Path("?")

    def execute(self, sql: str, parameters: Any = (), /) -> _Cursor:
        return _guarded(self._path, super().execute, sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> _Cursor:
        return _guarded(self._path, super().executemany, sql, parameters)

    def fetchone(self) -> Any:
        return _guarded(self._path, super().fetchone)

    def fetchmany(self, size: int | None = 1) -> list[Any]:
        return _guarded(self._path, super().fetchmany, size)

    def fetchall(self) -> list[Any]:
        return _guarded(self._path, super().fetchall)

    def __next__(self) -> Any:
        return _guarded(self._path, super().__next__)


def _retry_while_busy(path: Path, connection: sqlite3.Connection, step: Callable[[], None]) -> None:
    """Run ``step`` (part of opening the store) again while the database is locked, for at most
    ``_OPEN_WAIT_SECONDS`` in all. Still locked then: ``StateBusyError``, or ``StateDamagedError`` when the
    file holds no SQLite header (it was emptied or truncated under a process that keeps it open)."""
    deadline = time.monotonic() + _OPEN_WAIT_SECONDS
    while True:
        # SQLite's own busy handler waits where it can; the loop covers where it answers "locked" at once.
        remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
        connection.execute(f"PRAGMA busy_timeout = {remaining_ms}")
        try:
            step()
            return
        except StateBusyError:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            if time.monotonic() >= deadline:
                if not _has_sqlite_header(path):
                    raise _damaged(path, "the file is empty or truncated, and another process still has "
                                         "it open") from None
                raise
            time.sleep(0.02)


def _has_sqlite_header(path: Path) -> bool:
    try:
        with open(path, "rb") as stream:
            return stream.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def split_statements(script: str) -> Iterator[str]:
    """The statements of ``script``, each whole: a trigger's body holds statements of its own (and its
    semicolons), which ``executescript`` would run outside the migration's transaction."""
    pending = ""
    pieces = script.split(";")
    for index, piece in enumerate(pieces):
        pending += piece if index == len(pieces) - 1 else piece + ";"
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    if pending.strip() and not _is_comment_only(pending):
        if not sqlite3.complete_statement(pending + "\n;"):
            raise ValueError(f"an incomplete statement at the end of a migration: {pending.strip()!r}")
        yield pending  # a last statement without its semicolon


def _is_comment_only(text: str) -> bool:
    """Whether ``text`` is only whitespace and SQL comments."""
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())
