"""What the CLI (and tests, and scripts) call: up, status, down, logs, against "a controller".

``Controller`` is the one boundary between the CLI and whatever holds the state: ``LocalController``
is the state directory on this machine with its background controller process; a controller VM reached
over SSH is another implementation of the same protocol. The CLI never opens the store itself.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from skyserve_lite import procs
from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.autoscalers.target import compute_target_replicas
from skyserve_lite.clock import Clock, SystemClock, format_timestamp
from skyserve_lite.controller.daemon import controller_log_path, ensure_controller, stop_controller
from skyserve_lite.controller.host import load_host_settings
from skyserve_lite.controller.lb_runner import LB_PORT_END, LB_PORT_START, find_lb_port, lb_log_path
from skyserve_lite.controller.pidfile import PID_FILE as CONTROLLER_PID_FILE
from skyserve_lite.controller.pidfile import find_controller, read_controller_pid
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.defaults import DEFAULT_EVENTS as DEFAULT_EVENTS  # re-exported: the clients import it here
from skyserve_lite.errors import (
    ControllerError,
    MissingBlobsError,
    NotFoundError,
    ProviderError,
    SpecError,
    StateConflictError,
    UsageError,
    WaitTimeoutError,
)
from skyserve_lite.host_endpoints import EndpointView
from skyserve_lite.plan.canary import (
    CanaryPhase,
    CanarySettings,
    CanaryStart,
    CanaryState,
    Command,
    VersionCounts,
    compute_counts,
    find_canary_settings,
    format_percent,
    format_seconds,
)
from skyserve_lite.spec.inputs import BoundInputs, bind, find_missing, merge_envs
from skyserve_lite.spec.model import Cloud, Secret, ServiceSpec, SubmittedTask, TaskInputs, TaskSpec
from skyserve_lite.spec.parse import is_valid_service_name, parse_task, to_service_name
from skyserve_lite.state.history import ServiceHistory, compute_service_history, history_start_minute
from skyserve_lite.state.models import (
    AutoscalerObservation,
    EventRecord,
    LbEndpoint,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceStatus,
    StoredCanary,
    VersionRecord,
)
from skyserve_lite.state.store import Store

if TYPE_CHECKING:
    from skyserve_lite.controller.fleet import ControllerView
    from skyserve_lite.endpoint_identity import EndpointIdentity
    from skyserve_lite.files.blobs import BlobStore
    from skyserve_lite.forcedown import ForceDownReport
    from skyserve_lite.plan.placement import LaunchPlan
    from skyserve_lite.plan.rollout import UpdateMode
    from skyserve_lite.plan.update import UpdatePlan
    from skyserve_lite.providers.base import ReplicaLog
    from skyserve_lite.spec.placement import Resolution
    from skyserve_lite.state.secrets import SecretStore

# What only some calls need is imported by them (forecasting, providers and their log type, force-down,
# capturing files, secrets, config comparisons, log selection): a status read, which a controller host
# answers in a process of its own per call, stays cheap to start.


@dataclass(frozen=True)
class ServiceView:
    """Everything `serve status` shows of one service."""

    service: ServiceRecord
    policy: str
    load_balancing_policy: str
    replicas: tuple[ReplicaRecord, ...]
    events: tuple[EventRecord, ...]
    autoscaler: tuple[AutoscalerState, AutoscalerObservation] | None = None
    history: ServiceHistory | None = None  # the last hour, of a service whose policy autoscales
    # How many replicas the controller steers to for the current version (the autoscaler's target within
    # the bounds, plus num_overprovision); None before its first pass over that version.
    target_replicas: int | None = None
    # The state's controller id, which the service's endpoint must answer with (``endpoint_identity``); None from
    # a host that does not say.
    controller_id: str | None = None
    # What the service's load balancers recorded once they listened (address bound, pid), one per host.
    lb_endpoints: tuple[LbEndpoint, ...] = ()
    # Only in `serve status`: why the endpoint does not answer as this service, for a service whose
    # replicas say it should (None: it does, or it is not expected to).
    endpoint_problem: str | None = None
    # The canary rollout of the current version (or the one just rolled back); None: none.
    canary: CanaryView | None = None
    # Only in `serve status`: the service's endpoint on every controller host, and which answer as it
    # (``host_endpoints``); empty from a host of an older sky-lite, which does not ask them.
    endpoints: tuple[EndpointView, ...] = ()

    def autoscaler_json(self) -> dict[str, Any] | None:
        if self.autoscaler is None:
            return None
        state, observed = self.autoscaler
        return {"policy": observed.policy, "target_replicas": state.target, "raw_target": observed.raw_target,
                "qps": observed.qps, "average_ongoing_requests": observed.average_ongoing,
                "held_back": observed.held_back, "decided_at": format_timestamp(state.last_decision_at)}

    @property
    def active_versions(self) -> list[int]:
        """Versions the load balancer sends traffic to (the controller decides them per rollout step)."""
        if self.service.active_versions is not None:
            return list(self.service.active_versions)
        return [self.service.current_version]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.service.name,
            "status": self.service.status.value,
            "status_reason": self.service.status_reason,
            "version": self.service.current_version,
            "active_versions": self.active_versions,
            "endpoint": self.service.endpoint,
            "endpoint_problem": self.endpoint_problem,
            "load_balancers": [{"host": e.host, "address": e.address, "pid": e.pid,
                                "bound_at": format_timestamp(e.bound_at)} for e in self.lb_endpoints],
            "policy": self.policy,
            "load_balancing_policy": self.load_balancing_policy,
            "autoscaler": self.autoscaler_json(),
            "replicas": [
                {
                    "replica_id": r.replica_id, "version": r.version, "status": r.status.value,
                    "status_reason": r.status_reason, "cloud": r.cloud, "region": r.region, "zone": r.zone,
                    "instance_id": r.instance_id, "instance_type": r.instance_type, "accelerator": r.accelerator,
                    "url": r.url, "is_spot": r.is_spot, "launched_at": format_timestamp(r.launched_at),
                }
                for r in self.replicas
            ],
            "events": [
                {"time": format_timestamp(e.time), "replica_id": e.replica_id, "kind": e.kind, "message": e.message}
                for e in self.events
            ],
            "history": None if self.history is None else self.history.to_json(),
            "canary": None if self.canary is None else self.canary.to_json(),
        }


@dataclass(frozen=True)
class CanaryView:
    """A canary rollout as `serve status` shows it: the stored state, the new version's share now, a command
    not yet acted on, and what the load balancers counted of each side since the step's window started."""

    state: CanaryState
    percent: int
    new: VersionCounts
    old: VersionCounts
    command: Command | None = None

    def describe(self) -> str:
        """``version 4: step 1 of 2, 10% (window from 2026-12-02T14:02:10Z, bake 2m); 5xx new 1.2% (2/160),
        old 0.4% (6/1440), limit 2%``, or the verdict once it is over."""
        state = self.state
        if state.is_done:
            return state.verdict or f"version {state.version}: {state.phase.value}"
        settings = state.settings
        rates = (f"5xx new {format_percent(self.new.error_rate)} ({self.new.errors}/{self.new.requests}), old "
                 f"{format_percent(self.old.error_rate)} ({self.old.errors}/{self.old.requests}), limit "
                 f"{format_percent(settings.max_error_rate)}")
        if state.phase is CanaryPhase.WATCHING:
            if state.window_start is None:
                return f"version {state.version}: watched for an automatic rollback once it takes traffic"
            return (f"version {state.version}: watched for an automatic rollback (window from "
                    f"{format_timestamp(state.window_start)}, bake "
                    f"{format_seconds(state.window_seconds)}); {rates}")
        where = f"version {state.version}: step {state.step + 1} of {len(settings.steps)}, {self.percent}%"
        if state.window_start is None:
            where += f" (launching for {settings.steps[state.step]}%)"
        else:
            where += (f" (window from {format_timestamp(state.window_start)}, bake "
                      f"{format_seconds(state.window_seconds)})")
        if state.paused:
            where += ", PAUSED"
        if self.command is not None:
            where += f", {self.command.value} asked"
        return f"{where}; {rates}"

    def to_json(self) -> dict[str, Any]:
        state = self.state
        return {
            "version": state.version, "phase": state.phase.value, "step": state.step, "percent": self.percent,
            "window_start": None if state.window_start is None else format_timestamp(state.window_start),
            "extensions": state.extensions, "paused": state.paused, "verdict": state.verdict,
            "command": None if self.command is None else self.command.value, "settings": state.settings.to_json(),
            "new": {"requests": self.new.requests, "errors": self.new.errors, "error_rate": self.new.error_rate},
            "old": {"requests": self.old.requests, "errors": self.old.errors, "error_rate": self.old.error_rate},
        }


def read_canary_view(store: Store, service: ServiceRecord, stored: StoredCanary | None) -> CanaryView | None:
    """The canary rollout of ``service``'s current version, or of the version its rollback replaced, from its
    ``stored`` row (``Store.list_canaries``; None: it has none)."""
    if stored is None:
        return None
    state = stored.state
    current = service.current_version
    if state.version != current and not (state.phase is CanaryPhase.ROLLED_BACK and state.version == current - 1):
        return None
    counts = {} if state.window_start is None else store.count_versions_since(service.name, int(state.window_start))
    new, old = compute_counts(counts, state.version)
    return CanaryView(state, stored.percent, new, old, stored.command)


@dataclass(frozen=True)
class RolloutState:
    """What planning an update needs: the service, its stored versions and its replicas."""

    service: ServiceRecord
    versions: tuple[VersionRecord, ...]
    replicas: tuple[ReplicaRecord, ...]
    autoscaler: AutoscalerState | None = None

    def version(self, number: int) -> VersionRecord:
        for record in self.versions:
            if record.version == number:
                return record
        raise NotFoundError(f"service {self.service.name!r} has no version {number}; "
                            f"see `sky-lite serve history {self.service.name}`")


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    created_at: float
    mode: str
    summary: str
    note: str | None
    files_digest: str | None = None  # the snapshot of its workdir and file mounts
    files_size: int | None = None
    files_expired: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "created_at": format_timestamp(self.created_at), "mode": self.mode,
                "summary": self.summary, "note": self.note,
                "files": None if self.files_digest is None and not self.files_expired else
                {"digest": self.files_digest, "size": self.files_size, "expired": self.files_expired}}


@dataclass(frozen=True)
class ControllerStatus:
    running: bool
    pid: int | None = None
    services: int = 0  # services stored; with none running, nobody reconciles them
    last_pass_at: float | None = None  # when a pass last completed (None: none yet)
    checked_at: float = 0.0
    stale_after: float = 30.0  # a running controller whose last pass is older than this may be stuck

    @property
    def unverified_for(self) -> float | None:
        """Seconds since the last completed pass when that is too long ago for a running controller (it
        cannot write its state: a full disk, say): nothing status shows has been checked since."""
        if not self.running or self.last_pass_at is None:
            return None
        age = self.checked_at - self.last_pass_at
        return age if age > self.stale_after else None

    def to_json(self) -> dict[str, Any]:
        return {"running": self.running, "pid": self.pid, "last_pass_at": format_timestamp(self.last_pass_at),
                "unverified_for_seconds": None if self.unverified_for is None else round(self.unverified_for)}


@dataclass(frozen=True)
class StatusReport:
    """What `serve status` shows, read in one call: the services and whether a controller acts on them."""

    services: tuple[ServiceView, ...]
    controller: ControllerStatus


class Controller(Protocol):
    """The CLI's one door to a controller. Every method is safe to retry."""

    def create_service(self, name: str, task: SubmittedTask, *, endpoint_port: int | None = None) -> ServiceRecord:
        """Store ``task`` as version 1 of a new service and make sure a controller acts on it; with
        ``endpoint_port`` its load balancer listens there and nowhere else (refused when taken)."""
        ...

    def get_status(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> list[ServiceView]:
        """Views of the named services (all when empty), each with its newest ``events`` and, when its policy
        autoscales, its last hour (``history``). Raises ``NotFoundError`` for an unknown name."""
        ...

    def get_status_report(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> StatusReport:
        """``get_status`` and ``controller_status`` in one call (one round trip to a remote controller)."""
        ...

    def get_rollout_state(self, name: str) -> RolloutState:
        """The service with every stored version and its replicas. Raises ``NotFoundError``."""
        ...

    def plan_create(self, name: str, task: SubmittedTask) -> LaunchPlan:
        """What ``create_service`` would start (`serve up --dry-run`): validated and resolved as a submission
        is, without storing anything or contacting a cloud."""
        ...

    def plan_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                    reuse_identical_files: bool = False, canary: CanarySettings | None = None) -> UpdatePlan:
        """What making ``task`` the next version would do, replica by replica: the controller's own passes
        run forward over the service's current state (``controller.forecast``), with the task's files
        hashed (not stored) so the plan can compare them. Changes nothing. ``canary``: the settings of a
        canary update (None: the task's `service.canary`, else the defaults)."""
        ...

    def submit_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                      expect_version: int | None = None, note: str | None = None,
                      reuse_identical_files: bool = False, canary: CanarySettings | None = None) -> VersionRecord:
        """Capture the task's files and store it as the next version; the controller rolls it out (a canary
        update with ``canary``, or the task's `service.canary`, or the defaults; a rolling or blue-green one
        given ``canary`` is watched with its bake and limit and rolled back automatically). Raises
        ``StateConflictError`` when ``expect_version`` is not the current version, ``SpecError`` when its
        files cannot be captured (nothing stored either way)."""
        ...

    def request_rollout(self, name: str, command: Command) -> None:
        """A person's decision on service NAME's canary rollout (`serve rollout NAME promote|abort|pause|
        resume`), for the controller's next pass. Raises ``NotFoundError`` when it has no canary rollout,
        ``StateConflictError`` when that rollout is over already."""
        ...

    def controller_status(self) -> ControllerStatus:
        """Whether a controller acts on the stored services. A read: it starts nothing."""
        ...

    def start_controller(self) -> ControllerStatus:
        """Start the controller if none runs (idempotent); the start is logged in its log."""
        ...

    def request_down(self, names: Sequence[str]) -> None:
        """Ask for the services to be taken down; returns at once. Raises ``NotFoundError`` first."""
        ...

    def finish_down(self, names: Sequence[str], timeout_seconds: float) -> None:
        """Wait until the services are gone; stop the background controller when none is left."""
        ...

    def request_replica_termination(self, name: str, replica_ids: Sequence[int]) -> None:
        """Ask for these replicas of service NAME to be drained and terminated; returns at once (the controller
        launches replacements when the policy wants them). Idempotent. Raises ``NotFoundError`` for an
        unknown service or replica id and ``StateConflictError`` for a replica that is not live (FAILED,
        PREEMPTED: nothing left to terminate) or a service going down, before anything changes."""
        ...

    def stream_log(self, name: str, replica_id: int | None, *, controller: bool = False,
                   load_balancer: bool = False, follow: bool = False, tail: int | None = None,
                   since_seconds: float | None = None) -> Iterator[bytes]:
        """The bytes of a replica's log (from its provider), the service's load balancer's, or the
        controller's, in chunks; with ``follow``, new bytes as they are written, and an empty chunk each time
        the log was polled with nothing new (so a consumer may stop), until the log goes away. Of what the
        log holds when asked, only the lines at most ``since_seconds`` old (by their time prefix and the
        controller's clock) and of those the last ``tail`` (``logview.select_lines``); what follows comes
        whole. A snapshot log (a cloud console) is one chunk, followed or not. Raises ``NotFoundError``
        (before the first chunk) for an unknown service or a replica without a log."""
        ...

    def force_down(self, regions: Sequence[str] = ()) -> ForceDownReport:
        """Stop everything this state directory started, found from the provider side (the controller's pid
        file, process tags, the clouds' controller tag) without reading the store: for a damaged database.
        ``regions`` are cloud regions to search besides those it finds. Idempotent; never raises for what
        it cannot stop (the report's ``errors`` say)."""
        ...


class LocalController:
    """The controller of a state directory on this machine (``$SKY_LITE_HOME``)."""

    def __init__(self, home: Path, clock: Clock | None = None, *, start_daemon: bool = True,
                 stop_when_idle: bool = True) -> None:
        """``start_daemon``: submissions start the background controller; ``stop_when_idle``: the last
        `serve down` stops it (not on a controller host, whose loop cron keeps running anyway)."""
        self.home = home
        self._clock = clock or SystemClock()
        self._start_daemon = start_daemon
        self._stop_when_idle = stop_when_idle

    def _open(self) -> Store:
        return Store.open(self.home)

    def _shown(self, service: ServiceRecord, host: str | None = None, *, tls: bool) -> ServiceRecord:
        """``service`` with the endpoint address of this host (``controller.host``; ``host`` when the caller
        read it already), ``https://`` when ``tls`` (its current version has `service.tls`)."""
        host = host or load_host_settings(self.home).endpoint_host
        if host == service.endpoint_host and tls == service.endpoint_tls:
            return service
        return dataclasses.replace(service, endpoint_host=host, endpoint_tls=tls)

    @contextmanager
    def _submitting(self, task: SubmittedTask, previous: VersionRecord | None
                    ) -> Iterator[tuple[SubmittedTask, BoundInputs, Store, ControllerSettings]]:
        """Bind ``task``'s inputs (over ``previous``, the current version of the service an update
        replaces), check it, capture its files and open the store for storing it: the task with its
        snapshot (and no secret value left in it), its inputs to store, the store and the settings. The blob
        store's writing lock is held from the first blob written until the ``with`` body has stored the
        version that needs them (see ``files.blobs``)."""
        from skyserve_lite.files.blobs import blob_store_of

        task, inputs = bind_submission(task, previous, _secret_store(self.home), keep_secrets=True)
        settings = check_submission(task)
        blobs = blob_store_of(self.home)
        with _capture_lock(task, blobs):
            captured = _with_files(task, settings, blobs)
            _check_blobs(captured, blobs)
            store = self._open()
            try:
                yield captured, inputs, store, settings
            finally:
                store.close()

    def _current_version(self, name: str) -> VersionRecord:
        store = self._open()
        try:
            return store.get_version(name, store.get_service(name).current_version)
        finally:
            store.close()

    def create_service(self, name: str, task: SubmittedTask, *, endpoint_port: int | None = None,
                       key: str | None = None) -> ServiceRecord:
        """See ``Controller``; ``key`` is a submission's idempotency key (a retry returns the service the
        first attempt created)."""
        check_service_name(name)
        if endpoint_port is not None and not 1 <= endpoint_port <= 65535:
            raise UsageError(f"--endpoint-port: {endpoint_port} is not a port (1-65535)")
        with self._submitting(task, None) as (task, inputs, store, _settings):
            tls = task.spec.service.tls is not None
            if key is not None and store.find_submission(key) == (name, 1):
                existing = store.get_service(name)
                if existing.current_version == 1 and not existing.deleting:  # the same `serve up` again
                    return self._shown(existing, tls=tls)
                # Updated since, or going down: not a rerun any more, refused as any `serve up` of a taken name.
                key = None
            if endpoint_port is not None:
                used = store.used_lb_ports()
                if endpoint_port in used or not procs.is_port_free(endpoint_port):
                    whose = "the endpoint of another service" if endpoint_port in used else "taken on this host"
                    raise StateConflictError(f"--endpoint-port {endpoint_port}: the port is {whose}; choose another")
            # Without --endpoint-port the port is chosen inside the transaction that stores it: two `serve up`
            # at once in one home read the ports in use one after the other, never both before either wrote.
            port: int | Callable[[set[int]], int] = endpoint_port if endpoint_port is not None else _pick_lb_port
            service = self._shown(store.create_service(name, task, port, self._clock.now(), key=key,
                                                       inputs=inputs, pinned=endpoint_port is not None), tls=tls)
            store.add_events([(self._clock.now(), name, None, "service", f"version 1 submitted from "
                               f"{task.source}" + _describe_files(task))])
        if self._start_daemon:
            ensure_controller(self.home)
        return service

    def get_status(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> list[ServiceView]:
        store = self._open()
        try:
            # One read transaction: a pass that commits a service's status and then its autoscaler state must
            # not be seen half (a waiting `serve update` would read the old version's reason with the new
            # version's target, and call the rollout failed).
            with store.reading():
                return self._read_views(store, names, events)
        finally:
            store.close()

    def _read_views(self, store: Store, names: Sequence[str], events: int) -> list[ServiceView]:
        services = [store.get_service(n) for n in names] if names else store.list_services()
        host = load_host_settings(self.home).endpoint_host  # once for every service shown
        # Every service's replicas in one query (ordered by service) when all are shown: at 100 services
        # of 100 replicas, a query per service cost a third more than the rows themselves.
        # And every service's current version, autoscaler state, canary rollout and load balancer endpoints
        # in one query each (a query per service and kind was 200 of them for 100 services).
        replicas: dict[str, list[ReplicaRecord]] = {}
        if names:
            replicas = {service.name: store.list_replicas(service.name) for service in services}
            versions = {service.name: store.get_version(service.name, service.current_version)
                        for service in services}
        else:
            for replica in store.list_replicas():
                replicas.setdefault(replica.service, []).append(replica)
            versions = store.list_current_versions()
        # Named services: their own rows only (another service's undecodable row must not fail this status).
        autoscalers = store.list_autoscaler_states() if not names else {
            service.name: state for service in services if (state := store.get_autoscaler_state(service.name))}
        canaries = store.list_canaries() if not names else {
            service.name: stored for service in services if (stored := store.list_canaries(service.name).get(
                service.name))}
        lb_endpoints = store.list_lb_endpoints_of([service.name for service in services])
        views = []
        controller_id = store.controller_id
        for service in services:
            # A version missing from the batch, or not the service's current one, is asked for alone: the
            # store's error names it.
            record = versions.get(service.name)
            if record is None or record.version != service.current_version:
                record = store.get_version(service.name, service.current_version)
            spec = record.service_spec  # as stored when accepted: no YAML parsed (``VersionRecord``)
            autoscaler = autoscalers.get(service.name)
            decided = autoscaler is not None and autoscaler[0].version == service.current_version
            target = compute_target_replicas(spec.replica_policy, autoscaler[0]) \
                if autoscaler is not None and decided else None
            views.append(ServiceView(
                service=self._shown(service, host, tls=spec.tls is not None),
                policy=spec.replica_policy.describe(),
                load_balancing_policy=spec.load_balancing_policy.value,
                replicas=self._shown_replicas(store, service, spec, replicas.get(service.name, ())),
                events=tuple(store.list_events(service.name, limit=events)) if events > 0 else (),
                autoscaler=autoscaler,
                history=self._history(store, service.name) if spec.replica_policy.is_autoscaling else None,
                target_replicas=target,
                controller_id=controller_id,
                lb_endpoints=lb_endpoints.get(service.name, ()),
                canary=read_canary_view(store, service, canaries.get(service.name)),
            ))
        return views

    def _history(self, store: Store, name: str) -> ServiceHistory:
        now = self._clock.now()
        since = history_start_minute(now)
        return compute_service_history(now, store.count_requests_by_minute(name, since),
                                       store.list_replica_samples(name, since))

    def _shown_replicas(self, store: Store, service: ServiceRecord, current: ServiceSpec,
                        replicas: Sequence[ReplicaRecord]) -> tuple[ReplicaRecord, ...]:
        """The service's ``replicas``, a STARTING one's reason with how long it has waited (of its version's
        initial delay): stored without the seconds, so that waiting writes nothing."""
        now = self._clock.now()
        delays = {service.current_version: current.readiness_probe.initial_delay_seconds}
        shown = []
        starting = ReplicaStatus.STARTING
        for replica in replicas:
            if replica.status is starting and replica.status_reason:
                from skyserve_lite.controller.replica_rules import describe_starting  # only when one starts

                if replica.version not in delays:
                    spec = store.get_version(service.name, replica.version).service_spec
                    delays[replica.version] = spec.readiness_probe.initial_delay_seconds
                reason = describe_starting(replica.status_reason, now - replica.status_since, delays[replica.version])
                replica = dataclasses.replace(replica, status_reason=reason)
            shown.append(replica)
        return tuple(shown)

    def get_status_report(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> StatusReport:
        from skyserve_lite.controller.fleet import list_controller_views

        views = self.get_status(names, events=events)
        if views:
            views = check_status_endpoints(views, list_controller_views(self.home))
        return StatusReport(services=tuple(views), controller=self.controller_status())

    def controller_status(self) -> ControllerStatus:
        pid = read_controller_pid(self.home)
        store = self._open()
        try:
            services = len(store.list_services())
            last_pass_at = store.last_pass_at
        finally:
            store.close()
        try:
            interval = ControllerSettings.from_env().interval_seconds
        except UsageError:  # a status must answer; the setting's own commands report it
            interval = ControllerSettings().interval_seconds
        return ControllerStatus(running=pid is not None, pid=pid, services=services, last_pass_at=last_pass_at,
                                checked_at=self._clock.now(), stale_after=max(30.0, 10 * interval))

    def start_controller(self) -> ControllerStatus:
        pid = ensure_controller(self.home)
        return dataclasses.replace(self.controller_status(), running=True, pid=pid)

    def plan_create(self, name: str, task: SubmittedTask) -> LaunchPlan:
        from skyserve_lite.plan.placement import plan_launch

        check_service_name(name)
        if (self.home / "state.db").exists():
            store = self._open()
            try:
                if name in {s.name for s in store.list_services()}:
                    raise StateConflictError(f"service {name!r} already exists; change it with `sky-lite serve "
                                             f"update {name} TASK.yaml`")
            finally:
                store.close()
        from skyserve_lite.files.capture import check_task_sources, find_task_dir, format_size, needs_capture

        notes: list[str] = []
        task, _ = bind_submission(task, None, _secret_store(self.home), keep_secrets=False, notes=notes)
        settings = check_submission(task, notes)
        if needs_capture(task.spec):
            check_task_sources(task.spec, find_task_dir(task.source), task.source)
        task = _with_files(task, settings, blobs=None)  # hashed only
        files = task.spec.files
        plan = plan_launch(name, task.spec, None if files is None else
                           f"sha256 {files.digest[:12]} ({format_size(files.size)})")
        return dataclasses.replace(plan, notes=tuple(notes))

    def plan_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                    reuse_identical_files: bool = False, canary: CanarySettings | None = None) -> UpdatePlan:
        from skyserve_lite.controller.forecast import forecast_update
        from skyserve_lite.controller.snapshots import VersionCache, read_snapshot

        settings = ControllerSettings.from_env()
        store = self._open()
        try:
            service = store.get_service(name)
            previous = store.get_version(name, service.current_version)
            notes: list[str] = []
            task, _ = bind_submission(task, previous, _secret_store(self.home), keep_secrets=False, notes=notes)
            check_submission(task)
            task = _with_files(task, settings, blobs=None)  # hashed only: a plan stores nothing
            now = self._clock.now()
            snapshot = read_snapshot(store, service, store.list_replicas(name), now, settings,
                                     procs.is_alive, VersionCache())
        finally:
            store.close()
        plan = forecast_update(snapshot, service.current_version + 1, task.spec, mode, now, settings,
                               reuse_identical_files=reuse_identical_files, canary=canary)
        return dataclasses.replace(plan, notes=plan.notes + tuple(notes))

    def get_rollout_state(self, name: str) -> RolloutState:
        store = self._open()
        try:
            service = store.get_service(name)
            stored = store.get_autoscaler_state(name)
            return RolloutState(service=service, versions=tuple(store.list_versions(name)),
                                replicas=tuple(store.list_replicas(name)), autoscaler=stored[0] if stored else None)
        finally:
            store.close()

    def submit_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                      expect_version: int | None = None, note: str | None = None,
                      reuse_identical_files: bool = False, key: str | None = None,
                      canary: CanarySettings | None = None) -> VersionRecord:
        """See ``Controller``; ``key`` is a submission's idempotency key (a retry returns the version the
        first attempt stored, and stores nothing). It is stored with the version it was applied on top of
        (``submission_key``): the same key answers with the version it stored only while that version is
        still the current one, so the same task submitted again after another update is a new update."""
        previous = self._current_version(name)
        with self._submitting(task, previous) as (task, inputs, store, settings):
            if key is not None:
                current = previous.version
                stored = store.find_submission(submission_key(key, current - 1)) == (name, current)
                if stored and not store.get_service(name).deleting:  # a service going down is not replayed
                    return store.get_version(name, current)
                key = submission_key(key, current)
            # The rollout starts in the version's own transaction: the flags, else the task's `service.canary`,
            # else the defaults for a canary; a rolling or blue-green one with --auto-rollback is watched with
            # the flags'. Two writes would leave a crash between them starting it from the task's, flags lost.
            start = (CanaryStart(find_canary_settings(task.spec.service.canary, canary)) if mode.value == "canary"
                     else None if canary is None else CanaryStart(canary, watch=True))
            version = store.add_version(name, task, mode.value, self._clock.now(),
                                        expect_version=expect_version, note=note,
                                        reuse_identical_files=reuse_identical_files,
                                        keep_snapshot_versions=settings.keep_snapshot_versions, key=key,
                                        inputs=inputs, canary=start)
            store.add_events([(self._clock.now(), name, None, "service",
                               f"version {version.version} submitted ({mode.value}"
                               + (f", {note}" if note else "") + f") from {task.source}"
                               + _describe_files(task))])
        if self._start_daemon:
            ensure_controller(self.home)
        return version

    def request_rollout(self, name: str, command: Command) -> None:
        store = self._open()
        try:
            service = store.get_service(name)
            stored = store.list_canaries(name).get(name)
            if stored is None or stored.state.version != service.current_version:
                raise NotFoundError(f"service {name!r} has no canary rollout of its current version "
                                    f"{service.current_version}; see `sky-lite serve status {name}`")
            if stored.state.phase is CanaryPhase.WATCHING:
                raise StateConflictError(f"version {stored.state.version} of {name!r} is an update watched for an "
                                         f"automatic rollback, not a canary: nothing to {command.value}; "
                                         f"`sky-lite serve rollback {name}` rolls it back")
            if stored.state.is_done:
                raise StateConflictError(f"the canary rollout of version {stored.state.version} of {name!r} is "
                                         f"over ({stored.state.phase.value}); nothing to {command.value}")
            # Asked of a rollout in the other state, the command would be dropped by the next pass unsaid. A
            # pause or resume not acted on yet counts as done: the later command replaces it (the store's
            # contract), so `resume` then `pause` within a pass leaves it paused, as the person last asked.
            paused = stored.state.paused
            if stored.command is Command.PAUSE:
                paused = True
            elif stored.command is Command.RESUME:
                paused = False
            if command is not stored.command:  # the same one again is stored again, and the CLI says so
                if command is Command.RESUME and not paused:
                    raise StateConflictError(f"the canary rollout of version {stored.state.version} of {name!r} "
                                             "is not paused; nothing to resume")
                if command is Command.PAUSE and paused:
                    raise StateConflictError(f"the canary rollout of version {stored.state.version} of {name!r} "
                                             "is paused already; `resume`, `promote` or `abort` decides")
            store.request_canary_command(name, command)
        finally:
            store.close()
        if self._start_daemon:
            ensure_controller(self.home)

    def request_down(self, names: Sequence[str]) -> None:
        store = self._open()
        try:
            for name in names:
                store.get_service(name)  # every name must exist before anything changes
            store.mark_deleting(names)
        finally:
            store.close()
        if self._start_daemon and names:
            ensure_controller(self.home)

    def request_replica_termination(self, name: str, replica_ids: Sequence[int]) -> None:
        store = self._open()
        try:
            replicas = {r.replica_id: r for r in store.list_replicas(name)}
            check_replica_termination(store.get_service(name), list(replicas.values()), replica_ids)
            now = self._clock.now()
            for replica_id in replica_ids:
                if replicas[replica_id].status is not ReplicaStatus.SHUTTING_DOWN:
                    store.request_replica_termination(name, replica_id, now)
        finally:
            store.close()
        if self._start_daemon:
            ensure_controller(self.home)

    def finish_down(self, names: Sequence[str], timeout_seconds: float, poll_seconds: float = 0.2) -> None:
        """See ``Controller``. With a background controller (``start_daemon``), one that is not running for
        ``CONTROLLER_GONE_SECONDS`` ends the wait with a ``ControllerError`` saying what to run: nothing would
        take the services down until it runs again. (The grace lets a restart, `controller upgrade`'s, pass.)"""
        deadline = self._clock.now() + timeout_seconds
        gone_since: float | None = None
        while True:
            store = self._open()
            try:
                left = [n for n in names if store.find_service(n) is not None]
                anything_left = bool(store.list_services())
            finally:
                store.close()
            if not left:
                break
            now = self._clock.now()
            if self._start_daemon:
                if find_controller(self.home) is not None:
                    gone_since = None
                elif gone_since is None:
                    gone_since = now
                elif now - gone_since >= CONTROLLER_GONE_SECONDS:
                    raise ControllerError(describe_stopped_controller(
                        procs.read_pid_file(self.home / CONTROLLER_PID_FILE), left))
            if now >= deadline:
                raise WaitTimeoutError(f"still shutting down after {timeout_seconds:g}s: {', '.join(left)}; "
                                       "the controller keeps working on it (see `sky-lite serve logs "
                                       f"{left[0]} --controller`)")
            self._clock.sleep(poll_seconds)
        if not anything_left and self._start_daemon and self._stop_when_idle:
            stop_controller(self.home)

    def stream_log(self, name: str, replica_id: int | None, *, controller: bool = False,
                   load_balancer: bool = False, follow: bool = False, tail: int | None = None,
                   since_seconds: float | None = None) -> Iterator[bytes]:
        if (tail is not None and tail < 0) or (since_seconds is not None and not since_seconds >= 0):
            raise UsageError(f"a log's tail ({tail}) and age ({since_seconds}) cannot be negative")
        log = self.find_log(name, replica_id, controller=controller, load_balancer=load_balancer)
        since = None if since_seconds is None else self._clock.now() - since_seconds
        if log.path is None:
            text = (log.text or "").encode()
            if since is not None or tail is not None:
                from skyserve_lite.logview import select_lines

                text = b"".join(select_lines(text.splitlines(keepends=True), since=since, tail=tail))
            return iter([text])
        return read_file_chunks(log.path, follow, self._clock, since=since, tail=tail)

    def find_log(self, name: str, replica_id: int | None, *, controller: bool = False,
                 load_balancer: bool = False) -> ReplicaLog:
        """Where the log is: a file on this machine, or its text (see ``stream_log``)."""
        from skyserve_lite.providers.base import ReplicaLog

        store = self._open()
        try:
            store.get_service(name)  # NotFoundError for an unknown service
            if controller:
                return ReplicaLog(path=controller_log_path(self.home))
            if load_balancer:
                return ReplicaLog(path=lb_log_path(self.home, name))
            if replica_id is None:
                raise UsageError("name a replica id, or pass --controller or --load-balancer")
            replica = next((r for r in store.list_replicas(name) if r.replica_id == replica_id), None)
            controller_id = store.controller_id
        finally:
            store.close()
        from skyserve_lite.controller.guard import guard_provider
        from skyserve_lite.providers import make_providers

        # A replica row is gone once its instance is; the local provider keeps the log until `serve down`.
        cloud = replica.cloud if replica is not None else "local"
        provider = make_providers(self.home, self._clock, controller_id).get(cloud)
        found = None
        if provider is not None:
            try:
                found = guard_provider(provider).read_log(name, replica_id, replica.instance_id if replica else None,
                                                          replica.region if replica else None)
            except ProviderError as exc:
                raise NotFoundError(f"cannot read the log of replica {replica_id} of {name!r}: {exc}") from exc
        if found is None:
            raise NotFoundError(f"service {name!r} has no log for replica {replica_id}")
        return found

    def force_down(self, regions: Sequence[str] = ()) -> ForceDownReport:
        from skyserve_lite.forcedown import force_down

        return force_down(self.home, regions=regions)


# How long `serve down` lets the controller it waits on be gone before saying so: long enough for a restart
# (`controller upgrade` stops the loop, then starts it within a second or two), far short of any timeout.
CONTROLLER_GONE_SECONDS = 3.0


# Endpoints asked at once by `serve status`: a fleet of 1,000 READY services asked one after the other at
# ~1 ms each would add a second to the command; 32 at a time make it ~0.05 s, and stay far below any
# load balancer's connection limits.
ENDPOINT_CHECKS_AT_ONCE = 32


def check_endpoints(views: Sequence[ServiceView],
                    ask_identity: Callable[[str], EndpointIdentity | str] | None = None) -> list[ServiceView]:
    """``views`` with ``endpoint_problem`` set for each service whose status says its endpoint answers
    (READY, NO_REPLICA) while the endpoint does not answer as it (``endpoint_identity``); up to
    ``ENDPOINT_CHECKS_AT_ONCE`` endpoints are asked at once, each for at most 1 s."""
    answering = (ServiceStatus.READY, ServiceStatus.NO_REPLICA)
    asked = [view for view in views if view.service.status in answering]
    if not asked:
        return list(views)
    from concurrent.futures import ThreadPoolExecutor

    from skyserve_lite.endpoint_identity import find_identity_problem, read_endpoint_identity

    ask = ask_identity or (lambda endpoint: read_endpoint_identity(endpoint, timeout_seconds=1.0))
    with ThreadPoolExecutor(max_workers=min(ENDPOINT_CHECKS_AT_ONCE, len(asked))) as pool:
        answers = dict(zip([view.service.name for view in asked],
                           pool.map(ask, [view.service.endpoint for view in asked]), strict=True))
    checked = []
    for view in views:
        if view.service.name in answers:
            endpoint = view.service.endpoint
            problem = find_identity_problem(answers[view.service.name], view.service.name, view.controller_id,
                                            endpoint)
            view = dataclasses.replace(view, endpoint_problem=problem)
        checked.append(view)
    return checked


def check_status_endpoints(views: Sequence[ServiceView], controllers: Sequence[ControllerView],
                           ask_identity: Callable[[str], EndpointIdentity | str] | None = None) -> list[ServiceView]:
    """``views`` as `serve status` shows them: with ``endpoint_problem`` (``check_endpoints``) and
    ``endpoints`` (``host_endpoints.check_host_endpoints``), each url asked at most once. A service's own
    endpoint is also its host's endpoint whenever the host's address is the one it shows (on a single
    controller host, every service's), and it was asked twice: two connections and up to 2 s where one
    answer says both. ``ask_identity`` defaults to ``endpoint_identity.read_endpoint_identity`` with a 1 s
    timeout."""
    from skyserve_lite.host_endpoints import ASK_TIMEOUT_SECONDS, check_host_endpoints

    def read(url: str) -> EndpointIdentity | str:
        # Imported once asked: a status with nothing to ask loads no HTTP client (nor ssl, which it imports).
        from skyserve_lite.endpoint_identity import read_endpoint_identity

        return read_endpoint_identity(url, timeout_seconds=ASK_TIMEOUT_SECONDS)

    ask = ask_identity or read
    # Filled by the first check and read by the second, never by both at once; within one check every url
    # asked is another service's port or another host, so no two threads ask the same url.
    answers: dict[str, EndpointIdentity | str] = {}

    def ask_once(url: str) -> EndpointIdentity | str:
        if url not in answers:
            answers[url] = ask(url)
        return answers[url]

    return check_host_endpoints(check_endpoints(views, ask_once), controllers, ask_once)


def describe_stopped_controller(recorded: procs.RecordedProcess | None, left: Sequence[str]) -> str:
    """What `serve down` says when the controller stopped before ``left`` were down: ``recorded`` is what its
    pid file still holds (the pid of a loop that died without removing it; None after a clean stop)."""
    which = "the controller" if recorded is None else f"the controller (pid {recorded.pid})"
    services = ", ".join(left)
    return (f"{which} stopped before {services} {'was' if len(left) == 1 else 'were'} down, and nothing takes "
            f"{'it' if len(left) == 1 else 'them'} down until it runs again: run `sky-lite controller start` "
            f"(it finishes the job); `sky-lite serve logs {left[0]} --controller` says why it stopped")


def submission_key(key: str, base: int) -> str:
    """The key an update with the idempotency key ``key`` is stored under when it is applied on top of
    version ``base``: the client's key says what was asked (a digest of the service, task, files and
    options), ``base`` what it was asked of. Version 3 stored by ``K`` on top of 2 is ``K@2``; a request
    with ``K`` finding ``K@2`` while the service is at 3 is that update again."""
    return f"{key}@{base}"


def _secret_store(home: Path) -> SecretStore:
    from skyserve_lite.state.secrets import SecretStore

    return SecretStore(home)


def bind_submission(task: SubmittedTask, previous: VersionRecord | None, secrets: SecretStore, *,
                    keep_secrets: bool, notes: list[str] | None = None) -> tuple[SubmittedTask, BoundInputs]:
    """``task`` as its version will run it, and the inputs to store with it.

    - infra: ``--infra``, else (for a task that names no cloud) the previous version's, else the home's
      ``default_infra``, else none (``local``); a task that `local` cannot run and that names no cloud (nor
      does ``--infra``: ``*`` is any) runs on the cheapest cloud installed (``plan.clouds``), which is stored
      as its infra;
    - envs: given now, over the file's own values; a name the new file declares without a value keeps the
      previous version's value;
    - secrets: given now (on the command line or in the file), else by digest (a rollback), else, for a
      name the file declares, the previous version's. Values are kept in ``secrets`` only with
      ``keep_secrets`` (a plan keeps nothing).

    Raises ``SpecError`` naming the first env or secret that still has no value. The task returned carries
    no secret value. ``notes`` (a plan's) gets a line for the clouds considered and for each ``$NAME`` that
    nothing fills in.
    """
    from skyserve_lite.plan.clouds import find_local_blocker

    inherited = previous.inputs if previous is not None else BoundInputs()
    spec, given = task.spec, task.inputs
    names_cloud = any(c.cloud is not None for c in spec.resource_candidates)
    # Where the current version runs, whoever decided it (--infra, its file, or local by default).
    runs_on = (inherited.infra or previous.spec.cloud.value) if previous is not None else None
    if runs_on == Cloud.LOCAL.value and inherited.infra is None and find_local_blocker(spec) is not None:
        runs_on = None  # on local only because nothing asked for more: a version that does may choose
    infra = given.infra or (None if names_cloud else runs_on or given.default_infra)
    if not names_cloud:
        infra = _choose_infra(spec, infra, task.source, notes)
    envs = merge_envs(spec, inherited.envs, given.envs)
    declared = {name for name, digest in spec.secrets if not digest}
    digests = {name: digest for name, digest in inherited.secrets if name in declared}
    for name, digest in given.secret_digests:
        secrets.get(digest)  # refused when this home does not hold it
        digests[name] = digest
    for name, secret in given.secrets:
        digests[name] = secrets.digest(secret, make_key=keep_secrets)
    inputs = BoundInputs(infra=infra, envs=tuple(sorted(envs.items())), secrets=tuple(sorted(digests.items())),
                         runs_as_user=True)
    bound = bind(spec, inputs, task.source)
    missing = find_missing(bound, task.source)
    if missing is not None:
        raise missing
    if bound.cloud is not Cloud.LOCAL:
        _check_cloud_secrets(bound, given.secrets, task.source)
    if notes is not None:
        from skyserve_lite.spec.inputs import find_unfilled_references

        notes.extend(find_unfilled_references(bound))
        notes.extend(find_sudo_notes(bound))
    resolution = given.resolution or resolve_task(bound, task.source)
    inputs = dataclasses.replace(inputs, resolution=resolution)
    bound = dataclasses.replace(bound, resolution=resolution)
    if keep_secrets:  # only once the task is known to be valid: a refused one leaves no value behind
        for _, secret in given.secrets:
            secrets.put(secret)
    return dataclasses.replace(task, spec=bound, inputs=TaskInputs()), inputs


# What a cloud's secret store holds as one value: AWS Secrets Manager and GCP Secret Manager both take 1 to
# 65,536 bytes (an empty value is refused by both APIs at launch, which would fail every replica).
CLOUD_SECRET_MAX_BYTES = 65536


def _check_cloud_secrets(spec: TaskSpec, given: Sequence[tuple[str, Secret]], source: str) -> None:
    """A secret given now for a cloud replica fits its cloud's secret store; the value is never shown."""
    names = {name for name, _ in spec.secrets}
    for name, secret in given:
        size = len(secret.value.encode())
        if name in names and not 1 <= size <= CLOUD_SECRET_MAX_BYTES:
            what = "is empty" if size == 0 else f"is {size:,} bytes"
            raise SpecError(source, f"secrets.{name}", f"{what}: on {spec.cloud.value} a secret is kept in the "
                                                       f"cloud's secret store, which holds 1 to 65,536 bytes")


_SUDO_RE = re.compile(r"(^|[\s;&|(`])sudo\s")


def find_sudo_notes(spec: TaskSpec) -> list[str]:
    """A note for a cloud task whose `setup` or `run` calls sudo while its replicas run as the user sky, who
    has none: each such replica would fail at boot."""
    if spec.cloud is Cloud.LOCAL or any(c.run_as_root for c in spec.resource_candidates):
        return []
    return [f"{field}: calls sudo, but cloud replicas run as the user sky, who has no sudo: set "
            "resources.run_as_root: true, or drop sudo" for field, text in (("setup", spec.setup), ("run", spec.run))
            if text and _SUDO_RE.search(text)]


def _choose_infra(spec: TaskSpec, infra: str | None, source: str, notes: list[str] | None) -> str | None:
    """``infra`` for a task that names no cloud, with a cloud chosen (``plan.clouds``) when neither it nor
    ``infra`` names one and `local` cannot run the task; ``notes`` gets the clouds considered."""
    from skyserve_lite.plan.clouds import choose_cloud, find_local_blocker
    from skyserve_lite.providers import available_clouds
    from skyserve_lite.spec.parse import Infra, parse_infra

    wanted = parse_infra(infra, "--infra", source) if infra else Infra(None)
    if wanted.cloud is not None:
        return infra
    if find_local_blocker(spec) is None and wanted.region is None and wanted.zone is None:
        return None  # no infra, or `--infra "*"`, for a task `local` runs: local
    offered = [Cloud(name) for name in available_clouds() if name != Cloud.LOCAL.value]
    choice = choose_cloud(spec, source, offered, lambda placed: resolve_task(placed, source), wanted)
    if notes is not None:
        notes.append(choice.describe())
    return dataclasses.replace(wanted, cloud=choice.cloud).describe()


def resolve_task(spec: TaskSpec, source: str, environ: Mapping[str, str] | None = None) -> Resolution:
    """Where ``spec``'s replicas may run (``plan.placement``), with the default regions of ``environ``: a
    candidate without a region runs in ``AWS_DEFAULT_REGION`` (or ``AWS_REGION``) on aws and
    ``SKY_LITE_GCP_REGION`` on gcp, else in the catalog's cheapest region. Reads no cloud."""
    from skyserve_lite.catalog import load_catalog
    from skyserve_lite.plan.placement import resolve_placements

    env = os.environ if environ is None else environ
    regions = {"aws": env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or None,
               "gcp": env.get("SKY_LITE_GCP_REGION") or None}
    return resolve_placements(spec, source, regions, load_catalog)


def check_submission(task: SubmittedTask, notes: list[str] | None = None) -> ControllerSettings:
    """Everything checked before a task is stored: the cloud can run it, and every SKY_LITE_* setting the
    controller and load balancers will read is valid (so a typo fails here, not in a background process).
    Returns the controller settings. With ``notes`` (a plan) a cloud library missing here is a note
    appended to it, not an error."""
    from skyserve_lite.lb.settings import LbSettings
    from skyserve_lite.providers import check_task_for_cloud
    from skyserve_lite.providers.local import PASSTHROUGH_SETTING, parse_env_passthrough

    note = check_task_for_cloud(task, require_available=notes is None)
    if note is not None and notes is not None:
        notes.append(f"{note}: `serve up` without --dry-run needs it")
    settings = ControllerSettings.from_env()
    LbSettings.from_env(os.environ)
    parse_env_passthrough(os.environ.get(PASSTHROUGH_SETTING, ""))
    return settings


@contextmanager
def _capture_lock(task: SubmittedTask, blobs: BlobStore) -> Iterator[None]:
    """Hold the blob store's writing lock for a task with files, from its first blob (or the check that
    its snapshot's blobs are all here) until its version is stored; a missing source is refused first,
    before anything is written."""
    from skyserve_lite.files.capture import check_task_sources, find_task_dir, needs_capture

    if needs_capture(task.spec):
        check_task_sources(task.spec, find_task_dir(task.source), task.source)
    elif task.spec.files is None:
        yield
        return
    with blobs.writing():
        yield


def _check_blobs(task: SubmittedTask, blobs: BlobStore) -> None:
    """Refuse a snapshot whose blobs are not all in ``blobs`` (one a remote client captured and uploaded,
    or a rollback's): ``MissingBlobsError`` names them."""
    files = task.spec.files
    missing = tuple(sorted(d for d in files.blob_digests() if not blobs.has(d))) if files else ()
    if missing:
        raise MissingBlobsError(missing)


def read_file_chunks(path: Path, follow: bool, clock: Clock, poll_seconds: float = 0.3, *,
                     since: float | None = None, tail: int | None = None) -> Iterator[bytes]:
    """The bytes of the file at ``path`` in chunks; with ``follow``, then what is appended, polling every
    ``poll_seconds`` (an empty chunk each poll that found nothing) until the file is removed. With
    ``since`` (seconds since the epoch) or ``tail``, of what the file holds at the start only the lines
    ``logview.select_lines`` keeps. Raises ``NotFoundError`` when there is no file yet."""
    try:
        stream = open(path, "rb")  # noqa: SIM115 (the generator closes it)
    except FileNotFoundError:
        raise NotFoundError(f"no log yet at {path}") from None

    def chunks() -> Iterator[bytes]:
        with stream:
            if since is not None or tail is not None:
                from skyserve_lite.logview import select_lines

                present = _read_lines(stream, os.fstat(stream.fileno()).st_size)
                yield from _join_in_chunks(select_lines(present, since=since, tail=tail))
            while True:
                chunk = stream.read(65536)
                if chunk:
                    yield chunk
                    continue
                if not follow or not path.exists():
                    return
                yield b""
                clock.sleep(poll_seconds)
    return chunks()


# Lines are read at most this long (a longer one is read in pieces, each going with the one before it for
# `--since`), and the selected ones sent in chunks of about this size.
_LOG_CHUNK_BYTES = 65536


def _read_lines(stream: BinaryIO, end: int) -> Iterator[bytes]:
    """The lines of ``stream`` up to offset ``end`` (what the file held when asked; the one under way at
    ``end`` whole)."""
    while stream.tell() < end:
        line = stream.readline(_LOG_CHUNK_BYTES)
        if not line:
            return
        yield line


def _join_in_chunks(lines: Iterable[bytes]) -> Iterator[bytes]:
    batch: list[bytes] = []
    held = 0
    for line in lines:
        batch.append(line)
        held += len(line)
        if held >= _LOG_CHUNK_BYTES:
            yield b"".join(batch)
            batch, held = [], 0
    if batch:
        yield b"".join(batch)


def _with_files(task: SubmittedTask, settings: ControllerSettings, blobs: BlobStore | None) -> SubmittedTask:
    """``task`` with the snapshot of its local files (hashed, and stored in ``blobs`` when given)."""
    from skyserve_lite.files.capture import capture_task_files, find_task_dir, needs_capture

    if not needs_capture(task.spec):
        return task
    files = capture_task_files(task.spec, find_task_dir(task.source), task.source, blobs,
                               settings.snapshot_limit_bytes)
    return dataclasses.replace(task, spec=dataclasses.replace(task.spec, files=files))


def _describe_files(task: SubmittedTask) -> str:
    from skyserve_lite.files.capture import format_size

    files = task.spec.files
    return "" if files is None else f", files sha256 {files.digest[:12]} ({format_size(files.size)})"


def rollback_task(state: RolloutState, to_version: int | None) -> tuple[SubmittedTask, int]:
    """The stored task to roll back to (default: the version before the current one)."""
    current = state.service.current_version
    target = current - 1 if to_version is None else to_version
    if target < 1:
        raise StateConflictError(f"service {state.service.name!r} has only version {current}; nothing to roll back to")
    if target == current:
        raise StateConflictError(f"service {state.service.name!r} is already at version {current}")
    record = state.version(target)
    if record.files_expired:
        raise StateConflictError(f"version {target} of {state.service.name!r} cannot be rolled back to: its files "
                                 "were dropped (SKY_LITE_KEEP_SNAPSHOT_VERSIONS keeps the newest versions' files); "
                                 f"see `sky-lite serve history {state.service.name}`")
    # Its spec carries its snapshot: the rollback runs exactly the files version N ran, not today's disk;
    # and its inputs: the infra, env values and secrets (by digest) it ran with.
    inputs = TaskInputs(infra=record.inputs.infra or record.spec.cloud.value, envs=record.inputs.envs,
                        secret_digests=record.inputs.secrets, resolution=record.inputs.resolution)
    # The text parsed again (not the bound spec): the submission binds it with these inputs, once.
    # Read as stored (not strict): a version an earlier sky-lite accepted can be rolled back to.
    spec = dataclasses.replace(parse_task(record.text, source=record.source, strict=False), files=record.spec.files)
    return SubmittedTask(text=record.text, source=record.source, spec=spec, inputs=inputs), target


def describe_history(versions: Sequence[VersionRecord]) -> list[HistoryEntry]:
    """Every version with a one-line summary of what it changed against the one before. Pure."""
    entries = []
    previous: VersionRecord | None = None
    for record in versions:
        files = record.files
        entries.append(HistoryEntry(record.version, record.created_at, record.mode,
                                    summarize_change(previous, record), record.note,
                                    files_digest=files.digest if files else None,
                                    files_size=files.size if files else None, files_expired=record.files_expired))
        previous = record
    return entries


def summarize_change(previous: VersionRecord | None, record: VersionRecord) -> str:
    if previous is None:
        return "initial version"
    from skyserve_lite.spec.config import find_config_changes, find_service_changes

    replaced = find_config_changes(previous.spec, record.spec, reuse_identical_files=record.reuse_identical_files)
    settings = find_service_changes(previous.spec, record.spec)
    details = "; ".join(c.describe() for c in (*replaced, *settings))
    if replaced:
        return f"replaces replicas: {details}"
    if settings:
        return f"reuses replicas: {details}"
    return "no change"


def match_service_names(patterns: Sequence[str], names: Sequence[str]) -> list[str]:
    """The services ``patterns`` name, in the order of ``names``: a plain name must exist (``NotFoundError``),
    a shell-style pattern (``dev-*``) takes every match and must match one."""
    import fnmatch

    chosen: set[str] = set()
    for pattern in patterns:
        if any(char in pattern for char in "*?["):
            matched = fnmatch.filter(names, pattern)
            if not matched:
                raise NotFoundError(f"no service matches {pattern!r}; see `sky-lite serve status`")
            chosen.update(matched)
        elif pattern in names:
            chosen.add(pattern)
        else:
            raise NotFoundError(f"no service named {pattern!r}; see `sky-lite serve status`")
    return [name for name in names if name in chosen]


def check_replica_termination(service: ServiceRecord, replicas: Sequence[ReplicaRecord],
                              replica_ids: Sequence[int]) -> None:
    """Refuse to terminate what is not there (``NotFoundError``) or not running (``StateConflictError``)."""
    name = service.name
    if service.deleting:
        raise StateConflictError(f"service {name!r} is shutting down already; its replicas go with it")
    by_id = {r.replica_id: r for r in replicas}
    for replica_id in replica_ids:
        replica = by_id.get(replica_id)
        if replica is None:
            known = ", ".join(str(i) for i in sorted(by_id)) or "none"
            raise NotFoundError(f"service {name!r} has no replica {replica_id} (its replicas: {known})")
        if replica.status.is_terminal:
            raise StateConflictError(
                f"replica {replica_id} of {name!r} is {replica.status.value} already: nothing to terminate "
                "(its row stays as a record; `sky-lite serve status` shows it)")


def check_service_name(name: str) -> None:
    if not is_valid_service_name(name):
        raise UsageError(f"invalid service name {name!r}: use lowercase letters, digits and '-', starting "
                         "with a letter and at most 63 characters (pass one with -n NAME)")


def default_service_name(task: SubmittedTask) -> str:
    """The YAML's `name`, else the file's stem (``minimal.yaml`` -> ``minimal``), made a DNS label
    (``deepseek-r1-A100`` -> ``deepseek-r1-a100``, ``my_svc`` -> ``my-svc``)."""
    return to_service_name(task.spec.name or Path(task.source).stem)


def _pick_lb_port(used: set[int]) -> int:
    """The first port from ``LB_PORT_START`` that no service of this home has and nothing on this host
    listens on. Raises ``ControllerError`` when there is none."""
    port = find_lb_port(used, procs.is_port_free)
    if port is None:
        raise ControllerError(f"no free port for a load balancer between {LB_PORT_START} and {LB_PORT_END}")
    return port
