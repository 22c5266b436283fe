"""The blob store: each file's bytes once, named by their sha256, shared by every version that holds them.

Layout under the root (``$SKY_LITE_HOME/blobs``)::

    ab/cdef0123...   the bytes whose sha256 is "abcdef0123..." (mode 0600, written once: temp + rename)
    .lock            capture holds it shared from the first blob written until its version is stored;
                     garbage collection takes it exclusively, so it never deletes a blob a submission
                     that is still under way has just written

Ten versions of a 50 MB workdir that differ in one file cost about 50 MB: nine of every ten blobs a
capture asks for are there already.

With the state in PostgreSQL (several controller hosts on one database), the database keeps every blob too
(``state.blob_table``): a blob stored on one host is written through to it, and a host that lacks one (its
CLI did not submit that version) copies it from there into its own folder, its sha256 checked, the first time
it is needed. The database is the one thing every controller host shares: the local provider has no object
store, and a cloud's object store would need cloud credentials on every host and a bucket before the first
launch. The folder is then a cache that any host can lose.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

_CHUNK = 1 << 20
# A blob in the database that no version needs is deleted only once it is this old: another host may be
# storing the version that needs it (its blobs go in before its version does), and a 50 MB capture over a
# slow link takes minutes, not an hour.
SHARED_GRACE_SECONDS = 3600.0


class SharedBlobs(Protocol):
    """Where every host's blobs are (``state.blob_table.BlobTable``, the database's)."""

    def has(self, digest: str) -> bool: ...

    def put(self, digest: str, size: int, chunks: Iterable[bytes], now: float) -> None: ...

    def read(self, digest: str) -> Iterator[bytes]: ...

    def delete_unneeded(self, keep: Collection[str], stored_before: float) -> int: ...


def blob_store_of(home: Path) -> BlobStore:
    """The blob store of the state directory ``home``: its folder, and the database's blobs too when the
    state is in PostgreSQL (connected on first use)."""
    from skyserve_lite.state.dburl import find_database_url  # the state package imports this module's callers

    url = find_database_url(home, os.environ)
    if url is None:
        return BlobStore(home / "blobs")

    def connect() -> SharedBlobs:
        from skyserve_lite.state import pg
        from skyserve_lite.state.blob_table import BlobTable

        return BlobTable(pg.connect(url))

    return BlobStore(home / "blobs", shared=connect)


class BlobStore:
    """See the module docstring. Creating one touches nothing on disk, and connects to nothing.

    ``shared``: makes the connection to the blobs every host shares (None: this folder is the only copy)."""

    def __init__(self, root: Path, *, shared: Callable[[], SharedBlobs] | None = None,
                 now: Callable[[], float] = time.time) -> None:
        self.root = root
        self._connect = shared
        self._shared: SharedBlobs | None = None
        self._now = now

    def _table(self) -> SharedBlobs | None:
        if self._shared is None and self._connect is not None:
            self._shared = self._connect()
        return self._shared

    def path_of(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        if self.path_of(digest).is_file():
            return True
        shared = self._table()
        return shared is not None and shared.has(digest)

    def fetch(self, digest: str) -> Path:
        """The blob's file in this folder, copied first from the shared blobs when this host lacks it (its
        sha256 checked: a mismatch raises ``OSError`` and keeps nothing). Raises ``FileNotFoundError`` when
        no store has it."""
        path = self.path_of(digest)
        shared = self._table()
        if path.is_file() or shared is None:
            return path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temporary = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        try:
            hasher = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for chunk in shared.read(digest):
                    hasher.update(chunk)
                    out.write(chunk)
            if hasher.hexdigest() != digest:
                raise OSError(f"blob {digest[:12]} read from the state database does not match its sha256")
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        return path

    def open(self, digest: str) -> BinaryIO:
        """The blob's bytes for reading (``fetch``ed first); raises ``FileNotFoundError`` without it."""
        return open(self.fetch(digest), "rb")

    def put(self, stream: BinaryIO) -> tuple[str, int]:
        """Store the stream's bytes (once); return their sha256 and size. Raises ``OSError``."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        hasher = hashlib.sha256()
        size = 0
        fd, temporary = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(_CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            digest = hasher.hexdigest()
            target = self.path_of(digest)
            if not target.is_file():
                target.parent.mkdir(exist_ok=True, mode=0o700)
                os.replace(temporary, target)
            self._share(digest, size)
            return digest, size
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)

    def _share(self, digest: str, size: int) -> None:
        """Write the blob through to the shared blobs, unless they have it (written once)."""
        shared = self._table()
        if shared is None or shared.has(digest):
            return
        with open(self.path_of(digest), "rb") as source:
            shared.put(digest, size, iter(lambda: source.read(_CHUNK), b""), self._now())

    def copy_to(self, digest: str, destination: Path, mode: int) -> None:
        """Write blob ``digest`` to ``destination`` (a copy: a replica that edits its files must not edit
        the blob). Raises ``FileNotFoundError`` when the store has no such blob."""
        temporary = destination.with_name(f".{destination.name}.sky-lite-tmp")
        with self.open(digest) as source, open(temporary, "wb") as out:
            shutil.copyfileobj(source, out, _CHUNK)
        os.chmod(temporary, mode)
        os.replace(temporary, destination)

    def digests(self) -> set[str]:
        if not self.root.is_dir():
            return set()
        return {folder.name + blob.name for folder in self.root.iterdir() if folder.is_dir() and len(folder.name) == 2
                for blob in folder.iterdir() if not blob.name.startswith(".")}

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold while writing blobs for a version that is not stored yet (shared: submissions run side by
        side)."""
        with self._lock(fcntl.LOCK_SH):
            yield

    def collect_garbage(self, find_needed: Callable[[], Collection[str]]) -> int | None:
        """Delete every blob that ``find_needed()`` does not name; the number deleted, or None when a capture
        is under way (try again later). ``find_needed`` is asked under the exclusive lock: a submission that
        stored its version just before is seen, and one still writing holds the lock off. With nothing left,
        the store's folder goes too. In the shared blobs, those unneeded and older than
        ``SHARED_GRACE_SECONDS`` go (no lock reaches another host's submission)."""
        shared = self._table()
        if not self.root.is_dir():
            if shared is None:
                return 0
            return shared.delete_unneeded(set(find_needed()), self._now() - SHARED_GRACE_SECONDS)
        try:
            with self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB):
                keep = set(find_needed())
                deleted = 0 if shared is None else shared.delete_unneeded(keep, self._now() - SHARED_GRACE_SECONDS)
                for digest in self.digests() - keep:
                    self.path_of(digest).unlink(missing_ok=True)
                    deleted += 1
                for folder in self.root.iterdir():
                    if folder.is_dir() and not any(folder.iterdir()):
                        folder.rmdir()
                for leftover in self.root.glob(".incoming-*"):
                    leftover.unlink(missing_ok=True)
                empty = not keep and not any(p for p in self.root.iterdir() if p.name != ".lock")
        except BlockingIOError:
            return None
        if empty:
            shutil.rmtree(self.root, ignore_errors=True)
        return deleted

    @contextmanager
    def _lock(self, operation: int) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, operation)
            yield
        finally:
            os.close(fd)
