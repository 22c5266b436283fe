"""The blob store: each file's bytes once, named by their sha256, shared by every version that holds them.

Layout under the root (``$SKY_LITE_HOME/blobs``)::

    ab/cdef0123...   the bytes whose sha256 is "abcdef0123..." (mode 0600, written once: temp + rename)
    .lock            capture holds it shared from the first blob written until its version is stored;
                     garbage collection takes it exclusively, so it never deletes a blob a submission
                     that is still under way has just written

Ten versions of a 50 MB workdir that differ in one file cost about 50 MB: nine of every ten blobs a
capture asks for are there already.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_CHUNK = 1 << 20


def blob_store_of(home: Path) -> BlobStore:
    """The blob store of the state directory ``home``."""
    return BlobStore(home / "blobs")


class BlobStore:
    """See the module docstring. Creating one touches nothing on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        return self.path_of(digest).is_file()

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
            if target.is_file():
                return digest, size
            target.parent.mkdir(exist_ok=True, mode=0o700)
            os.replace(temporary, target)
            return digest, size
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)

    def copy_to(self, digest: str, destination: Path, mode: int) -> None:
        """Write blob ``digest`` to ``destination`` (a copy: a replica that edits its files must not edit
        the blob). Raises ``FileNotFoundError`` when the store has no such blob."""
        temporary = destination.with_name(f".{destination.name}.sky-lite-tmp")
        with open(self.path_of(digest), "rb") as source, open(temporary, "wb") as out:
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
        the store's folder goes too."""
        if not self.root.is_dir():
            return 0
        try:
            with self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB):
                keep = set(find_needed())
                deleted = 0
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
