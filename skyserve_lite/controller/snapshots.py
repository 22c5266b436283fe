"""Reading what a pass (or an update forecast) starts from: each service as the store holds it.

The controller's pass and `serve update --dry-run` read services through this one module, so the plan a
dry-run shows starts from exactly the state a pass would see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.controller.pass_types import ServiceLoad, ServiceSnapshot
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.state.models import (
    AutoscalerObservation,
    LbReport,
    ReplicaRecord,
    ServiceRecord,
    StoredCanary,
    VersionRecord,
)
from skyserve_lite.state.store import LB_REPORT_STALE_SECONDS, Store

# A load balancer report older than this belongs to a load balancer that is gone: its in-flight counts
# mean nothing now. The store's threshold for leaving one host's report out of the sum, so that the two
# never disagree about which load balancers are gone.
REPORT_STALE_SECONDS = LB_REPORT_STALE_SECONDS


class VersionCache:
    """Stored versions never change, so they (and their parsed specs) are kept across passes.

    Keyed by the service's ``created_at`` too: a service re-created under the same name is another one.
    """

    def __init__(self) -> None:
        self._versions: dict[tuple[str, int, float], VersionRecord] = {}

    def get(self, store: Store, service: ServiceRecord, version: int) -> VersionRecord:
        """The stored version; raises ``NotFoundError`` when the store has no such version."""
        key = (service.name, version, service.created_at)
        record = self._versions.get(key)
        if record is None:
            record = self._versions[key] = store.get_version(service.name, version)
        return record


@dataclass(frozen=True)
class ServiceReads:
    """What a pass reads of every service besides its row and replicas: autoscaler states, the request
    window's counts, load balancer reports and operator requests, by service name.

    ``read_all`` reads them for every service in four queries, whatever the number of services (a query
    per service and kind was 3,000 queries a pass for 1,000 services); ``read_one`` reads one service's."""

    autoscalers: Mapping[str, tuple[AutoscalerState, AutoscalerObservation]]
    requests: Mapping[str, int]
    reports: Mapping[str, LbReport]
    terminate_requested: Mapping[str, frozenset[int]]
    # Canary and watched rollouts, stored (one small table, read whole: ``Store.list_canaries``).
    canaries: Mapping[str, StoredCanary] = field(default_factory=dict)

    @classmethod
    def read_all(cls, store: Store, now: float, settings: ControllerSettings) -> ServiceReads:
        asked: dict[str, set[int]] = {}
        for name, replica_id in store.list_replica_terminations():
            asked.setdefault(name, set()).add(replica_id)
        return cls(autoscalers=store.list_autoscaler_states(),
                   requests=store.count_requests_since(int(now - settings.autoscaler_window_seconds)),
                   reports=store.list_lb_reports(),
                   terminate_requested={name: frozenset(ids) for name, ids in asked.items()},
                   canaries=store.list_canaries())

    @classmethod
    def read_one(cls, store: Store, name: str, now: float, settings: ControllerSettings) -> ServiceReads:
        stored = store.get_autoscaler_state(name)
        report = store.get_lb_report(name)
        asked = frozenset(i for service, i in store.list_replica_terminations() if service == name)
        return cls(autoscalers={name: stored} if stored else {},
                   requests={name: store.count_requests(name, int(now - settings.autoscaler_window_seconds))},
                   reports={name: report} if report else {}, terminate_requested={name: asked},
                   canaries=store.list_canaries(name))


def read_snapshot(store: Store, service: ServiceRecord, replicas: Sequence[ReplicaRecord], now: float,
                  settings: ControllerSettings, is_lb_alive: Callable[[int], bool],
                  versions: VersionCache, reads: ServiceReads | None = None,
                  last: ServiceSnapshot | None = None) -> ServiceSnapshot:
    """``service`` with the versions it and its replicas run, its autoscaler state and its load (from
    ``reads``, or read for this service alone when None).

    ``last``: the snapshot the previous pass read of this service, given only while nothing it was read from
    changed in the database (the service's change counter stands: ``controller.settled``). When what is
    read every pass anyway (the load balancer's liveness, the load, the autoscaler's row, the termination
    requests) equals what it holds, it is returned itself: a settled service costs a pass a few comparisons,
    not a snapshot built again.

    Raises what the store raises (a version row that is missing or cannot be parsed): the caller decides
    whether that stops one service or everything.
    """
    if reads is None:
        reads = ServiceReads.read_one(store, service.name, now, settings)
    lb_alive = service.lb_pid is not None and is_lb_alive(service.lb_pid)
    stored = reads.autoscalers.get(service.name)
    load = compute_load(reads, service.name, now, settings)
    terminate = reads.terminate_requested.get(service.name, frozenset())
    # A canary's stored step and its window's counts move without a replica row moving: read afresh while
    # one is under way (a finished one's row stays as it was).
    stored_canary = reads.canaries.get(service.name)
    if (last is not None and (stored_canary is None or stored_canary.state.is_done) and last.canary == stored_canary
            and last.lb_alive == lb_alive
            and (last.autoscaler, last.observed) == (stored or (None, None))
            and (last.load is load or last.load == load) and last.terminate_requested == terminate):
        return last
    records = {v: versions.get(store, service, v) for v in {service.current_version, *(r.version for r in replicas)}}
    mode = UpdateMode.of_version(records[service.current_version].mode)
    canary, counts = read_canary(store, service, stored_canary) if stored_canary is not None else (None, {})
    return ServiceSnapshot(
        service, {v: record.spec for v, record in records.items()}, tuple(replicas), lb_alive, mode,
        autoscaler=stored[0] if stored else None, observed=stored[1] if stored else None, load=load,
        reuse_identical_files=records[service.current_version].reuse_identical_files,
        terminate_requested=terminate, canary=canary, canary_counts=counts)


def read_canary(store: Store, service: ServiceRecord, stored: StoredCanary
                ) -> tuple[StoredCanary | None, dict[int, dict[str, int]]]:
    """The service's stored canary (or watched) rollout, and the per-version counts since its bake window
    started (none before it started, or for a row of an earlier version's rollout)."""
    state = stored.state
    start = None if state.version != service.current_version or state.is_done else state.window_start
    return stored, ({} if start is None else store.count_versions_since(service.name, int(start)))


def compute_load(reads: ServiceReads, service: str, now: float, settings: ControllerSettings) -> ServiceLoad:
    """Requests of the request window, and the load balancer's report if it is fresh."""
    window = settings.autoscaler_window_seconds
    requests = reads.requests.get(service, 0)
    report = reads.reports.get(service)
    if report is None or now - report.reported_at > REPORT_STALE_SECONDS:
        return _reported_by_requests(requests, window)
    return ServiceLoad(requests_in_window=requests, window_seconds=window, waiting_requests=report.waiting,
                       ongoing_requests_by_url=report.in_flight)


@lru_cache(maxsize=1024)
def _reported_by_requests(requests: int, window: float) -> ServiceLoad:
    """The load of a service without a fresh report: one value per count (values are frozen), so that a
    pass over 1,000 quiet services builds none and compares each with its last by identity."""
    return ServiceLoad(requests_in_window=requests, window_seconds=window)
