"""Reading what a pass (or an update forecast) starts from: each service as the store holds it.

The controller's pass and `serve update --dry-run` read services through this one module, so the plan a
dry-run shows starts from exactly the state a pass would see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from skyserve_lite.autoscalers.base import Metrics
from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.state.models import ReplicaRecord, ServiceRecord, VersionRecord
from skyserve_lite.state.store import Store

# A load balancer report older than this belongs to a load balancer that is gone: its in-flight counts
# mean nothing now.
REPORT_STALE_SECONDS = 10.0


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


def read_snapshot(store: Store, service: ServiceRecord, replicas: Sequence[ReplicaRecord], now: float,
                  settings: ControllerSettings, is_lb_alive: Callable[[int], bool],
                  versions: VersionCache, *, terminate_requested: frozenset[int] = frozenset()) -> ServiceSnapshot:
    """``service`` with the versions it and its replicas run, its autoscaler state and load metrics.

    Raises what the store raises (a version row that is missing or cannot be parsed): the caller decides
    whether that stops one service or everything.
    """
    records = {v: versions.get(store, service, v) for v in {service.current_version, *(r.version for r in replicas)}}
    lb_alive = service.lb_pid is not None and is_lb_alive(service.lb_pid)
    mode = UpdateMode.of_version(records[service.current_version].mode)
    stored = store.get_autoscaler_state(service.name)
    return ServiceSnapshot(
        service, {v: record.spec for v, record in records.items()}, tuple(replicas), lb_alive, mode,
        autoscaler=stored[0] if stored else None, observed=stored[1] if stored else None,
        metrics=read_metrics(store, service.name, now, settings),
        reuse_identical_files=records[service.current_version].reuse_identical_files,
        terminate_requested=terminate_requested)


def read_metrics(store: Store, service: str, now: float, settings: ControllerSettings) -> Metrics:
    """Requests of the request window, and the load balancer's report if it is fresh."""
    window = settings.autoscaler_window_seconds
    requests = store.count_requests(service, since_second=int(now - window))
    report = store.get_lb_report(service)
    if report is None or now - report.reported_at > REPORT_STALE_SECONDS:
        return Metrics(now=now, requests_in_window=requests, window_seconds=window)
    return Metrics(now=now, requests_in_window=requests, window_seconds=window, waiting_requests=report.waiting,
                   ongoing_requests_by_url=report.in_flight)
