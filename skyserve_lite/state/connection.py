"""What the store asks of its database connection, whichever engine holds the state.

Two connections keep this contract: ``state.sqlite.SqliteConnection`` (the file in the home, the default) and
``state.pg.PgConnection`` (PostgreSQL, when ``SKY_LITE_DB_URL`` or ``db_url`` names one). ``Store`` talks to
either through this protocol alone; what their SQL differs in is their ``dialect`` (``state.dialect``).

Both run in autocommit: a statement outside ``begin_write`` ... ``COMMIT`` is its own transaction. Both
translate their driver's errors about the database itself (locked, unreachable, full, damaged) into
sky-lite's (``StateBusyError``, ``StateUnavailableError``, ``StateUnwritableError``, ``StateDamagedError``) at
``execute`` and at every fetch; anything else (a constraint, an SQL mistake) is a bug and keeps its type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from skyserve_lite.state.dialect import Dialect


class Cursor(Protocol):
    """The rows of one statement (plain tuples), and how many rows it wrote."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class StoreConnection(Protocol):
    """A connection to the state database (see the module's docstring)."""

    dialect: Dialect
    # What messages call the database: its file, or its URL without the password.
    location: str

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        """Run one statement (``?`` placeholders); a ``Cursor``. Without parameters a string of several
        statements is allowed (``dialect.begin_write`` is one)."""
        ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor:
        """Run one statement once per parameter tuple; a ``Cursor`` whose ``rowcount`` is their sum."""
        ...

    @property
    def in_transaction(self) -> bool: ...

    @property
    def total_changes(self) -> int:
        """Rows inserted, changed or deleted through this connection since it opened (``Store.counting``)."""
        ...

    def set_trace_callback(self, trace_callback: Callable[[str], object] | None, /) -> None:
        """Call ``trace_callback`` with every statement run (once per parameter tuple of ``executemany``)
        until it is set to None; for counting only."""
        ...

    def close(self) -> None: ...

    def is_current(self) -> bool:
        """False once what this connection reads is no longer the state others see (the SQLite file was
        deleted or replaced under it)."""
        ...

    def prepare(self, migrate: Callable[[], None]) -> None:
        """Make a fresh connection ready for the store and run ``migrate`` (the store's migration) as this
        engine needs it run: within SQLite's wait for other openers of a fresh file, for instance."""
        ...

    def needs_migration(self, version: int) -> bool:
        """Whether an open must take ``migrating`` and the write lock to bring the schema to ``version``
        (or to find it there)."""
        ...

    def migrating(self) -> AbstractContextManager[None]:
        """Held around a migration's write transaction: one process migrates, whatever the number opening
        the same database at once; the others find the schema done when they get it."""
        ...

    def read_schema_version(self) -> int:
        """How many migrations the database holds; 0 for an empty database."""
        ...

    def write_schema_version(self, version: int) -> None:
        """Record ``version``, inside the migration's transaction."""
        ...

    def run_script(self, script: str) -> None:
        """Run a rendered migration (``Dialect.render``), inside the current transaction."""
        ...
