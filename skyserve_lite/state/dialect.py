"""What differs between the two engines' SQL, in one value per engine: ``SQLITE`` and ``POSTGRESQL``.

The store's queries are written once, with ``?`` placeholders and ``INSERT ... ON CONFLICT`` (both engines
know it); the PostgreSQL connection turns ``?`` into psycopg's ``%s`` (``state.pg``). What cannot be written
once is here: column types, the counting triggers, how a write transaction begins (SQLite's ``BEGIN
IMMEDIATE`` takes the database's one write lock; PostgreSQL takes a transaction-scoped advisory lock that
every writer asks for, so that writers follow each other exactly as they do on SQLite: every read-then-write
of the store, "the next replica id", "the current version is still N", holds), how a consistent read
begins, and where the schema version is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from skyserve_lite.state.schema import CountingTriggers, Step

# The advisory locks sky-lite takes on PostgreSQL, as (class, object) pairs: the class is "skyl" in ASCII,
# so that another application's advisory locks on the same database cannot collide with these.
LOCK_CLASS = 0x736B796C
WRITE_LOCK = 1  # held by each write transaction, to its end (pg_advisory_xact_lock)
MIGRATION_LOCK = 2  # held by the one process migrating the schema, while it does (pg_advisory_lock)


@dataclass(frozen=True)
class Dialect:
    """An engine's SQL where it differs from the other's."""

    name: str
    types: Mapping[str, str]  # the schema's placeholders ({TEXT}, ...) -> this engine's column types
    begin_write: str  # begins a write transaction, holding the store's write lock when it returns
    begin_read: str  # begins a read-only transaction that sees one committed state throughout
    counting_triggers: Callable[[str, tuple[str, ...]], str]  # ``schema.CountingTriggers`` in this engine's SQL
    # ``schema.ServiceCountingTriggers`` in this engine's SQL.
    service_counting_triggers: Callable[[str, tuple[tuple[str, str], ...], bool], str]

    def render(self, migration: tuple[Step, ...]) -> str:
        """``migration`` (``schema.MIGRATIONS``) as one script of this engine's SQL."""
        return "".join(self._render(step) for step in migration)

    def _render(self, step: Step) -> str:
        if isinstance(step, str):
            return step.format_map(self.types)
        if isinstance(step, CountingTriggers):
            return self.counting_triggers(step.counter, step.tables)
        return self.service_counting_triggers(step.counter_table, step.tables, step.services)


def _sqlite_counting_triggers(counter: str, tables: tuple[str, ...]) -> str:
    """Part of shipped migrations: what it returns for their arguments must not change."""
    return "".join(
        f"CREATE TRIGGER {table}_{done} AFTER {event} ON {table} BEGIN\n"
        f"    UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = '{counter}'; END;\n"
        for table in tables for event, done in (("INSERT", "inserted"), ("UPDATE", "updated"), ("DELETE", "deleted")))


_EVENTS = (("INSERT", "inserted", "NEW"), ("UPDATE", "updated", "NEW"), ("DELETE", "deleted", "OLD"))


def _service_counter_statements(counter_table: str, tables: tuple[tuple[str, str], ...], services: bool
                                 ) -> list[tuple[str, str, str, str]]:
    """(table, event, name of the trigger's event, statement) of ``schema.ServiceCountingTriggers``, in
    both engines' SQL: a service's insert creates (or, for a name used before, moves) its counter row, every
    other write moves it with a plain UPDATE (cheaper than an upsert, ~10,000 of them in a launch pass)."""
    upsert = (f"INSERT INTO {counter_table} (service, generation) VALUES (NEW.name, 1)"
              f" ON CONFLICT (service) DO UPDATE SET generation = {counter_table}.generation + 1")
    found: list[tuple[str, str, str, str]] = []
    for table, column in ((("services", "name"),) if services else ()) + tables:
        for event, done, row in _EVENTS:
            statement = (upsert if (table, event) == ("services", "INSERT") else
                         f"UPDATE {counter_table} SET generation = generation + 1 WHERE service = {row}.{column}")
            found.append((table, event, done, statement))
    return found


def _sqlite_service_counting_triggers(counter_table: str, tables: tuple[tuple[str, str], ...], services: bool
                                      ) -> str:
    """Part of shipped migrations: what it returns for their arguments must not change."""
    return "".join(f"CREATE TRIGGER {table}_changed_{done} AFTER {event} ON {table} BEGIN\n    {statement}; END;\n"
                   for table, event, done, statement in _service_counter_statements(counter_table, tables, services))


# One trigger function for every counter (its name is the trigger's argument). FOR EACH ROW, as SQLite's
# triggers are: the counter moves only when a row was written, so a pass whose statements matched no row
# does not make the next pass read everything again.
_POSTGRESQL_COUNTING_FUNCTION = """
CREATE OR REPLACE FUNCTION sky_lite_count_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE meta SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT) WHERE key = TG_ARGV[0];
    RETURN NULL;
END
$$;
"""


def _postgresql_counting_triggers(counter: str, tables: tuple[str, ...]) -> str:
    return _POSTGRESQL_COUNTING_FUNCTION + "".join(
        f"CREATE TRIGGER {table}_{done} AFTER {event} ON {table} FOR EACH ROW"
        f" EXECUTE FUNCTION sky_lite_count_write('{counter}');\n"
        for table in tables for event, done in (("INSERT", "inserted"), ("UPDATE", "updated"), ("DELETE", "deleted")))


def _postgresql_service_counting_triggers(counter_table: str, tables: tuple[tuple[str, str], ...],
                                          services: bool) -> str:
    """A function per trigger (its statement names its columns, not looked up per row), FOR EACH ROW as
    the other counters' triggers."""
    return "".join(
        f"CREATE OR REPLACE FUNCTION sky_lite_{table}_changed_{done}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n    {statement};\n    RETURN NULL;\nEND\n$$;\n"
        f"CREATE TRIGGER {table}_changed_{done} AFTER {event} ON {table} FOR EACH ROW"
        f" EXECUTE FUNCTION sky_lite_{table}_changed_{done}();\n"
        for table, event, done, statement in _service_counter_statements(counter_table, tables, services))


SQLITE = Dialect(
    name="sqlite",
    types={"TEXT": "TEXT", "INTEGER": "INTEGER", "REAL": "REAL", "BLOB": "BLOB",
           "SERIAL_KEY": "INTEGER PRIMARY KEY AUTOINCREMENT"},
    begin_write="BEGIN IMMEDIATE",
    begin_read="BEGIN",
    counting_triggers=_sqlite_counting_triggers,
    service_counting_triggers=_sqlite_service_counting_triggers,
)

POSTGRESQL = Dialect(
    name="postgresql",
    # BIGINT: epoch seconds and pids fit INTEGER today, but SQLite's INTEGER is 8 bytes and PostgreSQL's 4.
    # COLLATE "C": names sort by their bytes, as SQLite sorts them, whatever the database's locale.
    types={"TEXT": 'TEXT COLLATE "C"', "INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION", "BLOB": "BYTEA",
           "SERIAL_KEY": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"},
    # One round trip: with no parameters psycopg sends both statements at once.
    begin_write=f"BEGIN; SELECT pg_advisory_xact_lock({LOCK_CLASS}, {WRITE_LOCK})",
    begin_read="BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
    counting_triggers=_postgresql_counting_triggers,
    service_counting_triggers=_postgresql_service_counting_triggers,
)
