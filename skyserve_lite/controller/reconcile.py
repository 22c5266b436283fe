"""One reconcile pass: read the store, observe providers and probes, decide (pure), apply (executor)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from skyserve_lite.clock import Clock
from skyserve_lite.controller.executor import Executor
from skyserve_lite.controller.guard import guard_provider
from skyserve_lite.controller.history import find_replica_samples
from skyserve_lite.controller.lb_runner import LoadBalancerRunner
from skyserve_lite.controller.leases import Fence, LeaseHolder
from skyserve_lite.controller.plan import (
    InstanceIndex,
    Observation,
    PassPlan,
    ServiceSnapshot,
    find_probe_targets,
    merge_plans,
    plan_orphans,
    plan_service_pass,
)
from skyserve_lite.controller.probe import Prober
from skyserve_lite.controller.replica_table import ReplicaTable, ReplicaTables
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.controller.settled import ServiceMemos
from skyserve_lite.controller.snapshots import ServiceReads, VersionCache, read_snapshot
from skyserve_lite.errors import ProviderError
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.providers.base import Instance, Provider
from skyserve_lite.state.models import ServiceRecord
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store

log = logging.getLogger(__name__)


class Reconciler:
    """Owns nothing but its dependencies; ``reconcile_once`` is the whole behaviour. Not thread-safe.

    Failures stay inside their boundary: a provider that raises anything (``GuardedProvider`` turns what is
    not a ``ProviderError`` into a transient one) loses only that cloud's decisions for the pass, and a
    service whose state cannot be read or planned is skipped while every other service's pass goes on.

    With ``leases`` (several controllers on one database) a pass first takes its lease step, then reads, plans
    and acts for the services it holds only, and every write it makes for a service is fenced by the token
    it planned with (``Store.fenced``); instances of services another controller owns are never its
    orphans. Without, it is the only controller and plans every service, unfenced.
    """

    def __init__(self, store: Store, providers: Mapping[str, Provider], prober: Prober,
                 lb_runner: LoadBalancerRunner, clock: Clock, settings: ControllerSettings, *,
                 blobs: BlobStore | None = None, secrets: SecretStore | None = None,
                 leases: LeaseHolder | None = None) -> None:
        self._store = store
        self._leases = leases
        self._providers = {cloud: guard_provider(provider) for cloud, provider in providers.items()}
        self._prober = prober
        self._lb_runner = lb_runner
        self._clock = clock
        self._settings = settings
        self._executor = Executor(store, self._providers, lb_runner, clock, blobs=blobs, secrets=secrets)
        self._versions = VersionCache()
        self._tables = ReplicaTables()
        # What the passes keep of each service, good while its change counter in the database stands.
        self._memos = ServiceMemos()

    def reconcile_once(self) -> PassPlan:
        """Run one pass and return the plan it applied. Provider errors do not escape."""
        fence = self._leases.reconcile_leases() if self._leases is not None else None
        # The counters first, then every row: a row written after its counter was read moves the counter past
        # the value the memo is keyed by, and the next pass reads it again.
        generations = self._store.list_service_generations()
        services = self._store.list_services()
        table = self._read_replicas(generations, services)
        snapshots, unreadable, others = self._read(services, table, fence)
        observation, index = self._observe(snapshots, table)
        if fence is not None:
            others |= self._find_owned_elsewhere(observation, snapshots, others)
        plan = self._plan(snapshots, unreadable | others, observation, index, table)
        with self._store.fenced(fence):
            if not plan.is_empty:
                self._executor.apply(plan)
            self._executor.collect_garbage(force=bool(plan.deletions))
            self._executor.record_replica_history(find_replica_samples(snapshots, plan, self._clock.now()))
        # Only when the pass got this far: a pass that cannot write (a full disk) leaves the heartbeat old,
        # and `serve status` then says that what it shows is unverified.
        self._executor.record_pass()
        return plan

    def abandon(self) -> None:
        """The state directory is gone: stop what only the providers' own memory can still find."""
        self._executor.abandon()

    def release_leases(self) -> None:
        """The loop stops cleanly: hand every service over now rather than after the lease TTL."""
        if self._leases is not None:
            self._leases.release_all()

    def _read_replicas(self, generations: Mapping[str, int], services: Sequence[ServiceRecord]) -> ReplicaTable:
        """Every service's replicas: the memo's, read again only for services whose change counter moved."""
        names = [service.name for service in services]
        stale = self._memos.stale(generations, names)
        self._memos.refresh(generations, names, self._store.list_replicas_of(stale) if stale else {})
        return self._tables.table(self._memos.all_replicas())

    def _read(self, services: Sequence[ServiceRecord], table: ReplicaTable, fence: Fence | None
              ) -> tuple[list[ServiceSnapshot], set[str], set[str]]:
        """The snapshot of every service this pass holds, the names of those that could not be read this
        pass, and of those another controller holds (or none does yet)."""
        snapshots, unreadable, others = [], set(), set()
        now = self._clock.now()
        try:
            reads: ServiceReads | None = ServiceReads.read_all(self._store, now, self._settings)
        except Exception:  # one service's undecodable row must not stop the others: read each alone
            log.exception("cannot read every service's state at once; reading each service alone this pass")
            reads = None
        for service in services:
            if fence is not None and service.name not in fence.tokens:
                others.add(service.name)
                continue
            try:
                snapshots.append(self._snapshot(service, table, now, reads))
            except Exception:  # one service's unreadable state must not stop the others' passes
                log.exception("cannot read service %s; leaving it alone this pass", service.name)
                unreadable.add(service.name)
        return snapshots, unreadable, others

    def _snapshot(self, service: ServiceRecord, table: ReplicaTable, now: float,
                  reads: ServiceReads | None) -> ServiceSnapshot:
        """The service's snapshot: the memo's while its counter stands and what every pass reads anyway is
        as it was, else one read afresh (and kept)."""
        snapshot = read_snapshot(self._store, service, table.by_service.get(service.name, ()), now, self._settings,
                                 self._lb_runner.is_alive, self._versions, reads,
                                 self._memos.last_snapshot(service.name))
        self._memos.keep_snapshot(snapshot)
        return snapshot

    def _find_owned_elsewhere(self, observation: Observation, snapshots: Sequence[ServiceSnapshot],
                              others: set[str]) -> set[str]:
        """Services of listed instances that this pass did not read but that exist now: created (and
        claimed, and launched by another controller) after this pass read the services. An instance is an
        orphan of this controller only when its service is its own, or is gone from the database: a service
        is deleted only after its replicas' instances were terminated, so one listed before this re-read
        and still without a service really is left over."""
        known = others.union(snapshot.service.name for snapshot in snapshots)
        strangers = {i.service for found in observation.instances.values() for i in found} - known
        if not strangers:
            return set()
        return set(self._store.find_existing_services(strangers))  # by name: the table is not scanned again

    def _plan(self, snapshots: Sequence[ServiceSnapshot], unreadable: set[str], observation: Observation,
              index: InstanceIndex, table: ReplicaTable) -> PassPlan:
        """``plan_pass``, one service at a time: a service whose planning raises is left alone (and its
        instances are not orphans) while the others are planned."""
        now = self._clock.now()
        parts = []
        self._memos.next_pass()
        for snapshot in snapshots:
            try:
                parts.append(plan_service_pass(snapshot, index, observation.probes, now, self._settings,
                                               self._memos))
            except Exception:  # a planning bug for one service must not stop the others' passes
                log.exception("planning service %s failed; leaving it alone this pass", snapshot.service.name)
                unreadable.add(snapshot.service.name)
        parts.append(plan_orphans(table, observation, unreadable))
        return merge_plans(parts)

    def _observe(self, snapshots: Sequence[ServiceSnapshot], table: ReplicaTable
                 ) -> tuple[Observation, InstanceIndex]:
        """What the providers list and the probes answer, and the index of those instances (built once:
        probing and planning both look every replica's instance up in it)."""
        instances: dict[str, Sequence[Instance]] = {}
        wanted = _find_spec_regions(snapshots)
        for cloud in self._clouds_in_use(wanted, table.regions):
            provider = self._providers[cloud]
            regions = sorted(r for r in wanted.get(cloud, set()) | table.regions.get(cloud, frozenset()) if r)
            try:
                found = provider.list_instances(regions)
            except ProviderError as exc:
                log.warning("inventory of %s unavailable this pass: %s", cloud, exc)
                continue
            unlisted = self._look_up_unlisted(provider, cloud, table.watched.get(cloud, frozenset()), found, regions)
            instances[cloud] = [*found, *unlisted] if unlisted else found
        partial = Observation(instances=instances, known_clouds=frozenset(instances))
        index = InstanceIndex(partial)
        probes = self._prober.probe(find_probe_targets(snapshots, index))
        return Observation(instances=partial.instances, known_clouds=partial.known_clouds, probes=probes), index

    @staticmethod
    def _look_up_unlisted(provider: Provider, cloud: str, watched: frozenset[str],
                          listed: Sequence[Instance], regions: Sequence[str]) -> list[Instance]:
        """Instances of live or departing replicas (``watched``) that the listing left out, looked up by id:
        a listing can lag launches, and before a replica is failed or forgotten its instance is asked for
        directly."""
        missing = sorted(watched.difference(i.instance_id for i in listed))
        if not missing:
            return []
        try:
            return provider.find_instances(missing, regions)
        except ProviderError as exc:
            log.warning("looking up %d unlisted %s instances failed this pass: %s", len(missing), cloud, exc)
            return []

    def _clouds_in_use(self, spec_regions: Mapping[str, set[str | None]],
                       replica_regions: Mapping[str, frozenset[str | None]]) -> list[str]:
        """Every configured cloud that a service's version or a replica uses; local is always listed (it is
        cheap) so that processes left by a crashed controller are found even with no service left."""
        used = set(spec_regions) | set(replica_regions)
        return sorted(cloud for cloud in self._providers if cloud in used or cloud == "local")


def _find_spec_regions(snapshots: Sequence[ServiceSnapshot]) -> dict[str, set[str | None]]:
    """The regions every version a service or its replicas run may use, by the version's cloud: one scan
    for every cloud's questions (whether to list it, and where)."""
    regions: dict[str, set[str | None]] = {}
    for snapshot in snapshots:
        for cloud, region in snapshot.regions:  # of the current version and every one a replica runs
            regions.setdefault(cloud, set()).add(region)
    return regions

