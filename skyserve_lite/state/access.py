"""Whether the store opens its database for writing or only for reading, from what its directory allows.

A state directory may be read-only: a backup or a colleague's home mounted read-only, a container given the
home with `:ro`, a directory of another user. Reading it must still work (`serve status`, `serve history`,
`serve logs`), and a write must fail with one line naming the directory, before anything was tried.

SQLite needs more than read permission to read a database in WAL mode: a reader maps the ``-shm`` index
beside the database, creating it if it is missing, which a read-only directory refuses ("unable to open
database file"). So:

- the ``-wal`` and ``-shm`` files are there (a writer has the database open, perhaps on another mount of the
  same directory): open it read-only (``mode=ro``) and read the log through the writer's index, seeing what
  it committed;
- neither is there (the last writer closed it cleanly, which folds the log into the database and removes
  both): open it ``immutable``, which reads the database file alone and needs no index. Nobody can write
  through this directory, and a one-shot read is over in milliseconds;
- a ``-wal`` without its ``-shm`` (copied or cleaned up by hand): an immutable open would miss what the log
  holds and show an older state as the current one, so it is refused.
"""

from __future__ import annotations

import enum
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite.errors import StateUnwritableError


class StoreAccess(enum.Enum):
    READ_WRITE = "read-write"
    READ_ONLY = "read-only"  # ``mode=ro``: the write-ahead log is read through the ``-shm`` index already there
    IMMUTABLE = "immutable"  # ``mode=ro&immutable=1``: the database file alone, no index needed
    NO_DATABASE = "no-database"  # none there, and none can be created
    WAL_WITHOUT_INDEX = "wal-without-index"  # committed changes in a log that cannot be read here

    @property
    def is_readable(self) -> bool:
        return self in (StoreAccess.READ_WRITE, StoreAccess.READ_ONLY, StoreAccess.IMMUTABLE)


@dataclass(frozen=True)
class HomeFiles:
    """What ``observe_home`` found: whether this process may write the directory (and the database in it),
    and which of the database's files are there."""

    writable: bool
    database: bool
    wal: bool
    shm: bool


def plan_store_access(found: HomeFiles) -> StoreAccess:
    """How to open the database of a state directory where ``found`` holds (see the module's docstring)."""
    if found.writable:
        return StoreAccess.READ_WRITE
    if not found.database:
        return StoreAccess.NO_DATABASE
    if found.wal and found.shm:
        return StoreAccess.READ_ONLY
    if found.wal:
        return StoreAccess.WAL_WITHOUT_INDEX
    return StoreAccess.IMMUTABLE


def observe_home(home: Path, database: Path) -> HomeFiles:
    """``HomeFiles`` of the existing directory ``home`` and its ``database`` file. ``os.access`` asks the
    kernel the question a write would: it answers no for a read-only mount even to root, and for a
    directory without write permission to anyone else."""
    exists = database.exists()
    writable = os.access(home, os.W_OK) and (not exists or os.access(database, os.W_OK))
    return HomeFiles(writable=writable, database=exists, wal=_exists(database, "-wal"),
                     shm=_exists(database, "-shm"))


def _exists(database: Path, suffix: str) -> bool:
    return database.with_name(database.name + suffix).exists()


def find_refusal_in_home(exc: OSError, home: Path) -> StateUnwritableError | None:
    """sky-lite's error for ``exc`` when it is the state directory ``home`` refusing a file of its own (a
    read-only file system, a directory or file this user may not write), or None for anything else (a bug,
    or a file elsewhere: it keeps its own type and traceback). The store refuses its own writes before they
    begin (``Store.read_only``); this covers the files beside it (locks, logs, blobs)."""
    if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not exc.filename:
        return None
    name = os.path.abspath(os.fsdecode(exc.filename))
    if os.path.commonpath([name, str(home)]) != str(home):
        return None
    if exc.errno == errno.EROFS:  # no file of that file system was changed, this one or another
        return StateUnwritableError(f"the state directory {home} is read-only ({name}: {exc.strerror}); "
                                    "nothing was changed; make it writable, or run this where it is")
    return StateUnwritableError(f"cannot use {name} in the state directory {home} ({exc.strerror}); make the "
                                "directory writable by you, or set SKY_LITE_HOME to one that is")
