"""One memo per service, owned by the reconciler: what the passes read and decided of a service, kept while the
database says that nothing it was read from has changed.

The database counts the changes (``Store.list_service_generations``): triggers move a service's counter at
every write to a row a pass reads of it (its row, replicas, versions, autoscaler state, termination
requests, canary rollout), whichever controller, CLI or process writes it. A pass reads every counter first
(one query), and a memo is good while its service's counter is the value it was made at; nothing else is
compared, by identity or by value. What a memo keeps:

- the service's replicas, decoded: only services whose counter moved are read again (a pass after one
  replica changed decodes that service's rows, not 10,000);
- the snapshot the pass built over them (the versions' parsed specs with it): handed back while the counter
  stands and what is read every pass anyway (the load balancer's liveness, the load) is as it was
  (``snapshots.read_snapshot``);
- whether the service is settled: its last pass decided nothing. A service's pass is its replicas' own steps
  (``plan_replica``, asked again every pass: probes, instances and the clock move), then the steps over the
  service as a whole: reuse, the autoscaler, scaling per market, the rollout, pruning, launches, the load
  balancer and the status. Those later steps read the snapshot, the replicas' steps and the autoscaler's
  decision, and the clock only to stamp what they change. So when the counter stands, the load balancer is as
  alive as it was, the same clouds' inventories were read, every replica's step leaves its row as it was and
  the autoscaler's decision is the one already stored, the later steps decide what they decided last time:
  nothing. ``plan_service_pass`` then takes only the replicas' steps and the autoscaler's, which is what
  keeps a pass over 1,000 settled services of 10 replicas from planning each service whole every two
  seconds. A settled mark lasts one pass unless that pass decided nothing again (``carry``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.controller.service_steps import StepCensus
from skyserve_lite.state.models import ReplicaRecord


@dataclass(frozen=True, slots=True)
class SettledKey:
    """What a settled service's later steps depend on besides the replicas' steps and the autoscaler's
    decision (which are taken again every pass)."""

    generation: int  # the service's change counter (``Store.list_service_generations``)
    lb_alive: bool
    known_clouds: frozenset[str]  # whose inventories the pass read


@dataclass(slots=True)
class ServiceMemo:
    """What the passes keep of one service while its counter is ``generation``."""

    generation: int | None  # None: the service has no counter yet (nothing is kept past this pass)
    replicas: tuple[ReplicaRecord, ...]
    snapshot: ServiceSnapshot | None = None
    settled: tuple[SettledKey, StepCensus] | None = None
    settled_again: bool = False  # this pass found it settled or settled it: the mark lasts one more pass


def find_stale(memos: Mapping[str, ServiceMemo], generations: Mapping[str, int],
               services: Collection[str]) -> list[str]:
    """Of ``services``, those whose memo is missing or was made at another counter (or at none)."""
    stale = []
    for name in services:
        memo = memos.get(name)
        if memo is None or memo.generation is None or memo.generation != generations.get(name):
            stale.append(name)
    return stale


class ServiceMemos:
    """Every service's memo (see the module's docstring). Not thread-safe: one per controller loop."""

    def __init__(self) -> None:
        self._memos: dict[str, ServiceMemo] = {}
        self._replicas: tuple[ReplicaRecord, ...] | None = None  # every service's, as last joined

    def stale(self, generations: Mapping[str, int], services: Collection[str]) -> list[str]:
        """The services whose replicas must be read again (``find_stale``)."""
        return find_stale(self._memos, generations, services)

    def refresh(self, generations: Mapping[str, int], services: Collection[str],
                replicas: Mapping[str, tuple[ReplicaRecord, ...]]) -> None:
        """Start memos over for the services in ``replicas`` (read again, at ``generations``), and forget
        those of services not in ``services`` (gone)."""
        gone = self._memos.keys() - set(services)
        for name in gone:
            del self._memos[name]
        for name, rows in replicas.items():
            self._memos[name] = ServiceMemo(generations.get(name), rows)
        if gone or replicas:
            self._replicas = None

    def all_replicas(self) -> tuple[ReplicaRecord, ...]:
        """Every service's replicas, by service name: the very same tuple while no memo started over."""
        if self._replicas is None:
            self._replicas = tuple(r for name in sorted(self._memos) for r in self._memos[name].replicas)
        return self._replicas

    # --- snapshots -----------------------------------------------------------------------------------
    def last_snapshot(self, service: str) -> ServiceSnapshot | None:
        """The snapshot the last pass read of the service, while its counter stands (``read_snapshot``'s
        ``last``: it compares what is read every pass anyway, the load among it)."""
        memo = self._memos.get(service)
        return memo.snapshot if memo is not None else None

    def keep_snapshot(self, snapshot: ServiceSnapshot) -> None:
        memo = self._memos.get(snapshot.service.name)
        if memo is not None and memo.generation is not None:
            memo.snapshot = snapshot

    # --- settled services (``plan.plan_service_pass``) -------------------------------------------------
    def next_pass(self) -> None:
        """A settled mark that this pass did not renew (it decided something, or was not asked) is dropped."""
        for memo in self._memos.values():
            if not memo.settled_again:
                memo.settled = None
            memo.settled_again = False

    def _key(self, snapshot: ServiceSnapshot, known_clouds: frozenset[str]) -> SettledKey | None:
        memo = self._memos.get(snapshot.service.name)
        if memo is None or memo.generation is None:
            return None
        return SettledKey(memo.generation, snapshot.lb_alive, known_clouds)

    def find(self, snapshot: ServiceSnapshot, known_clouds: frozenset[str]) -> StepCensus | None:
        """The census of the service's steps when its last pass decided nothing under the same key."""
        memo = self._memos.get(snapshot.service.name)
        if memo is None or memo.settled is None:
            return None
        key, census = memo.settled
        return census if key == self._key(snapshot, known_clouds) else None

    def carry(self, snapshot: ServiceSnapshot) -> None:
        """This pass decided nothing again for a service ``find`` found settled: it stays settled."""
        self._memos[snapshot.service.name].settled_again = True

    def remember(self, snapshot: ServiceSnapshot, known_clouds: frozenset[str], census: StepCensus) -> None:
        """This pass decided nothing for the service: every step kept its row."""
        key = self._key(snapshot, known_clouds)
        memo = self._memos.get(snapshot.service.name)
        if key is not None and memo is not None:
            memo.settled = (key, census)
            memo.settled_again = True
