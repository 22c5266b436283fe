"""One reconcile pass: read the store, observe providers and probes, decide (pure), apply (executor)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from skyserve_lite.autoscalers.base import Metrics
from skyserve_lite.clock import Clock
from skyserve_lite.controller.executor import Executor
from skyserve_lite.controller.lb_runner import LoadBalancerRunner
from skyserve_lite.controller.plan import (
    Observation,
    PassPlan,
    ServiceSnapshot,
    find_probe_targets,
    plan_pass,
)
from skyserve_lite.controller.probe import Prober
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import ProviderError
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.providers.base import Instance, Provider
from skyserve_lite.state.models import ReplicaRecord, VersionRecord
from skyserve_lite.state.store import Store

log = logging.getLogger(__name__)

_REPORT_STALE_SECONDS = 10.0


class Reconciler:
    """Owns nothing but its dependencies; ``reconcile_once`` is the whole behaviour. Not thread-safe."""

    def __init__(self, store: Store, providers: Mapping[str, Provider], prober: Prober,
                 lb_runner: LoadBalancerRunner, clock: Clock, settings: ControllerSettings) -> None:
        self._store = store
        self._providers = providers
        self._prober = prober
        self._lb_runner = lb_runner
        self._clock = clock
        self._settings = settings
        self._executor = Executor(store, providers, lb_runner, clock)
        # Versions never change once stored, so they (and their parsed specs) are cached across passes.
        self._versions: dict[tuple[str, int, float], VersionRecord] = {}

    def reconcile_once(self) -> PassPlan:
        """Run one pass and return the plan it applied. Provider errors do not escape."""
        snapshots = self._read()
        observation = self._observe(snapshots)
        plan = plan_pass(snapshots, observation, self._clock.now(), self._settings)
        if not plan.is_empty:
            self._executor.apply(plan)
        return plan

    def _read(self) -> list[ServiceSnapshot]:
        replicas_by_service: dict[str, list[ReplicaRecord]] = {}
        for replica in self._store.list_replicas():
            replicas_by_service.setdefault(replica.service, []).append(replica)
        snapshots = []
        for service in self._store.list_services():
            replicas = tuple(replicas_by_service.get(service.name, ()))
            versions = {v: self._version(service.name, v, service.created_at)
                        for v in {service.current_version, *(r.version for r in replicas)}}
            lb_alive = service.lb_pid is not None and self._lb_runner.is_alive(service.lb_pid)
            mode = UpdateMode.of_version(versions[service.current_version].mode)
            stored = self._store.get_autoscaler_state(service.name)
            snapshots.append(ServiceSnapshot(
                service, {v: record.spec for v, record in versions.items()}, replicas, lb_alive, mode,
                autoscaler=stored[0] if stored else None, observed=stored[1] if stored else None,
                metrics=self._metrics(service.name)))
        return snapshots

    def _metrics(self, service: str) -> Metrics:
        """Requests of the last minute, and the load balancer's report if it is fresh (a report older than
        10 s belongs to a load balancer that is gone, and its in-flight counts mean nothing now)."""
        now = self._clock.now()
        window = self._settings.autoscaler_window_seconds
        requests = self._store.count_requests(service, since_second=int(now - window))
        report = self._store.get_lb_report(service)
        if report is None or now - report.reported_at > _REPORT_STALE_SECONDS:
            return Metrics(now=now, requests_in_window=requests, window_seconds=window)
        return Metrics(now=now, requests_in_window=requests, window_seconds=window, waiting_requests=report.waiting,
                       ongoing_requests_by_url=report.in_flight)

    def _version(self, service: str, version: int, created_at: float) -> VersionRecord:
        # created_at tells a re-created service of the same name apart from the one it replaced.
        key = (service, version, created_at)
        if key not in self._versions:
            self._versions[key] = self._store.get_version(service, version)
        return self._versions[key]

    def _observe(self, snapshots: Sequence[ServiceSnapshot]) -> Observation:
        instances: list[tuple[str, Instance]] = []
        known: set[str] = set()
        for cloud in self._clouds_in_use(snapshots):
            provider = self._providers[cloud]
            try:
                found = provider.list_instances(self._regions_in_use(snapshots, cloud))
            except ProviderError as exc:
                log.warning("inventory of %s unavailable this pass: %s", cloud, exc)
                continue
            known.add(cloud)
            instances.extend((cloud, instance) for instance in found)
        partial = Observation(instances=tuple(instances), known_clouds=frozenset(known))
        probes = self._prober.probe(find_probe_targets(snapshots, partial))
        return Observation(instances=partial.instances, known_clouds=partial.known_clouds, probes=probes)

    @staticmethod
    def _regions_in_use(snapshots: Sequence[ServiceSnapshot], cloud: str) -> list[str]:
        regions = {s.spec.resources.region for s in snapshots if s.spec.resources.cloud.value == cloud}
        regions |= {r.region for s in snapshots for r in s.replicas if r.cloud == cloud}
        regions |= {spec.resources.region for s in snapshots for spec in s.versions.values()
                    if spec.resources.cloud.value == cloud}
        return sorted(region for region in regions if region)

    def _clouds_in_use(self, snapshots: Sequence[ServiceSnapshot]) -> list[str]:
        """Every configured cloud that a service or replica uses; local is always listed (it is cheap)
        so that processes left by a crashed controller are found even with no service left."""
        used = {s.spec.resources.cloud.value for s in snapshots}
        used |= {r.cloud for s in snapshots for r in s.replicas}
        return sorted(cloud for cloud in self._providers if cloud in used or cloud == "local")
