"""The PostgreSQL side of the store: a psycopg 3 connection keeping ``connection.StoreConnection``.

Chosen by ``SKY_LITE_DB_URL`` or the home's ``db_url`` (``state.dburl``); psycopg is an optional dependency
(``pip install 'skyserve-lite[postgres]'``), imported only when a store opens on PostgreSQL.

- The store's queries use ``?``; they are turned into psycopg's ``%s`` once per distinct query (a dict), and
  psycopg prepares a query on the server after a few runs, so a pass's few statements cost a round trip each.
- Autocommit, with explicit ``BEGIN``/``COMMIT`` from the store, as on SQLite. Writers take one
  transaction-scoped advisory lock (``dialect.POSTGRESQL.begin_write``), so they follow each other as SQLite's
  do; readers never wait (MVCC). ``lock_timeout`` bounds the wait as SQLite's busy timeout does.
- The schema version is a one-row table, ``schema_version``; a migration runs under a session advisory lock
  (``pg_advisory_lock``): of any number of processes opening a fresh database together, one migrates and
  the others find it done. An open that finds the schema current takes no lock at all.
- A connection lost between transactions (the server restarted, a failover) is opened again by the next
  statement, which is sent again once when it found the connection dead; one lost inside a transaction fails
  that transaction (its later statements too, never run outside it), and the next ``BEGIN`` reconnects.
- psycopg's errors about the server (unreachable, login refused, lock wait over, disk full, read-only) are
  translated here into sky-lite's; the messages name the database by its URL without the password.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.adapt import Dumper

from skyserve_lite.errors import SkyLiteError, StateBusyError, StateUnavailableError, StateUnwritableError
from skyserve_lite.state.dburl import DatabaseUrl
from skyserve_lite.state.dialect import LOCK_CLASS, MIGRATION_LOCK, POSTGRESQL

# How long a statement waits for a lock (the write lock, the migration lock) before it fails with
# ``StateBusyError``: SQLite's busy timeout, for the same short transactions.
LOCK_TIMEOUT_MS = 30_000

_SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    one INTEGER PRIMARY KEY DEFAULT 1 CHECK (one = 1),
    version INTEGER NOT NULL
);
INSERT INTO schema_version (one, version) VALUES (1, 0) ON CONFLICT (one) DO NOTHING;
"""

_WRITES = ("INSERT", "UPDATE", "DELETE")
_IN_TRANSACTION = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR, pq.TransactionStatus.ACTIVE)


class _BoolAsInteger(Dumper):
    """A Python bool as the 0 or 1 the schema's INTEGER flags hold (``is_spot``), as ``sqlite3`` writes it;
    psycopg would send a PostgreSQL boolean, which a BIGINT column refuses."""

    oid = psycopg.adapters.types["int8"].oid

    def dump(self, obj: Any) -> bytes:
        return b"1" if obj else b"0"


def translate(location: str, exc: psycopg.Error) -> SkyLiteError | None:
    """sky-lite's error for a psycopg one, or None when it is not about the server, its locks or its space
    (a constraint or an SQL mistake is a bug here, and keeps its own type and traceback)."""
    problem = _first_line(exc)
    # A deadlock or a serialization failure cannot happen between the store's writers (one write lock), but
    # would be another writer's doing too: a moment later the same transaction goes through.
    if isinstance(exc, (pg_errors.LockNotAvailable, pg_errors.TransactionRollback)):
        return StateBusyError(f"the state database {location} stayed locked by another process ({problem}); "
                              "try again in a moment")
    if isinstance(exc, (pg_errors.DiskFull, pg_errors.OutOfMemory, pg_errors.ReadOnlySqlTransaction,
                        pg_errors.InsufficientPrivilege)):
        return StateUnwritableError(f"cannot write the state database {location} ({problem}); nothing was "
                                    "changed")
    if isinstance(exc, psycopg.OperationalError):  # no connection, or it was lost or refused
        return StateUnavailableError(f"cannot use the state database {location} ({problem}); check that the "
                                     "server runs and accepts this user, then try again")
    return None


def _first_line(exc: psycopg.Error) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def to_format(sql: str) -> str:
    """A query with ``?`` placeholders in psycopg's format (``%s``; a literal ``%`` doubled). The store's
    queries hold no ``?`` inside a quoted string; one that did would be refused by the server, not
    misread."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """A connection to the state's PostgreSQL database (see the module's docstring)."""

    dialect = POSTGRESQL

    def __init__(self, url: DatabaseUrl, *, read_only: bool = False) -> None:
        self.url = url
        self.location = str(url)  # never the password: ``DatabaseUrl`` shows it as ***
        self._read_only = read_only
        self._formats: dict[str, str] = {}
        self._trace: Callable[[str], object] | None = None
        self._changes = 0
        self._lost_in_transaction = False
        self._closed = False
        self._connection = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        options = f"-c lock_timeout={LOCK_TIMEOUT_MS}"
        if self._read_only:
            options += " -c default_transaction_read_only=on"
        arguments: dict[str, Any] = self.url.connect_arguments()  # the password travels in these only
        try:
            connection = psycopg.connect(autocommit=True, options=options, **arguments)
        except psycopg.Error as exc:
            translated = translate(self.location, exc)
            if translated is None:
                raise
            raise translated from None  # psycopg's chain may hold the connection's arguments
        connection.adapters.register_dumper(bool, _BoolAsInteger)
        return connection

    def _ready(self, sql: str) -> psycopg.Connection[Any]:
        """The connection to run ``sql`` on: opened again when it was lost, unless it was lost inside a
        transaction that ``sql`` belongs to (that transaction is over, and did not commit)."""
        connection = self._connection
        if not (connection.closed or connection.broken):
            return connection
        if self._closed:
            raise ValueError("the store's connection was closed")  # a bug: as sqlite3 refuses a closed one
        if self._lost_in_transaction:
            verb = sql.lstrip()[:8].upper()
            if verb.startswith("COMMIT"):
                self._lost_in_transaction = False
            if not verb.startswith(("BEGIN", "ROLLBACK")):
                raise StateUnavailableError(f"the connection to the state database {self.location} was lost in "
                                            "the middle of a transaction, which did not commit")
        self._lost_in_transaction = False
        self._connection = self._connect()
        return self._connection

    def _run(self, sql: str, call: Callable[[psycopg.Cursor[Any]], object]) -> psycopg.Cursor[Any]:
        try:
            return self._run_once(sql, call)
        except StateUnavailableError:
            # A connection found dead by a statement outside any transaction (the server ended it while it
            # was idle: a restart, a failover) is opened again and the statement sent once more: a read or a
            # BEGIN, never a write (every write is inside a transaction, and is not sent again).
            if self._lost_in_transaction or self._closed or sql.lstrip()[:6].upper() in _WRITES:
                raise
            if not (self._connection.closed or self._connection.broken):
                raise
            return self._run_once(sql, call)

    def _run_once(self, sql: str, call: Callable[[psycopg.Cursor[Any]], object]) -> psycopg.Cursor[Any]:
        connection = self._ready(sql)
        was_in_transaction = connection.info.transaction_status in _IN_TRANSACTION
        cursor = connection.cursor()
        try:
            call(cursor)
        except psycopg.Error as exc:
            if connection.closed or connection.broken:
                self._lost_in_transaction = was_in_transaction
            translated = translate(self.location, exc)
            if translated is None:
                raise
            raise translated from exc
        if cursor.rowcount > 0 and sql.lstrip()[:6].upper() in _WRITES:
            self._changes += cursor.rowcount
        return cursor

    def execute(self, sql: str, parameters: Any = (), /) -> psycopg.Cursor[Any]:
        if self._trace is not None:
            self._trace(sql)
        if not parameters:  # sent as it is: several statements may be one call, and a % is a %
            return self._run(sql, lambda cursor: cursor.execute(sql))
        query = self._formats.get(sql)
        if query is None:
            query = self._formats[sql] = to_format(sql)
        return self._run(sql, lambda cursor: cursor.execute(query, parameters))

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> psycopg.Cursor[Any]:
        rows = list(parameters)
        if self._trace is not None:
            for _ in rows:
                self._trace(sql)
        query = self._formats.get(sql)
        if query is None:
            query = self._formats[sql] = to_format(sql)
        return self._run(sql, lambda cursor: cursor.executemany(query, rows))

    @property
    def in_transaction(self) -> bool:
        """True inside a transaction, and inside one whose connection was lost until it is rolled back (its
        statements fail meanwhile, rather than run outside it)."""
        connection = self._connection
        return self._lost_in_transaction or (
            not connection.closed and connection.info.transaction_status in _IN_TRANSACTION)

    @property
    def total_changes(self) -> int:
        return self._changes

    def set_trace_callback(self, trace_callback: Callable[[str], object] | None, /) -> None:
        self._trace = trace_callback

    def close(self) -> None:
        self._closed = True
        self._connection.close()

    def is_current(self) -> bool:
        # The database is wherever the URL says; there is no file to be deleted or replaced under us.
        return True

    def prepare(self, migrate: Callable[[], None]) -> None:
        migrate()

    def needs_migration(self, version: int) -> bool:
        return self.read_schema_version() < version or self.execute(
            "SELECT 1 FROM meta WHERE key = 'controller_id'").fetchone() is None

    @contextlib.contextmanager
    def migrating(self) -> Iterator[None]:
        self.execute(f"SELECT pg_advisory_lock({LOCK_CLASS}, {MIGRATION_LOCK})")
        try:
            yield
        finally:
            if not (self._connection.closed or self._connection.broken):
                self.execute(f"SELECT pg_advisory_unlock({LOCK_CLASS}, {MIGRATION_LOCK})")

    def read_schema_version(self) -> int:
        (exists,) = self.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchall()[0]
        if not exists:
            return 0
        return int(self.execute("SELECT version FROM schema_version").fetchall()[0][0])

    def write_schema_version(self, version: int) -> None:
        self.execute(_SCHEMA_VERSION_TABLE)
        self.execute("UPDATE schema_version SET version = ?", (version,))

    def run_script(self, script: str) -> None:
        self.execute(script)


def connect(url: DatabaseUrl, *, read_only: bool = False) -> PgConnection:
    """A connection to ``url``'s database (``read_only``: every transaction read-only, on the server's side
    too). Raises ``StateUnavailableError`` when the server cannot be reached or refuses the login."""
    return PgConnection(url, read_only=read_only)
