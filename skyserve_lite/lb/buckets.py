"""Where the rate limits' buckets live: in the process (``LocalBuckets``), or in a table every worker of one
load balancer maps (``SharedBuckets``, ``lb.workers``).

A bucket is one float, the theoretical arrival time ``tat`` of the generic cell rate algorithm
(``lb.guard`` explains it). ``take(key, now, interval, tolerance)`` counts one request against ``key``'s
bucket when it is allowed and returns how long the client would have to wait otherwise: at most ``SLACK``
means allowed (and counted), more means limited (and not counted). ``compute_take`` is that arithmetic,
pure; the stores differ only in where ``tat`` is kept and what is dropped when they are full.

``SharedBuckets``: a table of ``slots`` entries of 16 bytes (an 8-byte digest of the key, 0 for a free
entry, and ``tat``) in a file mapped by every worker, read and written under a POSIX record lock
(``fcntl.lockf``: held per process, so workers sharing one open file still exclude each other; one lock
and one unlock per limited request, a few microseconds). A key's entry is looked for in the
``PROBE`` entries from its digest's place; when it is in none of them, it takes a free one, else one whose
``tat`` is past (a bucket full again is the same as none), else the one nearest to full, as the local
store drops its least recently used bucket at its limit. The digest is keyed by the limits in force
(``salt``), so a version with other limits starts from fresh buckets, as a single process does.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
from collections import OrderedDict
from typing import Final, Protocol

__all__ = [
    "DROP_PER_DECISION",
    "PROBE",
    "SLACK",
    "SLOT_BYTES",
    "BucketStore",
    "LocalBuckets",
    "SharedBuckets",
    "compute_salt",
    "compute_table_slots",
    "compute_take",
    "make_shared_table",
]

# Float slack: `rps: 3` gives an interval of 0.333..., and ten of them may add up to a hair above 3 * 0.333...;
# without it the burst's last request would be refused by rounding.
SLACK: Final = 1e-9
# Buckets dropped per decision when idle, besides the one over the cap: 16 keeps ahead of the one bucket a
# decision may add, without one request paying for dropping 100,000 at once.
DROP_PER_DECISION: Final = 16
# Entries looked at for one key in the shared table: 8 x 16 bytes, two cache lines.
PROBE: Final = 8
_SLOT: Final = struct.Struct("=Qd")
_DIGESTS_KEPT: Final = 4096
SLOT_BYTES: Final = _SLOT.size

BucketKey = tuple[int, "str | bytes"]  # (limit index, client key)


def compute_take(tat: float | None, now: float, interval: float, tolerance: float) -> tuple[float, float | None]:
    """(wait, new tat) for one request at ``now`` against a bucket at ``tat`` (None: no bucket, i.e. full).
    Allowed when ``wait <= SLACK``: ``tat`` moves one ``interval`` on; otherwise the new tat is None (the
    bucket stays as it was). Pure."""
    start = now if tat is None or tat < now else tat
    wait = start - now - tolerance
    if wait > SLACK:
        return wait, None
    return wait, start + interval


class BucketStore(Protocol):
    def take(self, key: BucketKey, now: float, interval: float, tolerance: float) -> float: ...

    def __len__(self) -> int: ...


class LocalBuckets:
    """The buckets of one process: least recently used first; buckets full again are dropped as they reach
    the head, and at ``max_buckets`` the least recently used one whatever its state."""

    def __init__(self, max_buckets: int) -> None:
        if max_buckets < 1:
            raise ValueError(f"max_buckets must be at least 1, got {max_buckets}")
        self._max_buckets = max_buckets
        # A client key is a str for an address and 16 bytes for a header's value: the two types never
        # compare equal, so a header cannot be made to share an address's bucket.
        self._buckets: OrderedDict[BucketKey, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def keys(self) -> list[BucketKey]:
        """The keys held, least recently used first."""
        return list(self._buckets)

    def take(self, key: BucketKey, now: float, interval: float, tolerance: float) -> float:
        buckets = self._buckets
        if buckets and buckets[next(iter(buckets))] <= now:
            self._drop_idle(now)
        wait, tat = compute_take(buckets.get(key), now, interval, tolerance)
        if tat is None:
            buckets.move_to_end(key)  # present: an absent bucket is full, never refuses
            return wait
        buckets[key] = tat
        buckets.move_to_end(key)
        if len(buckets) > self._max_buckets:
            buckets.popitem(last=False)
        return wait

    def _drop_idle(self, now: float) -> None:
        """Drop least recently used buckets that are full again (``tat`` past), a few per call."""
        buckets = self._buckets
        for _ in range(DROP_PER_DECISION):
            if not buckets:
                return
            oldest = next(iter(buckets))
            if buckets[oldest] > now:
                return
            del buckets[oldest]


def compute_table_slots(max_buckets: int) -> int:
    """Entries in a shared table for ``max_buckets`` keys: the power of two at or above twice that, so that a
    table holding the local store's limit is at most half full (with 8-entry windows, about 1 new key in
    1,000 then takes a live bucket's entry; at 3/4 full, 4 in 100). Pure."""
    return max(PROBE, 1 << max(0, 2 * max_buckets - 1).bit_length())


def compute_salt(limits: object) -> bytes:
    """The salt of ``SharedBuckets`` for a set of limits (their repr, the same in every process): other
    limits key other buckets. Pure."""
    return hashlib.blake2b(repr(limits).encode(), digest_size=32).digest()


def make_shared_table(slots: int) -> int:
    """A new table of ``slots`` free entries in an unnamed file (gone with the last process holding it); its
    descriptor, inheritable, for the workers to map (``SharedBuckets``)."""
    import tempfile  # only a parent with workers makes one

    with tempfile.TemporaryFile() as table:
        table.truncate(slots * SLOT_BYTES)
        fd = os.dup(table.fileno())
    os.set_inheritable(fd, True)
    return fd


class SharedBuckets:
    """The buckets in a table several processes map (see the module docstring); ``fd`` is the table's file
    (``make_shared_table``), ``salt`` names the limits in force. ``with_salt`` gives the same table's buckets
    for other limits (one mapping per process); ``close`` unmaps it."""

    def __init__(self, fd: int, salt: bytes, _map: mmap.mmap | None = None) -> None:
        size = os.fstat(fd).st_size
        if size < SLOT_BYTES * PROBE or size % SLOT_BYTES:
            raise ValueError(f"a shared bucket table holds whole entries, at least {PROBE}; got {size} bytes")
        self._fd = fd
        self._slots = size // SLOT_BYTES
        self._map = _map if _map is not None else mmap.mmap(fd, size)
        self._salt = salt
        # key -> digest for the keys seen lately: a digest costs about a microsecond, a dict look-up a tenth;
        # emptied when it reaches _DIGESTS_KEPT entries, so it is bounded whatever clients come.
        self._digests: dict[BucketKey, int] = {}

    def __len__(self) -> int:
        """Entries in use (a scan of the table: for tests)."""
        return sum(1 for digest, _ in _SLOT.iter_unpack(self._map) if digest)

    def close(self) -> None:
        self._map.close()

    def with_salt(self, salt: bytes) -> SharedBuckets:
        """The buckets of other limits in the same table and mapping (closing either unmaps both)."""
        return SharedBuckets(self._fd, salt, self._map)

    def digest(self, key: BucketKey) -> int:
        index, client = key
        raw = client.encode("utf-8", "surrogateescape") if isinstance(client, str) else client
        kind = b"s" if isinstance(client, str) else b"b"
        value = int.from_bytes(hashlib.blake2b(kind + index.to_bytes(4, "big") + raw, digest_size=8,
                                               key=self._salt[:64]).digest(), "big")
        return value or 1  # 0 marks a free entry

    def take(self, key: BucketKey, now: float, interval: float, tolerance: float) -> float:
        digests = self._digests
        digest = digests.get(key)
        if digest is None:
            if len(digests) >= _DIGESTS_KEPT:
                digests.clear()
            digest = digests[key] = self.digest(key)
        first = digest % self._slots
        table = self._map
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            place, tat = self._find(table, first, digest, now)
            wait, new_tat = compute_take(tat, now, interval, tolerance)
            if new_tat is not None:
                _SLOT.pack_into(table, place * SLOT_BYTES, digest, new_tat)
            return wait
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def _find(self, table: mmap.mmap, first: int, digest: int, now: float) -> tuple[int, float | None]:
        """The entry for ``digest`` and its tat, or the entry to take for it and None."""
        slots = self._slots
        free = expired = nearest = -1
        nearest_tat = 0.0
        for step in range(PROBE):
            place = (first + step) % slots
            found, tat = _SLOT.unpack_from(table, place * SLOT_BYTES)
            if found == digest:
                return place, tat
            if not found:
                if free < 0:
                    free = place
            elif tat <= now:
                if expired < 0:
                    expired = place
            elif nearest < 0 or tat < nearest_tat:
                nearest, nearest_tat = place, tat
        return (free if free >= 0 else expired if expired >= 0 else nearest), None
