"""Blobs kept in the state database, for a store on PostgreSQL: every controller host reads and writes the
same ones (``files.blobs`` keeps its files on disk as a cache in front of this).

Two tables (``schema``): ``blob_chunks`` holds each blob's bytes in chunks of 1 MiB keyed by (digest, index),
``blobs`` one row per complete blob (its size and number of chunks, when it was stored). A blob is written
once, chunks first and its ``blobs`` row last in the same transaction, so a reader that finds the row finds
every chunk; two hosts writing the same blob at once both commit (``ON CONFLICT DO NOTHING``), one copy
stays. Its own short transactions, not the store's write lock: a 50 MB upload must not hold every
controller's writes off.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager

from skyserve_lite.state.connection import StoreConnection

CHUNK_BYTES = 1 << 20  # 1 MiB: a 50 MB workdir is 50 rows; one row's bytes are one round trip's


class BlobTable:
    """The database's blobs through ``connection`` (one not used for anything else meanwhile)."""

    def __init__(self, connection: StoreConnection) -> None:
        self._db = connection

    def has(self, digest: str) -> bool:
        return self._db.execute("SELECT 1 FROM blobs WHERE digest = ?", (digest,)).fetchone() is not None

    def put(self, digest: str, size: int, chunks: Iterable[bytes], now: float) -> None:
        """Store the blob ``digest`` from its ``chunks`` in order (the caller computed the digest and size;
        chunks of at most ``CHUNK_BYTES`` each). Idempotent: a blob stored already is left as it is."""
        with self._transaction():
            count = 0
            for index, data in enumerate(chunks):
                self._db.execute("INSERT INTO blob_chunks (digest, chunk, data) VALUES (?, ?, ?)"
                                 " ON CONFLICT (digest, chunk) DO NOTHING", (digest, index, data))
                count = index + 1
            self._db.execute("INSERT INTO blobs (digest, size, chunks, stored_at) VALUES (?, ?, ?, ?)"
                             " ON CONFLICT (digest) DO NOTHING", (digest, size, count, now))

    def read(self, digest: str) -> Iterator[bytes]:
        """The blob's chunks in order, one query each (a blob is never held whole in memory). Raises
        ``FileNotFoundError`` when the database has no such blob (or not all of it)."""
        row = self._db.execute("SELECT chunks FROM blobs WHERE digest = ?", (digest,)).fetchone()
        if row is None:
            raise FileNotFoundError(f"no blob {digest[:12]} in the state database")
        for index in range(int(row[0])):
            chunk = self._db.execute("SELECT data FROM blob_chunks WHERE digest = ? AND chunk = ?",
                                     (digest, index)).fetchone()
            if chunk is None:
                raise FileNotFoundError(f"blob {digest[:12]} lacks its chunk {index} in the state database")
            yield bytes(chunk[0])

    def delete_unneeded(self, keep: Collection[str], stored_before: float) -> int:
        """Delete every blob not in ``keep`` that was stored before ``stored_before``; how many. A blob stored
        since is left for a later collection: another host may be storing the version that needs it (its
        blobs go in before its version row does)."""
        rows = self._db.execute("SELECT digest FROM blobs WHERE stored_at < ?", (stored_before,)).fetchall()
        doomed = [(str(digest),) for (digest,) in rows if str(digest) not in keep]
        if not doomed:
            return 0
        with self._transaction():
            self._db.executemany("DELETE FROM blobs WHERE digest = ?", doomed)
            self._db.executemany("DELETE FROM blob_chunks WHERE digest = ?", doomed)
        return len(doomed)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction of this table's own: committed when the block ends, rolled back when it raises."""
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
