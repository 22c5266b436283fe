"""Every replica row of one read, and what a pass asks of all of them at once. Pure.

A pass asks several questions of every replica before it plans any service: which service each belongs
to, which regions of which clouds to list, which instances some row claims (the rest are orphans), and
which instances to look up by id when a listing leaves them out. The answers depend only on the rows, and
the reconciler's memos hand back the very same rows while no service's change counter moved
(``controller.settled``), so ``ReplicaTables`` keeps the answers of the last read: a steady pass over 10,000
replicas asks each question of no replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus

AdoptableKey = tuple[str, str, int]  # (cloud, service, replica id) of a launch never confirmed


@dataclass(frozen=True)
class ReplicaTable:
    """``replicas`` and what follows from them alone."""

    replicas: tuple[ReplicaRecord, ...]
    by_service: Mapping[str, tuple[ReplicaRecord, ...]]  # in the store's order (replica id)
    regions: Mapping[str, frozenset[str | None]]  # the regions replicas are in, per cloud
    # Instance ids some row holds, per cloud: an instance no row claims is an orphan. Sets of ids per cloud,
    # not of (cloud, id) tuples: ids are unique within a cloud, and there are few clouds.
    claimed: Mapping[str, frozenset[str]]
    adoptable: frozenset[AdoptableKey]  # rows with no instance id yet: their instance is found by its tags
    # Instance ids of live or departing replicas per cloud: looked up by id when a listing leaves them out
    # (a listing can lag launches, and before a replica is failed or forgotten its instance is asked for).
    watched: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, replicas: tuple[ReplicaRecord, ...], last: ReplicaTable | None = None) -> ReplicaTable:
        """The table of ``replicas``. With ``last`` (the table of the previous read), a service whose rows
        are the very rows it had there keeps its very tuple: the memos hand back an unchanged service's rows as
        the same values, so a pass after one replica changed finds every other service's rows as they were."""
        by_service: dict[str, list[ReplicaRecord]] = {}
        regions: dict[str, set[str | None]] = {}
        claimed: dict[str, set[str]] = {}
        watched: dict[str, set[str]] = {}
        adoptable = set()
        departing = ReplicaStatus.SHUTTING_DOWN
        for r in replicas:  # one scan for every question
            by_service.setdefault(r.service, []).append(r)
            regions.setdefault(r.cloud, set()).add(r.region)
            if r.instance_id is None:
                adoptable.add((r.cloud, r.service, r.replica_id))
                continue
            claimed.setdefault(r.cloud, set()).add(r.instance_id)
            if r.status.is_live or r.status is departing:
                watched.setdefault(r.cloud, set()).add(r.instance_id)
        before = last.by_service if last is not None else {}
        return cls(replicas=replicas,
                   by_service={name: _kept(before.get(name), rows) for name, rows in by_service.items()},
                   regions={cloud: frozenset(found) for cloud, found in regions.items()},
                   claimed={cloud: frozenset(ids) for cloud, ids in claimed.items()},
                   adoptable=frozenset(adoptable),
                   watched={cloud: frozenset(ids) for cloud, ids in watched.items()})


def _kept(before: tuple[ReplicaRecord, ...] | None, rows: list[ReplicaRecord]) -> tuple[ReplicaRecord, ...]:
    """``before`` when it holds the very rows of ``rows``, in order; else ``rows`` as a new tuple."""
    if before is not None and len(before) == len(rows) and all(a is b for a, b in zip(before, rows, strict=True)):
        return before
    return tuple(rows)


class ReplicaTables:
    """The table of the last rows seen: built again only when the rows are not the very same tuple."""

    def __init__(self) -> None:
        self._last: ReplicaTable | None = None

    def table(self, replicas: tuple[ReplicaRecord, ...]) -> ReplicaTable:
        if self._last is None or self._last.replicas is not replicas:
            self._last = ReplicaTable.of(replicas, self._last)
        return self._last
