"""The state store: services, every version of their task YAML, replicas, events, request counts.

By default one SQLite file per ``$SKY_LITE_HOME`` in WAL mode (``state.sqlite``), so the controller, the load
balancers and the CLI read and write side by side; with ``SKY_LITE_DB_URL`` or the home's ``db_url``, a
PostgreSQL database (``state.pg``). ``Store`` is the same over both: its queries are written once
(``state.dialect`` holds what differs), and everything above it never knows which engine it talks to. Every
write is one short transaction, writers one at a time (SQLite's ``BEGIN IMMEDIATE``, an advisory lock on
PostgreSQL), so a crash leaves either the old or the new state, never half of a change.

Who writes what: the CLI (through ``api``) creates services and versions and marks them for deletion;
the controller's executor is the only writer of replica rows, service status and the replica history; a
load balancer writes only its request counts and its load report (in-flight and held requests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import operator
import os
import stat
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.errors import NotFoundError, StateConflictError, StateUnwritableError, UsageError
from skyserve_lite.files.manifest import TaskFiles
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings, CanaryStart, CanaryState, Command
from skyserve_lite.spec.inputs import BoundInputs
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.state import sqlite
from skyserve_lite.state.access import StoreAccess, observe_home, plan_store_access
from skyserve_lite.state.connection import StoreConnection
from skyserve_lite.state.dburl import DatabaseUrl, find_database_url
from skyserve_lite.state.history import REQUEST_COUNTS_KEEP_SECONDS, ReplicaSample
from skyserve_lite.state.leases import Fence, Lease, LeasePlan
from skyserve_lite.state.models import (
    REPLICA_STATUS_BY_VALUE,
    AutoscalerObservation,
    EventRecord,
    LbEndpoint,
    LbReport,
    LbView,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceStatus,
    StoredCanary,
    VersionRecord,
    parsed_spec_json,
    replace_replica,
    replica_from_fields,
)
from skyserve_lite.state.schema import MIGRATIONS

log = logging.getLogger(__name__)

DB_NAME = "state.db"

_REPLICA_COLUMNS = tuple(field.name for field in dataclasses.fields(ReplicaRecord))


# Written into every state directory sky-lite creates: what tells "made by sky-lite" from "a directory that
# was there already" (which keeps its mode, and is refused if other users can write to it).
HOME_MARKER = ".sky-lite-home"


# Must match skyserve_lite.forcedown.CONTROLLER_ID_FILE (the store must not import it: an import cycle).
CONTROLLER_ID_FILE = "controller-id"


def _record_controller_id(home: Path, controller_id: str) -> None:
    """Keep the controller id outside the database too, so `serve down --all --force` can find the cloud
    instances tagged with it when state.db is damaged. Best effort: the store never reads it."""
    path = home / CONTROLLER_ID_FILE
    try:
        if path.read_text().strip() == controller_id:
            return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        temporary = path.with_name(CONTROLLER_ID_FILE + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(controller_id + "\n")
        os.replace(temporary, path)


def prepare_home(home: Path) -> Path:
    """Make sure ``home`` is a state directory sky-lite may use, and return it. Idempotent.

    A missing directory is created with mode 0700 and marked as sky-lite's (``HOME_MARKER``). An existing
    one is used as it is, its mode never changed (``SKY_LITE_HOME=/tmp`` must not make /tmp private); but
    if other users can write to it and sky-lite did not create it, it is refused with ``UsageError`` and
    nothing is written, since they could plant or swap the state files in it. A directory that cannot be
    created (a read-only file system, a parent of another user's) raises ``StateUnwritableError``.
    """
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _uncreatable(home, exc) from exc
    try:
        home.mkdir(mode=0o700)
    except FileExistsError:
        _check_existing_home(home)
        return home
    except OSError as exc:
        raise _uncreatable(home, exc) from exc
    os.chmod(home, 0o700)  # mkdir's mode goes through the umask
    fd = os.open(home / HOME_MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as marker:
        marker.write("sky-lite created this state directory ($SKY_LITE_HOME).\n")
    return home


def _uncreatable(home: Path, exc: OSError) -> StateUnwritableError:
    return StateUnwritableError(f"cannot create the state directory {home} ({exc.strerror}); set SKY_LITE_HOME "
                                "to a directory you can write")


def _check_existing_home(home: Path) -> None:
    status = home.stat()
    if not stat.S_ISDIR(status.st_mode):
        raise UsageError(f"state directory {home} exists and is not a directory; set SKY_LITE_HOME to a directory")
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not _is_marked_home(home):
        raise UsageError(
            f"refusing to use {home} as the state directory: other users can write to it (mode "
            f"{stat.S_IMODE(status.st_mode):o}) and sky-lite did not create it. Set SKY_LITE_HOME to a path that "
            f"does not exist yet (sky-lite creates it, private to you), or make this one private with "
            f"`chmod go-w {home}`")


def _is_marked_home(home: Path) -> bool:
    """Whether ``home`` holds the marker sky-lite writes when it creates a state directory, as a file of ours:
    in a directory anyone can write, anyone could create a file of that name."""
    try:
        marker = (home / HOME_MARKER).lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(marker.st_mode) and marker.st_uid == os.getuid()


@dataclass
class StatementCounts:
    """What a stretch of store calls sent to the database (``Store.counting``): statements that read, statements
    that write, transactions begun, and rows inserted, changed or deleted."""

    reads: int = 0
    writes: int = 0
    transactions: int = 0
    rows_written: int = 0

    def add(self, sql: str) -> None:
        verb = sql.lstrip()[:7].upper()
        if verb.startswith(("SELECT", "PRAGMA")):
            self.reads += 1
        elif verb.startswith("BEGIN"):
            self.transactions += 1
        elif verb.startswith(("INSERT", "UPDATE", "DELETE", "REPLACE")):
            self.writes += 1


class Store:
    """Typed access to the state database, whichever engine holds it. Not thread-safe: one ``Store`` per
    thread."""

    def __init__(self, connection: StoreConnection, path: Path, *, read_only: str | None = None) -> None:
        """``read_only``: why writes are refused (the store was opened without write access), or None."""
        self._db = connection
        # The SQLite file; on PostgreSQL the state directory (the database is ``location``).
        self.path = path
        # What messages call the database: the file, or the URL without its password.
        self.location = connection.location
        # Opened without write access (``state.access``): writes are refused before they begin.
        self.read_only = read_only is not None
        self._read_only_refusal = read_only or ""
        # The services and autoscaler states of the last full read, by their raw rows: a row read again
        # unchanged is not decoded again (a pass reads every service's, 1,000 of each at fleet scale, when
        # one of them changed). The controller's pass keeps what it derives by the database's counter of
        # each service (``controller.settled``), never by these values' identity.
        self._services_by_row: dict[tuple[Any, ...], ServiceRecord] = {}
        self._autoscalers_by_row: dict[tuple[Any, ...], tuple[AutoscalerState, AutoscalerObservation]] = {}
        # The ``services_generation`` each was read at (None: never read, or a store without the counter).
        self._services_read_at: str | None = None
        self._autoscalers_read_at: str | None = None
        # Inside ``fenced``: the leases a controller pass writes under (None: writes are not fenced).
        self._fence: Fence | None = None

    @property
    def engine(self) -> str:
        """``sqlite`` or ``postgresql``: for what is shown (`controller status`), never for a decision."""
        return self._db.dialect.name

    @classmethod
    def open(cls, home: Path, *, create: bool = True) -> Store:
        """Open (creating and migrating when needed) the store of the state directory ``home``: the SQLite
        file in it, or the PostgreSQL database ``SKY_LITE_DB_URL`` or the home's ``db_url`` names
        (``state.dburl``; a bad URL is a ``UsageError``).

        With ``create=False`` a missing store (no file; a database without sky-lite's schema) raises
        ``NotFoundError`` instead: processes the controller starts (load balancers) must never create an
        empty store where a deleted one was.

        Others opening or writing the same store at that moment (two `serve up` on a fresh home, four
        controllers on a fresh database) are waited for, and one of them migrates. SQLite: raises
        ``StateDamagedError`` at once for a file that is not a readable SQLite database (and so does any later
        query that finds damage), ``StateBusyError`` when it stays locked beyond a few seconds. PostgreSQL:
        ``StateUnavailableError`` when the server cannot be reached or refuses the login, ``StateBusyError``
        past the lock timeout. ``UsageError`` for a home ``prepare_home`` refuses.

        A home this process cannot write (a read-only mount, another user's directory) is opened on SQLite as
        ``open_read_only`` opens it: its reads work, its writes raise ``StateUnwritableError``.
        """
        url = find_database_url(home, os.environ)
        if url is not None:
            return cls._open_postgresql(home, url, create=create)
        return cls.open_sqlite(home, create=create)

    @classmethod
    def open_sqlite(cls, home: Path, *, create: bool = True) -> Store:
        """``open`` of the SQLite file of ``home``, whatever ``SKY_LITE_DB_URL`` and ``db_url`` say (what a
        change of ``db_url`` checks first)."""
        path = home / DB_NAME
        if not create and not path.exists():
            raise NotFoundError(f"no state store at {path}")
        prepare_home(home)
        access = plan_store_access(observe_home(home, path))
        if access is not StoreAccess.READ_WRITE:
            return cls._open_read_only(path, access)
        connection = sqlite.connect(path)
        try:
            store = cls(connection, path)
            connection.prepare(store._migrate)
        except BaseException:
            connection.close()
            raise
        _record_controller_id(home, store.controller_id)
        return store

    @classmethod
    def _open_postgresql(cls, home: Path, url: DatabaseUrl, *, create: bool, read_only: bool = False) -> Store:
        from skyserve_lite.state import pg  # psycopg is loaded only for a store on PostgreSQL

        connection = pg.connect(url, read_only=read_only)
        try:
            refusal = (f"the state database {connection.location} was opened read-only: nothing was changed"
                       if read_only else None)
            store = cls(connection, home, read_only=refusal)
            if read_only:
                store._check_readable_schema(f"the state database {connection.location}, opened read-only,")
            elif not create and connection.read_schema_version() == 0:
                raise NotFoundError(f"no state store in {connection.location}")
            else:
                # The home still holds what is not in the database (blobs, secrets, logs, the controller's lock).
                prepare_home(home)
                connection.prepare(store._migrate)
        except BaseException:
            connection.close()
            raise
        return store

    @classmethod
    def open_read_only(cls, home: Path) -> Store:
        """Open the store of ``home`` for reading only, whatever the directory allows: what ``open`` does
        where this process cannot write it. Every read works; every write raises ``StateUnwritableError``
        naming the directory (or the database) before it begins. Creates no file: not the store, not
        SQLite's ``-shm`` index. Raises ``StateUnwritableError`` too where there is no store, or one that
        would need migrating."""
        url = find_database_url(home, os.environ)
        if url is not None:
            return cls._open_postgresql(home, url, create=False, read_only=True)
        path = home / DB_NAME
        found = dataclasses.replace(observe_home(home, path), writable=False)
        return cls._open_read_only(path, plan_store_access(found))

    @classmethod
    def _open_read_only(cls, path: Path, access: StoreAccess) -> Store:
        home = path.parent
        if access is StoreAccess.NO_DATABASE:
            raise StateUnwritableError(f"the state directory {home} is read-only and holds no state database "
                                       "yet: there is nothing to read, and nothing can be stored there")
        if access is StoreAccess.WAL_WITHOUT_INDEX:
            raise StateUnwritableError(
                f"the state directory {home} is read-only, and {path.name}-wal holds changes that cannot be read "
                f"without {path.name}-shm beside it: copy the directory somewhere writable and point "
                "SKY_LITE_HOME there")
        connection = sqlite.connect_read_only(path, access)
        try:
            store = cls(connection, path, read_only=f"the state directory {home} is read-only: nothing was "
                                                    "changed; make it writable, or run this where it is")
            store._check_readable_schema(f"the state directory {home} is read-only, and its database")
            connection.wait_when_busy()
        except BaseException:
            connection.close()
            raise
        return store

    def _check_readable_schema(self, where: str) -> None:
        """Refuse a read-only store whose schema this sky-lite cannot read until it is migrated; ``where`` says
        which database it is and why it is read-only."""
        version = self.schema_version
        if version < len(MIGRATIONS):
            raise StateUnwritableError(
                f"{where} (schema {version}) needs migrating to schema {len(MIGRATIONS)} before this sky-lite "
                "can read it: run a command that writes it once where it is writable")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def counting(self) -> Iterator[StatementCounts]:
        """Count the statements and rows written by this store's calls inside the ``with`` (the benchmark's
        and the tests' measure of what a pass costs the database; not for production paths)."""
        counts = StatementCounts()
        before = self._db.total_changes
        self._db.set_trace_callback(counts.add)
        try:
            yield counts
        finally:
            self._db.set_trace_callback(None)
            counts.rows_written = self._db.total_changes - before

    def is_current(self) -> bool:
        """False once the database file was deleted or replaced by another file since this store opened it:
        this connection then reads a state nobody else sees. Always True on PostgreSQL."""
        return self._db.is_current()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Read in one transaction: every query inside sees the same committed state (one WAL snapshot,
        PostgreSQL's repeatable read), not a write the controller committed between two of them. Only reads
        may run inside."""
        self._db.execute(self._db.dialect.begin_read)
        try:
            yield
        finally:
            if self._db.in_transaction:
                self._db.execute("COMMIT")

    @contextmanager
    def _write(self, services: Iterable[str] | Unfenced) -> Iterator[_Transaction]:
        """One write transaction, the only way any write reaches the database. ``services``: the services
        whose rows the transaction writes, which inside ``fenced`` are checked against the fence once, under
        the write lock, before the caller writes anything (``_Transaction.held``); ``UNFENCED`` for a write
        that names no service (the heartbeat, blob collection, the leases themselves) or that only the CLI
        and the load balancers make, never inside a pass's fence. A required argument, so that no write
        method can leave the fence out by forgetting it."""
        if self.read_only:
            raise StateUnwritableError(self._read_only_refusal)
        try:
            # Inside: on PostgreSQL the transaction has begun when the wait for the write lock times out.
            self._db.execute(self._db.dialect.begin_write)
            fence = self._fence
            if fence is None or isinstance(services, Unfenced):
                yield _Transaction(self._db, None)
            else:
                named = frozenset(services)
                held = _find_held(self._db, fence, named) if named else frozenset()
                lost = sorted(named - held)
                if lost:
                    log.warning("lease of %s lost to another controller (or never held): this pass's writes for "
                                "it are dropped", ", ".join(lost))
                yield _Transaction(self._db, held)
        except BaseException:
            if self._db.in_transaction:  # SQLite rolls back on its own after some errors (a full disk)
                self._db.execute("ROLLBACK")
            # What was read inside may be rows that never were, at a generation another commit will reach
            # again: read everything afresh.
            self._forget_reads()
            raise
        self._db.execute("COMMIT")

    def _forget_reads(self) -> None:
        """Read everything afresh next time (what was kept may be rows of a transaction rolled back)."""
        self._services_read_at = self._autoscalers_read_at = None

    @contextmanager
    def fenced(self, fence: Fence | None) -> Iterator[None]:
        """Inside, every write for a service commits only while ``fence.owner`` holds the service's lease with
        the token in ``fence``: each write transaction reads the owner's tokens under the write lock, so no
        takeover can commit between that read and the write, and drops the rows of services whose token
        moved on (a takeover, a release) or that the fence does not name. Writes that name no service (the
        heartbeat, blob collection) are not fenced. ``None``: nothing is fenced (a sole controller)."""
        self._fence = fence
        try:
            yield
        finally:
            self._fence = None

    def find_lost_leases(self, services: Collection[str], now: float) -> frozenset[str]:
        """Of ``services``, those the current fence (``fenced``) no longer covers at ``now``: another loop's
        now, released, or expired by this loop's clock. A service the fence does not name (the service of an
        orphan, gone from the database) is lost if it exists again: created, and so another loop's to claim.
        Empty outside ``fenced`` (nothing is fenced).

        The same token check as every fenced write's (``_find_held``), plus the expiry: the executor asks
        this just before cloud calls, which no transaction can fence. The token read here may move on before
        the call lands, but only after the lease expires (or is released), and a live loop's lease has at
        least 20 s left (TTL 30 s, renewal every 10 s). A loop that was paused long enough for its lease to
        lapse finds it expired here, taken over or not, and calls nothing."""
        fence = self._fence
        if fence is None or not services:
            return frozenset()
        named = frozenset(service for service in services if service in fence.tokens)
        held = _find_held(self._db, fence, named, now) if named else frozenset()
        return (named - held) | self.find_existing_services(set(services) - named)

    def find_existing_services(self, names: Collection[str]) -> frozenset[str]:
        """Of ``names``, the services that exist now: read by name (few) or with one read of the names."""
        if not names:
            return frozenset()
        if len(names) <= _FENCE_BY_NAME:
            rows = self._db.execute(f"SELECT name FROM services WHERE name IN ({', '.join('?' * len(names))})",
                                    tuple(names)).fetchall()
        else:
            rows = self._db.execute("SELECT name FROM services").fetchall()
        return frozenset(names).intersection(str(name) for (name,) in rows)

    def _migrate(self) -> None:
        """Bring the schema to ``MIGRATIONS``, in one transaction, and make the controller id if there is
        none. One process does it, whatever the number opening the store at once (``migrating``)."""
        if not self._db.needs_migration(len(MIGRATIONS)):
            return
        with self._db.migrating(), self._write(UNFENCED) as tx:
            db = tx.db
            current = db.read_schema_version()
            for number, migration in enumerate(MIGRATIONS[current:], start=current + 1):
                db.run_script(db.dialect.render(migration))
                db.write_schema_version(number)
            db.execute("INSERT INTO meta (key, value) VALUES ('controller_id', ?) ON CONFLICT (key) DO NOTHING",
                       (uuid.uuid4().hex[:12],))

    @property
    def schema_version(self) -> int:
        return self._db.read_schema_version()

    @property
    def controller_id(self) -> str:
        """A random id made once per store (state directory, or PostgreSQL database); cloud resources are
        tagged with it. On SQLite it is kept in the home's ``controller-id`` file too."""
        return str(self._db.execute("SELECT value FROM meta WHERE key = 'controller_id'").fetchone()[0])

    # --- services and versions ------------------------------------------------------------------
    def create_service(self, name: str, task: SubmittedTask, lb_port: int | Callable[[set[int]], int], now: float,
                       *, key: str | None = None, inputs: BoundInputs | None = None,
                       pinned: bool = False) -> ServiceRecord:
        """Store a new service with ``task`` as version 1. Raises ``StateConflictError`` if it exists, unless
        it was created by the submission ``key`` (a retry), which returns it. ``lb_port`` is the endpoint's
        port, or a function choosing it from the ports other services have, called inside the write
        transaction that stores it (so two creations at once cannot choose the same port); what it raises
        propagates and nothing is stored."""
        with self._write(UNFENCED) as tx:  # the CLI's
            db = tx.db
            if key is not None and _find_submission(db, key) == (name, 1):
                return self.get_service(name)
            if db.execute("SELECT 1 FROM services WHERE name = ?", (name,)).fetchone():
                raise StateConflictError(
                    f"service {name!r} already exists; change it with `sky-lite serve update {name} TASK.yaml`"
                )
            if callable(lb_port):
                lb_port = lb_port({row[0] for row in db.execute("SELECT lb_port FROM services")})
            elif db.execute("SELECT 1 FROM services WHERE lb_port = ?", (lb_port,)).fetchone():
                raise StateConflictError(f"port {lb_port} is already the endpoint of another service")
            db.execute(
                "INSERT INTO services (name, current_version, status, lb_port, lb_policy, created_at, lb_port_pinned)"
                " VALUES (?, 1, ?, ?, ?, ?, ?)",
                (name, ServiceStatus.CONTROLLER_INIT.value, lb_port,
                 task.spec.service.lb_policy, now, int(pinned)),
            )
            self._insert_version(db, name, 1, task, "initial", now, inputs=inputs)
            if key is not None:
                db.execute("INSERT INTO submissions (key, service, version) VALUES (?, ?, 1)", (key, name))
        return self.get_service(name)

    def find_submission(self, key: str) -> tuple[str, int] | None:
        """The service and version the submission ``key`` stored, if it did."""
        return _find_submission(self._db, key)

    def _insert_version(self, db: StoreConnection, name: str, version: int, task: SubmittedTask,
                        mode: str, now: float, note: str | None = None, reuse_identical_files: bool = False, *,
                        inputs: BoundInputs | None = None) -> None:
        files = task.spec.files
        spec_json = parsed_spec_json(task.spec)
        if files is not None:
            db.execute("INSERT INTO snapshots (digest, manifest_json, size) VALUES (?, ?, ?)"
                       " ON CONFLICT (digest) DO NOTHING",
                       (files.digest, json.dumps(files.to_json(), sort_keys=True, separators=(",", ":")),
                        files.size))
        db.execute(
            "INSERT INTO versions (service, version, text, source, spec_json, mode, created_at, note, files_digest,"
            " reuse_identical_files, inputs_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, version, task.text, task.source, spec_json, mode, now, note,
             files.digest if files is not None else None, int(reuse_identical_files),
             inputs.to_json() if inputs is not None else None),
        )

    def add_version(self, name: str, task: SubmittedTask, mode: str, now: float, *,
                    expect_version: int | None = None, note: str | None = None, reuse_identical_files: bool = False,
                    keep_snapshot_versions: int = 0, key: str | None = None,
                    inputs: BoundInputs | None = None, canary: CanaryStart | None = None) -> VersionRecord:
        """Store ``task`` as the next version of ``name`` and make it current, in one transaction; with
        ``canary``, the rollout it starts with is stored in that same transaction (both or neither).

        Concurrent callers are serialized by the write lock: each gets its own number, in order.
        Raises ``StateConflictError`` (nothing stored) when ``expect_version`` is given and is not the
        current version, or when the service is being taken down. With ``keep_snapshot_versions`` N > 0,
        the snapshots of versions older than the newest N expire (never one that a replica row still runs),
        and the controller is asked to collect what no version needs any more. A ``key`` that already stored
        a version of ``name`` (a retried submission) returns that version and stores nothing.
        """
        with self._write(UNFENCED) as tx:  # the CLI's
            db = tx.db
            done = _find_submission(db, key) if key is not None else None
            if done is not None and done[0] == name:
                return self.get_version(name, done[1])
            row = db.execute("SELECT current_version, deleting FROM services WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFoundError(f"no service named {name!r}; see `sky-lite serve status`")
            current, deleting = int(row[0]), bool(row[1])
            if deleting:
                raise StateConflictError(f"service {name!r} is shutting down; it cannot be updated")
            if expect_version is not None and current != expect_version:
                raise StateConflictError(
                    f"service {name!r} is at version {current}, not {expect_version}: someone else updated "
                    f"it; see `sky-lite serve history {name}` and plan again")
            version = current + 1
            self._insert_version(db, name, version, task, mode, now, note, reuse_identical_files, inputs=inputs)
            db.execute("UPDATE services SET current_version = ? WHERE name = ?", (version, name))
            if canary is not None:
                _upsert_canary(db, name, canary.state_of(version), canary.percent, clear_command=True)
            if key is not None:
                db.execute("INSERT INTO submissions (key, service, version) VALUES (?, ?, ?) ON CONFLICT (key)"
                           " DO UPDATE SET service = excluded.service, version = excluded.version",
                           (key, name, version))
            if keep_snapshot_versions > 0:
                expired = db.execute(
                    "UPDATE versions SET files_expired = 1 WHERE service = ? AND version <= ?"
                    " AND files_digest IS NOT NULL AND files_expired = 0"
                    " AND version NOT IN (SELECT version FROM replicas WHERE service = ?)",
                    (name, version - keep_snapshot_versions, name)).rowcount
                if expired:
                    db.execute(_SET_GC_PENDING)
        return self.get_version(name, version)

    # --- snapshots -------------------------------------------------------------------------------
    def find_needed_blobs(self) -> set[str]:
        """Every blob digest a stored, unexpired snapshot needs; forgets snapshot rows no version uses."""
        with self._write(UNFENCED) as tx:
            db = tx.db
            db.execute("DELETE FROM snapshots WHERE digest NOT IN"
                       " (SELECT files_digest FROM versions WHERE files_digest IS NOT NULL AND files_expired = 0)")
            rows = db.execute("SELECT manifest_json FROM snapshots").fetchall()
        return {digest for (text,) in rows for digest in TaskFiles.from_json(json.loads(text)).blob_digests()}

    def find_needed_secrets(self) -> set[str]:
        """Every secret digest a stored version names."""
        rows = self._db.execute("SELECT inputs_json FROM versions WHERE inputs_json IS NOT NULL").fetchall()
        return {digest for (text,) in rows for _, digest in BoundInputs.from_json(text).secrets}

    def set_gc_pending(self, pending: bool) -> None:
        with self._write(UNFENCED) as tx:  # no service's rows, or the load balancers'
            db = tx.db
            if pending:
                db.execute(_SET_GC_PENDING)
            else:
                db.execute("DELETE FROM meta WHERE key = 'gc_pending'")

    @property
    def gc_pending(self) -> bool:
        return self._db.execute("SELECT 1 FROM meta WHERE key = 'gc_pending'").fetchone() is not None

    # --- the controller's heartbeat ----------------------------------------------------------------
    def record_pass(self, now: float) -> None:
        """A controller pass completed at ``now`` (with everything it decided written)."""
        with self._write(UNFENCED) as tx:  # no service's rows, or the load balancers'
            db = tx.db
            db.execute("INSERT INTO meta (key, value) VALUES ('pass_completed_at', ?)"
                       " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (repr(now),))

    @property
    def last_pass_at(self) -> float | None:
        """When a controller pass last completed; None if none ever did."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'pass_completed_at'").fetchone()
        return float(row[0]) if row else None

    def find_service(self, name: str) -> ServiceRecord | None:
        row = self._db.execute(f"SELECT {_SERVICE_SELECT} FROM services WHERE name = ?", (name,)).fetchone()
        return _service(row) if row else None

    def get_service(self, name: str) -> ServiceRecord:
        service = self.find_service(name)
        if service is None:
            raise NotFoundError(f"no service named {name!r}; see `sky-lite serve status`")
        return service

    def list_services(self) -> list[ServiceRecord]:
        """Every service, by name. Read from the database only when a service or autoscaler row changed since
        this store last read them (``services_generation``, moved by triggers); each unchanged row is the
        value it was."""
        generation = self._services_generation()
        if generation is None or generation != self._services_read_at:
            rows = self._db.execute(f"SELECT {_SERVICE_SELECT} FROM services ORDER BY name").fetchall()
            known = self._services_by_row
            self._services_by_row = {row: known.get(row) or _service(row) for row in rows}  # names are unique
            self._services_read_at = generation
        return list(self._services_by_row.values())

    def _services_generation(self) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'services_generation'").fetchone()
        return None if row is None else str(row[0])

    def used_lb_ports(self) -> set[int]:
        return {row[0] for row in self._db.execute("SELECT lb_port FROM services")}

    def get_version(self, name: str, version: int) -> VersionRecord:
        row = self._db.execute(
            f"SELECT {_VERSION_SELECT} WHERE v.service = ? AND v.version = ?", (name, version)).fetchone()
        if row is None:
            raise NotFoundError(f"service {name!r} has no version {version}")
        return _version(row)

    def find_version(self, name: str, version: int) -> VersionRecord | None:
        """The stored version, or None when there is no such version."""
        try:
            return self.get_version(name, version)
        except NotFoundError:
            return None

    def list_current_versions(self) -> dict[str, VersionRecord]:
        """Every service's current version, by service name, in one query."""
        rows = self._db.execute(
            f"SELECT {_VERSION_SELECT} JOIN services c ON c.name = v.service AND c.current_version = v.version"
        ).fetchall()
        return {record.service: record for record in map(_version, rows)}

    def list_versions(self, name: str) -> list[VersionRecord]:
        rows = self._db.execute(
            f"SELECT {_VERSION_SELECT} WHERE v.service = ? ORDER BY v.version", (name,)).fetchall()
        return [_version(row) for row in rows]

    def mark_deleting(self, names: Sequence[str]) -> None:
        """Ask the controller to take these services down (idempotent)."""
        with self._write(UNFENCED) as tx:  # the CLI's
            tx.db.executemany("UPDATE services SET deleting = 1 WHERE name = ?", [(name,) for name in names])

    def request_replica_termination(self, service: str, replica_id: int, now: float) -> None:
        """Ask the controller to terminate one replica (idempotent: the first request's time stays)."""
        with self._write(UNFENCED) as tx:  # the CLI's
            tx.db.execute("INSERT INTO replica_terminations (service, replica_id, requested_at) VALUES (?, ?, ?)"
                       " ON CONFLICT (service, replica_id) DO NOTHING", (service, replica_id, now))

    def list_replica_terminations(self) -> dict[tuple[str, int], float]:
        """Every pending request: (service, replica id) -> when it was asked for."""
        rows = self._db.execute("SELECT service, replica_id, requested_at FROM replica_terminations")
        return {(str(row[0]), int(row[1])): float(row[2]) for row in rows.fetchall()}

    def delete_replica_terminations(self, keys: Sequence[tuple[str, int]]) -> None:
        """Forget requests the executor has acted on (or whose replica is gone)."""
        with self._write(service for service, _ in keys) as tx:
            tx.db.executemany("DELETE FROM replica_terminations WHERE service = ? AND replica_id = ?",
                              tx.keep(keys, _first))

    def set_service_status(self, name: str, status: ServiceStatus, reason: str | None) -> None:
        self.set_service_statuses([(name, status, reason)])

    def set_service_statuses(self, changes: Sequence[tuple[str, ServiceStatus, str | None]]) -> None:
        """Each (service, status, reason), in one transaction: a pass that moves 1,000 services' statuses
        (an update of every service) writes them at once."""
        if not changes:
            return
        with self._write(name for name, _, _ in changes) as tx:
            tx.db.executemany("UPDATE services SET status = ?, status_reason = ? WHERE name = ?",
                              [(status.value, reason, name) for name, status, reason in tx.keep(changes, _first)])

    def set_lb_port(self, name: str, port: int) -> None:
        """Move the service's endpoint to ``port``. Raises ``StateConflictError`` if another service has it."""
        with self._write([name]) as tx:
            db = tx.db
            if not tx.holds(name):
                return
            other = db.execute("SELECT name FROM services WHERE lb_port = ? AND name != ?", (port, name)).fetchone()
            if other is not None:
                raise StateConflictError(f"port {port} is already the endpoint of service {other[0]!r}")
            db.execute("UPDATE services SET lb_port = ? WHERE name = ?", (port, name))

    def set_load_balancer(self, name: str, pid: int | None, policy: str) -> None:
        with self._write([name]) as tx:
            if not tx.holds(name):
                return
            tx.db.execute("UPDATE services SET lb_pid = ?, lb_policy = ? WHERE name = ?", (pid, policy, name))

    def delete_service(self, name: str) -> None:
        """Forget a service: its versions, replicas, request counts and events."""
        with self._write([name]) as tx:
            db = tx.db
            if not tx.holds(name):
                return
            db.execute("DELETE FROM request_counts WHERE service = ?", (name,))
            db.execute("DELETE FROM version_counts WHERE service = ?", (name,))
            db.execute("DELETE FROM lb_reports WHERE service = ?", (name,))
            db.execute("DELETE FROM events WHERE service = ?", (name,))
            db.execute("DELETE FROM submissions WHERE service = ?", (name,))
            db.execute("DELETE FROM replica_terminations WHERE service = ?", (name,))
            db.execute("DELETE FROM services WHERE name = ?", (name,))  # and its replicas, by cascade

    # --- replicas --------------------------------------------------------------------------------
    def list_replicas(self, service: str | None = None) -> list[ReplicaRecord]:
        """The replicas of ``service`` (every service's, ordered by service, when None: ``all_replicas``)."""
        if service is None:
            return list(self.all_replicas())
        columns = ", ".join(_REPLICA_COLUMNS)
        rows = self._db.execute(
            f"SELECT {columns} FROM replicas WHERE service = ? ORDER BY replica_id", (service,))
        return [_replica(row) for row in rows.fetchall()]

    def all_replicas(self) -> tuple[ReplicaRecord, ...]:
        """Every replica, ordered by service and replica id (one read; a controller pass reads only the
        services whose change counter moved: ``list_replicas_of``)."""
        columns = ", ".join(_REPLICA_COLUMNS)
        rows = self._db.execute(f"SELECT {columns} FROM replicas ORDER BY service, replica_id").fetchall()
        return tuple([_replica(row) for row in rows])

    def count_replicas_by_status(self) -> dict[tuple[str, int, ReplicaStatus], int]:
        """How many replicas each (service, version, status) has, in one ``GROUP BY`` that decodes no replica
        row (the metrics endpoint counts them at every scrape); combinations without any are left out."""
        rows = self._db.execute("SELECT service, version, status, COUNT(*) FROM replicas"
                                " GROUP BY service, version, status").fetchall()
        return {(str(service), int(version), REPLICA_STATUS_BY_VALUE[status]): int(count)
                for service, version, status, count in rows}

    def list_service_generations(self) -> dict[str, int]:
        """Every service's change counter, by name: moved by triggers at every write to a row a controller
        pass reads of the service (its row, replicas, versions, autoscaler state, termination requests,
        canary rollout), whoever writes it (``schema``). A name may outlive its service (it counts on if one
        is created under it again)."""
        rows = self._db.execute("SELECT service, generation FROM service_changes").fetchall()
        return {str(service): int(generation) for service, generation in rows}

    def list_replicas_of(self, services: Collection[str]) -> dict[str, tuple[ReplicaRecord, ...]]:
        """The replicas of each of ``services`` by replica id (an empty tuple for one without any), read by
        name when they are few, else with one read of every row."""
        if not services:
            return {}
        columns = ", ".join(_REPLICA_COLUMNS)
        if len(services) <= _FENCE_BY_NAME:
            rows = self._db.execute(f"SELECT {columns} FROM replicas WHERE service IN"
                                    f" ({', '.join('?' * len(services))}) ORDER BY service, replica_id",
                                    tuple(services)).fetchall()
        else:
            rows = self._db.execute(f"SELECT {columns} FROM replicas ORDER BY service, replica_id").fetchall()
        found: dict[str, list[ReplicaRecord]] = {name: [] for name in services}
        for row in rows:
            listed = found.get(row[0])
            if listed is not None:
                listed.append(_replica(row))
        return {name: tuple(records) for name, records in found.items()}

    def add_replicas(self, service: str, count: int, template: ReplicaRecord) -> list[ReplicaRecord]:
        """Record the intent to launch ``count`` replicas like ``template``, with fresh ids.

        Ids come from the service's counter and are never reused, even after rows are deleted.
        """
        (added,) = self.add_replica_batches([(service, count, template)])
        if added is None:
            raise NotFoundError(f"no service named {service!r}")
        return added

    def add_replica_batches(self, batches: Sequence[tuple[str, int, ReplicaRecord]]
                            ) -> list[list[ReplicaRecord] | None]:
        """``add_replicas`` of each (service, count, template), all in one transaction (a launch pass
        records every intent at once: a transaction per batch was most of launching 1,000 services of 10);
        None for a service that no longer exists."""
        added: list[list[ReplicaRecord] | None] = []
        with self._write(service for service, _, _ in batches) as tx:
            db = tx.db
            for service, count, template in batches:
                row = db.execute("SELECT next_replica_id FROM services WHERE name = ?", (service,)).fetchone()
                if row is None or not tx.holds(service):
                    added.append(None)
                    continue
                first = int(row[0])
                added.append([replace_replica(template, service=service, replica_id=first + offset)
                              for offset in range(count)])
                db.execute("UPDATE services SET next_replica_id = ? WHERE name = ?", (first + count, service))
            _put_replicas(db, [record for records in added if records for record in records])
        return added

    def put_replicas(self, records: Sequence[ReplicaRecord],
                     active_versions: Mapping[str, tuple[int, ...]] | None = None, *,
                     skip_deleted_services: bool = False) -> None:
        """Write whole replica rows (insert or replace) and services' active versions in one transaction,
        so a load balancer never sees replicas leave traffic before the versions replacing them arrive.
        ``skip_deleted_services``: leave out the rows of services that no longer exist (else writing one
        fails the whole transaction)."""
        if not records and not active_versions:
            return
        with self._write([*{r.service for r in records}, *(active_versions or {})]) as tx:
            db = tx.db
            records = tx.keep(records, _service_of)
            active_versions = dict(tx.keep((active_versions or {}).items(), _first))
            if skip_deleted_services and records:
                existing = {row[0] for row in db.execute("SELECT name FROM services")}
                records = [r for r in records if r.service in existing]
            _put_replicas(db, records)
            for name, versions in (active_versions or {}).items():
                db.execute("UPDATE services SET active_versions = ? WHERE name = ?", (json.dumps(list(versions)), name))

    def delete_replicas(self, keys: Sequence[tuple[str, int]]) -> None:
        if not keys:
            return
        with self._write(service for service, _ in keys) as tx:
            db = tx.db
            keys = tx.keep(keys, _first)
            db.executemany("DELETE FROM replicas WHERE service = ? AND replica_id = ?", keys)

    # --- leases (several controllers on one database: controller.leases) ----------------------------
    def list_leases(self) -> list[Lease]:
        """One lease per service, by name; token 0 and no owner for a service never claimed. The services are
        ``list_services``'s (read only when one changed): a pass reads the services table once, not again
        joined with the leases."""
        rows = {str(row[0]): row for row in self._db.execute(
            "SELECT service, owner, expires_at, token FROM service_leases").fetchall()}
        never = (None, None, 0.0, 0)
        return [Lease(service.name, owner, float(expires), int(token))
                for service in self.list_services() for _, owner, expires, token in (rows.get(service.name, never),)]

    def list_controllers(self) -> dict[str, float]:
        """Every loop's last renewal, by loop id (live or not: ``controller.leases`` decides)."""
        rows = self._db.execute("SELECT loop_id, renewed_at FROM controllers").fetchall()
        return {str(loop_id): float(at) for loop_id, at in rows}

    def apply_leases(self, me: str, host: str, plan: LeasePlan, now: float, ttl_seconds: float) -> dict[str, int]:
        """Apply ``me``'s lease plan in one transaction and return what ``me`` holds after it (service ->
        token). A claim takes its lease only if the row still has the token it was read with (a claim of a
        service never claimed: only if no row appeared meanwhile), incrementing it; a renewal or a release
        changes the row only while ``me`` still owns it with that token. What another loop changed meanwhile
        is left as it is: the returned holdings say who won."""
        expires = now + ttl_seconds
        with self._write(UNFENCED) as tx:  # compare-and-set on the tokens themselves
            db = tx.db
            if plan.heartbeat:
                db.execute("INSERT INTO controllers (loop_id, host, started_at, renewed_at) VALUES (?, ?, ?, ?)"
                           " ON CONFLICT (loop_id) DO UPDATE SET renewed_at = excluded.renewed_at",
                           (me, host, now, now))
            # One statement for every first claim and one for every takeover (executemany), each row still
            # compared with the token it was read with.
            first = [(lease.service, me, expires, lease.service) for lease in plan.claims if lease.token == 0]
            if first:
                db.executemany("INSERT INTO service_leases (service, owner, expires_at, token)"
                               " SELECT ?, ?, ?, 1 WHERE EXISTS (SELECT 1 FROM services WHERE name = ?)"
                               " ON CONFLICT (service) DO NOTHING", first)
            taken = [(me, expires, lease.service, lease.token) for lease in plan.claims if lease.token != 0]
            if taken:
                db.executemany("UPDATE service_leases SET owner = ?, expires_at = ?, token = token + 1"
                               " WHERE service = ? AND token = ?", taken)
            if plan.renewals:
                db.executemany("UPDATE service_leases SET expires_at = ? WHERE service = ? AND owner = ? AND token = ?",
                               [(expires, lease.service, me, lease.token) for lease in plan.renewals])
            if plan.releases:
                db.executemany("UPDATE service_leases SET owner = NULL, expires_at = 0 WHERE service = ? AND owner = ?"
                               " AND token = ?", [(lease.service, me, lease.token) for lease in plan.releases])
            rows = db.execute("SELECT service, token FROM service_leases WHERE owner = ? AND expires_at > ?",
                              (me, now)).fetchall()
        return {str(service): int(token) for service, token in rows}

    def list_controller_rows(self) -> list[ControllerRow]:
        """Every controller (loop) sharing this database, live or not, by loop id, with the services whose
        leases it holds (unexpired or not: ``controller.leases`` decides liveness)."""
        rows = self._db.execute("SELECT loop_id, host, started_at, renewed_at FROM controllers ORDER BY loop_id"
                                ).fetchall()
        owned: dict[str, list[str]] = {}
        for service, owner in self._db.execute(
                "SELECT service, owner FROM service_leases WHERE owner IS NOT NULL ORDER BY service").fetchall():
            owned.setdefault(str(owner), []).append(str(service))
        return [ControllerRow(loop_id=str(loop_id), host=str(host), started_at=float(started),
                              renewed_at=float(renewed), services=tuple(owned.get(str(loop_id), ())))
                for loop_id, host, started, renewed in rows]

    def forget_controller(self, loop_id: str) -> None:
        """Remove a loop's controller row (it stopped cleanly; its leases were released first)."""
        with self._write(UNFENCED) as tx:
            tx.db.execute("DELETE FROM controllers WHERE loop_id = ?", (loop_id,))

    # --- events ----------------------------------------------------------------------------------
    def add_events(self, events: Sequence[tuple[float, str, int | None, str, str]]) -> None:
        """Append ``(time, service, replica_id, kind, message)`` events."""
        if not events:
            return
        with self._write(event[1] for event in events) as tx:
            tx.db.executemany(
                "INSERT INTO events (time, service, replica_id, kind, message) VALUES (?, ?, ?, ?, ?)",
                tx.keep(events, _second))

    def list_events(self, service: str, limit: int = 100) -> list[EventRecord]:
        rows = self._db.execute(
            "SELECT event_id, time, service, replica_id, kind, message FROM events WHERE service = ?"
            " ORDER BY event_id DESC LIMIT ?", (service, limit)).fetchall()
        return [EventRecord(*row) for row in reversed(rows)]

    # --- load balancer ---------------------------------------------------------------------------
    def get_lb_view(self, service: str) -> LbView | None:
        """Ready replica urls of the service and its policy; None once the service is gone or deleting."""
        row = self._db.execute(
            "SELECT lb_policy, deleting, active_versions FROM services WHERE name = ?", (service,)).fetchone()
        if row is None or row[1]:
            return None
        rows = self._db.execute(
            "SELECT url, version, accelerator FROM replicas WHERE service = ? AND status = ? AND url IS NOT NULL"
            " ORDER BY replica_id", (service, ReplicaStatus.READY.value)).fetchall()
        active = None if row[2] is None else set(json.loads(row[2]))
        ready = [(url, version, accelerator) for url, version, accelerator in rows
                 if active is None or version in active]
        # A canary rollout of the current version still stepping splits the requests between versions
        # (``lb.split``); one an update or a rollback overtook splits nothing.
        canary = self._db.execute(
            "SELECT c.version, c.percent FROM canary_rollouts c JOIN services s ON s.name = c.service"
            " WHERE c.service = ? AND c.phase = ? AND c.version = s.current_version",
            (service, CanaryPhase.STEPPING.value)).fetchone()
        return LbView(ready_urls=tuple(url for url, _, _ in ready), policy=row[0],
                      accelerators=tuple(accelerator for _, _, accelerator in ready),
                      versions=tuple(version for _, version, _ in ready),
                      split=() if canary is None else ((int(canary[0]), int(canary[1])),))

    def record_request_counts(self, service: str, counts: Mapping[int, int],
                              keep_seconds: int = REQUEST_COUNTS_KEEP_SECONDS) -> None:
        """Add per-second request counts, and drop counts older than ``keep_seconds`` before the newest."""
        if not counts:
            return
        with self._write(UNFENCED) as tx:  # no service's rows, or the load balancers'
            db = tx.db
            db.executemany(
                "INSERT INTO request_counts (service, second, count) VALUES (?, ?, ?)"
                " ON CONFLICT (service, second) DO UPDATE SET count = request_counts.count + excluded.count",
                [(service, second, count) for second, count in counts.items()])
            db.execute("DELETE FROM request_counts WHERE service = ? AND second < ?",
                       (service, max(counts) - keep_seconds))

    def record_lb_report(self, service: str, report: LbReport, lb: str = "") -> None:
        """Replace the report of the service's load balancer ``lb`` (its host and address: every controller
        host runs one per service; the readers sum them)."""
        with self._write(UNFENCED) as tx:  # no service's rows, or the load balancers'
            db = tx.db
            db.execute(
                "INSERT INTO lb_reports (service, lb, reported_at, waiting, in_flight_json) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (service, lb) DO UPDATE SET reported_at = excluded.reported_at,"
                " waiting = excluded.waiting, in_flight_json = excluded.in_flight_json",
                (service, lb, report.reported_at, report.waiting, json.dumps(dict(report.in_flight), sort_keys=True)))

    def record_lb_endpoint(self, endpoint: LbEndpoint) -> None:
        """Record what a load balancer bound (replacing its host's earlier row); nothing when the service is
        gone (its load balancer is stopping)."""
        with self._write(UNFENCED) as tx:  # the load balancer's
            tx.db.execute(
                "INSERT INTO lb_endpoints (service, host, address, pid, bound_at)"
                " SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM services WHERE name = ?)"
                " ON CONFLICT (service, host) DO UPDATE SET address = excluded.address, pid = excluded.pid,"
                " bound_at = excluded.bound_at",
                (endpoint.service, endpoint.host, endpoint.address, endpoint.pid, endpoint.bound_at,
                 endpoint.service))

    def delete_lb_endpoint(self, service: str, host: str, pid: int) -> None:
        """Forget the row a load balancer recorded, if it is still that process's (a successor's stays)."""
        with self._write(UNFENCED) as tx:  # the load balancer's, as it stops
            tx.db.execute("DELETE FROM lb_endpoints WHERE service = ? AND host = ? AND pid = ?", (service, host, pid))

    def list_lb_endpoints(self, service: str) -> list[LbEndpoint]:
        """What the service's load balancers recorded, one per host, by host."""
        return list(self.list_lb_endpoints_of((service,))[service])

    def list_lb_endpoints_of(self, services: Collection[str]) -> dict[str, tuple[LbEndpoint, ...]]:
        """What the load balancers of each of ``services`` recorded, one per host, by host (an empty tuple for
        one without any), in one query: by name when they are few, else every row (as ``list_replicas_of``).
        `serve status` of 100 services read them with 100 queries, one per service."""
        if not services:
            return {}
        sql = "SELECT service, host, address, pid, bound_at FROM lb_endpoints"
        if len(services) <= _FENCE_BY_NAME:
            rows = self._db.execute(f"{sql} WHERE service IN ({', '.join('?' * len(services))})"
                                    " ORDER BY service, host", tuple(services)).fetchall()
        else:
            rows = self._db.execute(f"{sql} ORDER BY service, host").fetchall()
        found: dict[str, list[LbEndpoint]] = {name: [] for name in services}
        for row in rows:
            listed = found.get(row[0])
            if listed is not None:
                listed.append(LbEndpoint(*row))
        return {name: tuple(endpoints) for name, endpoints in found.items()}

    def list_lb_reports(self) -> dict[str, LbReport]:
        """Every service's load, its load balancers' latest reports summed (``sum_lb_reports``), in one query
        (a pass reads them all)."""
        rows = self._db.execute("SELECT service, reported_at, waiting, in_flight_json FROM lb_reports").fetchall()
        by_service: dict[str, list[LbReport]] = {}
        for service, reported_at, waiting, in_flight in rows:
            by_service.setdefault(str(service), []).append(_lb_report(reported_at, waiting, in_flight))
        return {service: sum_lb_reports(reports) for service, reports in by_service.items()}

    def list_autoscaler_states(self) -> dict[str, tuple[AutoscalerState, AutoscalerObservation]]:
        """Every service's autoscaler state, in one query; not even that while ``services_generation`` stands
        (as ``list_services``)."""
        generation = self._services_generation()
        if generation is None or generation != self._autoscalers_read_at:
            rows = self._db.execute(
                "SELECT service, version, target, upscale_count, downscale_count, last_decision_at, observed_json"
                " FROM autoscaler_state").fetchall()
            known = self._autoscalers_by_row
            self._autoscalers_by_row = {row: known.get(row) or _autoscaler(row[1:]) for row in rows}
            self._autoscalers_read_at = generation
        return {row[0]: decoded for row, decoded in self._autoscalers_by_row.items()}

    def count_requests_since(self, since_second: int) -> dict[str, int]:
        """Requests per service from ``since_second`` on, in one query over the window's rows only
        (``request_counts_by_second``); services without any are left out."""
        rows = self._db.execute(
            "SELECT service, SUM(count) FROM request_counts WHERE second >= ? GROUP BY service",
            (since_second,)).fetchall()
        return {str(service): int(count) for service, count in rows}

    def get_lb_report(self, service: str) -> LbReport | None:
        """The service's load balancers' latest reports summed (``sum_lb_reports``); None before any."""
        rows = self._db.execute("SELECT reported_at, waiting, in_flight_json FROM lb_reports WHERE service = ?",
                                (service,)).fetchall()
        return sum_lb_reports([_lb_report(*row) for row in rows]) if rows else None

    def get_autoscaler_state(self, service: str) -> tuple[AutoscalerState, AutoscalerObservation] | None:
        row = self._db.execute(
            "SELECT version, target, upscale_count, downscale_count, last_decision_at, observed_json"
            " FROM autoscaler_state WHERE service = ?", (service,)).fetchone()
        if row is None:
            return None
        return _autoscaler(row)

    def put_autoscaler_states(self, states: Sequence[tuple[str, AutoscalerState, AutoscalerObservation]]) -> None:
        if not states:
            return
        with self._write(name for name, _, _ in states) as tx:
            states = tx.keep(states, _first)
            tx.db.executemany(
                "INSERT INTO autoscaler_state (service, version, target, upscale_count, downscale_count,"
                " last_decision_at, observed_json) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (service) DO UPDATE SET"
                " version = excluded.version, target = excluded.target, upscale_count = excluded.upscale_count,"
                " downscale_count = excluded.downscale_count, last_decision_at = excluded.last_decision_at,"
                " observed_json = excluded.observed_json",
                [(name, state.version, state.target, state.upscale_count, state.downscale_count,
                  state.last_decision_at, json.dumps(dataclasses.asdict(observed), sort_keys=True))
                 for name, state, observed in states])

    def count_requests(self, service: str, since_second: int) -> int:
        row = self._db.execute(
            "SELECT COALESCE(SUM(count), 0) FROM request_counts WHERE service = ? AND second >= ?",
            (service, since_second)).fetchone()
        return int(row[0])

    def count_requests_by_minute(self, service: str, since_minute: int) -> dict[int, int]:
        """Requests per minute (minutes since the epoch) from ``since_minute`` on; minutes without any are
        left out."""
        rows = self._db.execute(
            "SELECT second / 60, SUM(count) FROM request_counts WHERE service = ? AND second >= ? GROUP BY second / 60",
            (service, since_minute * 60)).fetchall()
        return {int(minute): int(count) for minute, count in rows}

    # --- canary rollouts --------------------------------------------------------------------------
    def put_canary(self, service: str, state: CanaryState, percent: int, *, done_command: Command | None = None,
                   fenced: bool = True) -> None:
        """Store the canary rollout of ``service`` (one row per service: a later version's replaces an earlier
        one's) and the new version's share of the traffic. ``done_command``: the command the caller acted on,
        forgotten now unless a person asked another since. ``fenced`` False: the CLI's write starting a
        rollout (it keeps no command)."""
        with self._write([service] if fenced else UNFENCED) as tx:
            if not tx.holds(service):
                return
            db = tx.db
            if db.execute("SELECT 1 FROM services WHERE name = ?", (service,)).fetchone() is None:
                return  # gone meanwhile
            _upsert_canary(db, service, state, percent, clear_command=not fenced)
            if fenced and done_command is not None:
                db.execute("UPDATE canary_rollouts SET command = NULL WHERE service = ? AND command = ?",
                           (service, done_command.value))

    def add_rollback_version(self, name: str, from_version: int, to_version: int, note: str, now: float
                             ) -> int | None:
        """Make a copy of version ``to_version`` (its text, inputs and files as stored) the next version of
        ``name``, rolled out as a rolling update, with ``note``: the controller's rollback of a canary judged
        bad. Only while ``from_version`` is current (else None, nothing stored: someone updated meanwhile, or
        this already ran); the new version's number otherwise. Its replicas of ``to_version`` are then reused
        (same config) and the canary's drained as outdated ones."""
        with self._write([name]) as tx:
            db = tx.db
            row = db.execute("SELECT current_version, deleting FROM services WHERE name = ?", (name,)).fetchone()
            if not tx.holds(name) or row is None or int(row[0]) != from_version or row[1]:
                return None
            version = from_version + 1
            db.execute(
                "INSERT INTO versions (service, version, text, source, spec_json, mode, created_at, note, files_digest,"
                " files_expired, reuse_identical_files, inputs_json) SELECT service, ?, text, source, spec_json,"
                " 'rolling', ?, ?, files_digest, files_expired, reuse_identical_files, inputs_json FROM versions"
                " WHERE service = ? AND version = ?", (version, now, note, name, to_version))
            db.execute("UPDATE services SET current_version = ? WHERE name = ?", (version, name))
        return version

    def request_canary_command(self, service: str, command: Command) -> None:
        """A person's `serve rollout NAME COMMAND`, for the controller's next pass (a later one replaces it).
        Raises ``NotFoundError`` when the service has no canary rollout."""
        with self._write(UNFENCED) as tx:  # the CLI's
            changed = tx.db.execute("UPDATE canary_rollouts SET command = ? WHERE service = ?",
                                    (command.value, service)).rowcount
        if not changed:
            raise NotFoundError(f"service {service!r} has no canary rollout; see `sky-lite serve status {service}`")

    def list_canaries(self, service: str | None = None) -> dict[str, StoredCanary]:
        """Every service's stored canary rollout (or only ``service``'s), in one query."""
        sql = ("SELECT service, version, settings_json, phase, step, window_start, extensions, paused, verdict,"
               " percent, command FROM canary_rollouts")
        rows = (self._db.execute(sql + " WHERE service = ?", (service,)) if service is not None
                else self._db.execute(sql)).fetchall()
        return {str(row[0]): _canary(row[1:]) for row in rows}

    def record_version_counts(self, service: str, counts: Mapping[tuple[int, int, str], int],
                              keep_seconds: int = REQUEST_COUNTS_KEEP_SECONDS) -> None:
        """Add requests per (version, second, status class), and drop those older than ``keep_seconds``
        before the newest. Added up, not replaced: each of a service's load balancers adds its own."""
        if not counts:
            return
        with self._write(UNFENCED) as tx:  # the load balancers'
            tx.db.executemany(
                "INSERT INTO version_counts (service, version, second, status_class, count) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (service, version, second, status_class)"
                " DO UPDATE SET count = version_counts.count + excluded.count",
                [(service, version, second, status_class, count)
                 for (version, second, status_class), count in counts.items()])
            tx.db.execute("DELETE FROM version_counts WHERE service = ? AND second < ?",
                          (service, max(second for _, second, _ in counts) - keep_seconds))

    def count_versions_since(self, service: str, since_second: int) -> dict[int, dict[str, int]]:
        """Requests of ``service`` from ``since_second`` on, per version and status class."""
        rows = self._db.execute(
            "SELECT version, status_class, SUM(count) FROM version_counts WHERE service = ? AND second >= ?"
            " GROUP BY version, status_class", (service, since_second)).fetchall()
        counts: dict[int, dict[str, int]] = {}
        for version, status_class, count in rows:
            counts.setdefault(int(version), {})[str(status_class)] = int(count)
        return counts

    # --- replica history -------------------------------------------------------------------------
    def record_replica_samples(self, samples: Sequence[ReplicaSample], keep_from_minute: int) -> None:
        """Write the samples (one per service and minute: a second one for the same minute replaces it) and
        drop every sample before ``keep_from_minute``, in one transaction. A sample of a service that is gone
        is not written."""
        with self._write(s.service for s in samples) as tx:
            db = tx.db
            samples = tx.keep(samples, _service_of)
            db.executemany(
                # SQLite reads the ON of an upsert after INSERT ... SELECT as a join's unless the SELECT has a
                # WHERE, which this one has.
                "INSERT INTO replica_history (service, minute, ready, target)"
                " SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM services WHERE name = ?)"
                " ON CONFLICT (service, minute) DO UPDATE SET ready = excluded.ready, target = excluded.target",
                [(s.service, s.minute, s.ready, s.target, s.service) for s in samples])
            db.execute("DELETE FROM replica_history WHERE minute < ?", (keep_from_minute,))

    def list_replica_samples(self, service: str, since_minute: int) -> list[ReplicaSample]:
        rows = self._db.execute(
            "SELECT service, minute, ready, target FROM replica_history WHERE service = ? AND minute >= ?"
            " ORDER BY minute", (service, since_minute)).fetchall()
        return [ReplicaSample(*row) for row in rows]


_SET_GC_PENDING = "INSERT INTO meta (key, value) VALUES ('gc_pending', '1') ON CONFLICT (key) DO UPDATE SET value = '1'"

_SERVICE_SELECT = (
    "name, current_version, status, status_reason, lb_port, lb_pid, lb_policy, deleting, created_at,"
    " next_replica_id, active_versions, lb_port_pinned"
)
_VERSION_SELECT = (
    "v.service, v.version, v.text, v.source, v.created_at, v.mode, v.note, s.manifest_json, v.files_expired,"
    " v.reuse_identical_files, v.inputs_json, v.spec_json"
    " FROM versions v LEFT JOIN snapshots s ON s.digest = v.files_digest"
)


# A fenced write naming at most this many services reads only their lease rows (one placeholder each);
# more, and it reads every row of the loop (one statement, no list of placeholders to build or to bound).
# A launch pass at 1,000 services starts 1,000 load balancers, one write each, and reading all 1,000 of the
# loop's tokens for each was ~0.9 s of it.
_FENCE_BY_NAME = 50


def _upsert_canary(db: StoreConnection, service: str, state: CanaryState, percent: int, *,
                   clear_command: bool) -> None:
    """Write ``service``'s canary row (one per service: a later version's replaces an earlier one's) inside
    the caller's transaction; ``clear_command``: forget a person's command (a rollout starting anew)."""
    settings = json.dumps(state.settings.to_json(), sort_keys=True)
    values = (service, state.version, settings, state.phase.value, state.step, state.window_start,
              state.extensions, int(state.paused), state.verdict, percent)
    db.execute(
        "INSERT INTO canary_rollouts (service, version, settings_json, phase, step, window_start, extensions,"
        " paused, verdict, percent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (service) DO UPDATE SET"
        " version = excluded.version, settings_json = excluded.settings_json, phase = excluded.phase,"
        " step = excluded.step, window_start = excluded.window_start, extensions = excluded.extensions,"
        " paused = excluded.paused, verdict = excluded.verdict, percent = excluded.percent", values)
    if clear_command:
        db.execute("UPDATE canary_rollouts SET command = NULL WHERE service = ?", (service,))


class Unfenced(enum.Enum):
    """What ``Store._write`` is told by a write that no fence applies to (``UNFENCED``)."""

    UNFENCED = "unfenced"


UNFENCED = Unfenced.UNFENCED
_Row = TypeVar("_Row")


@dataclass(frozen=True, slots=True)
class _Transaction:
    """A write transaction (``Store._write``): its connection, and the services whose rows it may write."""

    db: StoreConnection
    held: frozenset[str] | None  # None: every service's (nothing is fenced)

    def holds(self, service: str) -> bool:
        return self.held is None or service in self.held

    def keep(self, rows: Iterable[_Row], service: Callable[[_Row], str]) -> list[_Row]:
        """Of ``rows``, those of services this transaction holds (``service`` names each row's)."""
        held = self.held
        return list(rows) if held is None else [row for row in rows if service(row) in held]


# Which service a row written by a fenced write is of.
_first = operator.itemgetter(0)  # (service, ...)
_second = operator.itemgetter(1)  # events: (time, service, ...)
_service_of = operator.attrgetter("service")  # replica records, samples


def _find_held(db: StoreConnection, fence: Fence, services: frozenset[str], now: float | None = None
               ) -> frozenset[str]:
    """Of ``services``, those ``fence.owner`` still holds with the token the fence names: the one token check
    of the store, made by every fenced write (under the write lock) and by ``find_lost_leases`` (with
    ``now``: an expired lease is lost too, taken over or not)."""
    if len(services) <= _FENCE_BY_NAME:
        rows = db.execute(f"SELECT service, token, expires_at FROM service_leases WHERE owner = ? AND service IN "
                          f"({', '.join('?' * len(services))})", (fence.owner, *services)).fetchall()
    else:
        rows = db.execute("SELECT service, token, expires_at FROM service_leases WHERE owner = ?",
                          (fence.owner,)).fetchall()
    tokens = fence.tokens
    return frozenset(str(service) for service, token, expires in rows
                     if str(service) in services and tokens.get(str(service)) == token
                     and (now is None or float(expires) > now))


@dataclass(frozen=True)
class ControllerRow:
    """One controller (loop) of the database: its id, the host its endpoints answer on (``host.json``'s
    endpoint host), when it started and last renewed its row, and the services whose leases name it."""

    loop_id: str
    host: str
    started_at: float
    renewed_at: float
    services: tuple[str, ...] = ()


# A load balancer's report older than this, next to its service's newest, is of a load balancer that is gone
# (a host down): it reports every 2 s while it runs (``lb.proxy.REPORT_HEARTBEAT_SECONDS``), so 10 s is five
# missed reports (``controller.snapshots`` drops a lone report by the same threshold).
LB_REPORT_STALE_SECONDS = 10.0


def sum_lb_reports(reports: Sequence[LbReport]) -> LbReport:
    """One load out of several load balancers' reports of a service (one per controller host): waiting
    requests and in-flight requests per replica url added up, as of the newest report; a report more than
    ``LB_REPORT_STALE_SECONDS`` older than the newest is left out. Two hosts, in flight {a: 2} and {a: 1,
    b: 3}, 1 and 0 waiting -> {a: 3, b: 3}, 1 waiting. ``reports`` must not be empty."""
    newest = max(report.reported_at for report in reports)
    fresh = [report for report in reports if newest - report.reported_at <= LB_REPORT_STALE_SECONDS]
    if len(fresh) == 1:
        return fresh[0]
    in_flight: dict[str, int] = {}
    for report in fresh:
        for url, count in report.in_flight:
            in_flight[url] = in_flight.get(url, 0) + count
    return LbReport(reported_at=newest, in_flight=tuple(sorted(in_flight.items())),
                    waiting=sum(report.waiting for report in fresh))


def _lb_report(reported_at: Any, waiting: Any, in_flight_json: Any) -> LbReport:
    return LbReport(reported_at=float(reported_at), waiting=int(waiting),
                    in_flight=tuple(sorted(json.loads(in_flight_json).items())))


def _canary(row: tuple[Any, ...]) -> StoredCanary:
    version, settings, phase, step, window_start, extensions, paused, verdict, percent, command = row
    state = CanaryState(version=int(version), settings=CanarySettings.from_json(json.loads(settings)),
                        phase=CanaryPhase(phase), step=int(step),
                        window_start=None if window_start is None else float(window_start),
                        extensions=int(extensions), paused=bool(paused), verdict=verdict)
    return StoredCanary(state, int(percent), None if command is None else Command(command))


def _find_submission(db: StoreConnection, key: str) -> tuple[str, int] | None:
    row = db.execute("SELECT service, version FROM submissions WHERE key = ?", (key,)).fetchone()
    return (str(row[0]), int(row[1])) if row else None


def _version(row: tuple[Any, ...]) -> VersionRecord:
    service, version, text, source, created_at, mode, note, files_json, expired, reuse, inputs, spec_json = row
    return VersionRecord(service, version, text, source, created_at, mode, note, files_json, bool(expired),
                         bool(reuse), inputs, spec_json)


def _service(row: tuple[Any, ...]) -> ServiceRecord:
    (name, version, status, reason, port, pid, policy, deleting, created_at, next_id, active, pinned) = row
    return ServiceRecord(
        name=name, current_version=version, status=ServiceStatus(status), status_reason=reason,
        lb_port=port, lb_pid=pid, lb_policy=policy, deleting=bool(deleting), created_at=created_at,
        next_replica_id=next_id, active_versions=None if active is None else tuple(json.loads(active)),
        lb_port_pinned=bool(pinned),
    )


def _autoscaler(row: tuple[Any, ...]) -> tuple[AutoscalerState, AutoscalerObservation]:
    """(version, target, upscale_count, downscale_count, last_decision_at, observed_json) decoded."""
    return AutoscalerState(*row[:5]), AutoscalerObservation(**json.loads(row[5]))


def _replica(row: tuple[Any, ...]) -> ReplicaRecord:
    values = dict(zip(_REPLICA_COLUMNS, row, strict=True))
    values["status"] = REPLICA_STATUS_BY_VALUE[values["status"]]
    values["is_spot"] = bool(values["is_spot"])
    return replica_from_fields(values)


_STATUS_INDEX = _REPLICA_COLUMNS.index("status")


# An upsert, not INSERT OR REPLACE: a replaced row is deleted and inserted again (both b-trees touched, the
# foreign key checked twice), an upserted one is updated where it is, ~25% less time for a 10,000-row launch.
_PUT_REPLICA = (f"INSERT INTO replicas ({', '.join(_REPLICA_COLUMNS)}) "
                f"VALUES ({', '.join('?' for _ in _REPLICA_COLUMNS)}) ON CONFLICT (service, replica_id) DO UPDATE SET "
                + ", ".join(f"{c} = excluded.{c}" for c in _REPLICA_COLUMNS if c not in ("service", "replica_id")))


_REPLICA_VALUES = operator.attrgetter(*_REPLICA_COLUMNS)


def _replica_values(record: ReplicaRecord) -> tuple[Any, ...]:
    # One C-level attrgetter for the row, then the one enum column: a Python loop over the 20 columns was
    # most of writing 10,000 launched replicas.
    values = _REPLICA_VALUES(record)
    return (*values[:_STATUS_INDEX], record.status.value, *values[_STATUS_INDEX + 1:])


def _put_replicas(db: StoreConnection, records: Sequence[ReplicaRecord]) -> None:
    """Write whole rows in one statement (the counters move by their triggers)."""
    if records:
        db.executemany(_PUT_REPLICA, map(_replica_values, records))

