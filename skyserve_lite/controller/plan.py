"""One controller pass, decided: desired state (store) + observed state (inventory, probes) -> ``PassPlan``.

Pure: no I/O, no clock reads; the executor applies the plan. Level-based: the plan depends only on the
snapshot, never on what the previous pass did, so a pass after a crash simply continues.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skyserve_lite.autoscalers.base import AutoscalerState, Decision, Metrics
from skyserve_lite.autoscalers.dispatch import carry_over, compute_target_replicas, make_autoscaler
from skyserve_lite.autoscalers.fallback import MarketTargets, plan_market_targets
from skyserve_lite.controller.replica_rules import ProbeResult, ReplicaStep, plan_replica
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.plan.rollout import UpdateMode, plan_rollout_step
from skyserve_lite.plan.scaling import (
    find_recent_failures,
    find_scale_down_order,
    is_launch_blocked,
)
from skyserve_lite.providers.base import Instance, InstanceState
from skyserve_lite.spec.config import is_same_replica_config
from skyserve_lite.spec.model import ReadinessProbe, TaskSpec
from skyserve_lite.state.models import (
    AutoscalerObservation,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceStatus,
)

ReplicaKey = tuple[str, int]  # (service, replica_id)


@dataclass(frozen=True)
class ServiceSnapshot:
    """A service as the store holds it at the start of a pass."""

    service: ServiceRecord
    versions: Mapping[int, TaskSpec]  # the current version and every version a replica runs
    replicas: tuple[ReplicaRecord, ...]
    lb_alive: bool
    mode: UpdateMode = UpdateMode.ROLLING  # how the current version rolls out
    autoscaler: AutoscalerState | None = None  # None before the first decision
    observed: AutoscalerObservation | None = None
    metrics: Metrics | None = None  # what the load balancer reported; None: nothing yet

    @property
    def spec(self) -> TaskSpec:
        return self.versions[self.service.current_version]


@dataclass(frozen=True)
class Observation:
    """What the providers and probes reported at the start of a pass.

    ``instances`` holds only clouds whose inventory was read (``known_clouds``); decisions about replicas
    of any other cloud wait for a pass that can see them.
    """

    instances: tuple[tuple[str, Instance], ...] = ()  # (cloud, instance)
    known_clouds: frozenset[str] = frozenset()
    probes: Mapping[ReplicaKey, ProbeResult] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeTarget:
    service: str
    replica_id: int
    url: str
    probe: ReadinessProbe


@dataclass(frozen=True)
class LaunchBatch:
    """Launch ``count`` new replicas of ``version``, plus re-send unconfirmed launches in ``retry``."""

    service: str
    version: int
    cloud: str
    is_spot: bool
    count: int
    retry: tuple[ReplicaRecord, ...] = ()


@dataclass(frozen=True)
class Event:
    service: str
    replica_id: int | None
    kind: str
    message: str


@dataclass(frozen=True)
class PassPlan:
    replica_updates: tuple[ReplicaRecord, ...] = ()
    removals: tuple[ReplicaKey, ...] = ()
    terminations: tuple[tuple[str, str], ...] = ()  # (cloud, instance_id)
    launches: tuple[LaunchBatch, ...] = ()
    start_lbs: tuple[str, ...] = ()
    stop_lbs: tuple[tuple[str, int], ...] = ()  # (service, pid)
    lb_policy_changes: tuple[tuple[str, str], ...] = ()  # (service, policy)
    status_changes: tuple[tuple[str, ServiceStatus, str | None], ...] = ()
    deletions: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    active_version_changes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    autoscaler_updates: tuple[tuple[str, AutoscalerState, AutoscalerObservation], ...] = ()

    @property
    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) for f in dataclasses.fields(self))


class _InstanceIndex:
    def __init__(self, observation: Observation) -> None:
        self.known_clouds = observation.known_clouds
        self.by_id = {(cloud, i.instance_id): i for cloud, i in observation.instances}
        self.by_tag = {(cloud, i.service, i.replica_id): i for cloud, i in observation.instances
                       if i.state is not InstanceState.TERMINATED}

    def find(self, replica: ReplicaRecord) -> Instance | None:
        if replica.instance_id is not None:
            return self.by_id.get((replica.cloud, replica.instance_id))
        return self.by_tag.get((replica.cloud, replica.service, replica.replica_id))


def find_probe_targets(snapshots: Sequence[ServiceSnapshot], observation: Observation
                       ) -> list[ProbeTarget]:
    """Replicas worth probing this pass: live, with a running instance that has a url."""
    index = _InstanceIndex(observation)
    targets = []
    for snapshot in snapshots:
        for replica in snapshot.replicas:
            if not replica.status.is_live or replica.cloud not in index.known_clouds:
                continue
            instance = index.find(replica)
            if instance is None or instance.state is not InstanceState.RUNNING or instance.url is None:
                continue
            probe = snapshot.versions[replica.version].service.readiness_probe
            targets.append(ProbeTarget(replica.service, replica.replica_id, instance.url, probe))
    return targets


def plan_pass(snapshots: Sequence[ServiceSnapshot], observation: Observation, now: float,
              settings: ControllerSettings) -> PassPlan:
    """Decide everything one pass does. See the module docstring."""
    index = _InstanceIndex(observation)
    parts = [_plan_service(snapshot, index, observation.probes, now, settings) for snapshot in snapshots]
    orphans = _find_orphans(snapshots, observation)
    return PassPlan(
        replica_updates=tuple(r for p in parts for r in p.replica_updates),
        removals=tuple(k for p in parts for k in p.removals),
        terminations=tuple(sorted(set(t for p in parts for t in p.terminations) | set(orphans))),
        launches=tuple(b for p in parts for b in p.launches),
        start_lbs=tuple(s for p in parts for s in p.start_lbs),
        stop_lbs=tuple(s for p in parts for s in p.stop_lbs),
        lb_policy_changes=tuple(c for p in parts for c in p.lb_policy_changes),
        status_changes=tuple(c for p in parts for c in p.status_changes),
        deletions=tuple(d for p in parts for d in p.deletions),
        active_version_changes=tuple(c for p in parts for c in p.active_version_changes),
        autoscaler_updates=tuple(u for p in parts for u in p.autoscaler_updates),
        events=tuple(e for p in parts for e in p.events)
        + tuple(Event(i.service, i.replica_id, "orphan", f"terminating {cloud} instance {i.instance_id} "
                      "that no replica claims") for cloud, i in observation.instances
                if (cloud, i.instance_id) in orphans),
    )


def _find_orphans(snapshots: Sequence[ServiceSnapshot], observation: Observation) -> set[tuple[str, str]]:
    """Instances no replica row claims (launched before a crash for a row that is gone): terminate them."""
    claimed_ids = {(r.cloud, r.instance_id) for s in snapshots for r in s.replicas if r.instance_id}
    adoptable = {(r.cloud, r.service, r.replica_id) for s in snapshots for r in s.replicas
                 if r.instance_id is None}
    return {
        (cloud, i.instance_id) for cloud, i in observation.instances
        if i.state is not InstanceState.TERMINATED
        and (cloud, i.instance_id) not in claimed_ids
        and (cloud, i.service, i.replica_id) not in adoptable
    }


def _plan_service(snapshot: ServiceSnapshot, index: _InstanceIndex,
                  probes: Mapping[ReplicaKey, ProbeResult], now: float,
                  settings: ControllerSettings) -> PassPlan:
    service = snapshot.service
    steps: list[ReplicaStep] = []
    for replica in snapshot.replicas:
        if replica.cloud not in index.known_clouds:
            steps.append(ReplicaStep(replica))  # inventory unknown this pass: decide nothing
            continue
        readiness = snapshot.versions[replica.version].service.readiness_probe
        steps.append(plan_replica(replica, index.find(replica), probes.get((service.name, replica.replica_id)),
                                  readiness, now, settings))

    active_changes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    autoscaler_updates: tuple[tuple[str, AutoscalerState, AutoscalerObservation], ...] = ()
    target = 0
    if service.deleting:
        steps = [_shut_down(step, now) for step in steps]
    else:
        steps = _reuse(snapshot, steps)
        decision, observed = plan_autoscale(snapshot, steps, now, settings)
        target = compute_target_replicas(snapshot.spec.service.replica_policy, decision.state)
        if (decision.state, observed) != (snapshot.autoscaler, snapshot.observed):
            autoscaler_updates = ((service.name, decision.state, observed),)
        steps = _scale(snapshot, steps, now, target)
        steps, active = _roll_out(snapshot, steps, now, target)
        steps = _prune_terminal(steps, settings.keep_terminal_replicas)
        if active != service.active_versions:
            active_changes = ((service.name, active),)

    events = [Event(service.name, s.record.replica_id, "replica", s.event) for s in steps if s.event]
    launches = [] if service.deleting else _plan_launches(snapshot, steps, settings, target)
    updates = tuple(s.record for s, old in zip(steps, _originals(steps, snapshot), strict=True)
                    if s.record != old and not s.remove)
    terminations = tuple((s.record.cloud, s.record.instance_id) for s in steps
                         if s.terminate and s.record.instance_id is not None)
    removals = tuple((service.name, s.record.replica_id) for s in steps if s.remove)

    start_lbs: tuple[str, ...] = ()
    stop_lbs: tuple[tuple[str, int], ...] = ()
    policy_changes: tuple[tuple[str, str], ...] = ()
    deletions: tuple[str, ...] = ()
    if service.deleting:
        if snapshot.lb_alive and service.lb_pid is not None:
            stop_lbs = ((service.name, service.lb_pid),)
        # Rows removed in this pass have no instance left, and the load balancer stops before deletion.
        if all(s.remove for s in steps):
            deletions = (service.name,)
            events.append(Event(service.name, None, "service", "service removed"))
    else:
        if not snapshot.lb_alive:
            start_lbs = (service.name,)
        wanted_policy = snapshot.spec.service.load_balancing_policy.value
        if wanted_policy != service.lb_policy:
            policy_changes = ((service.name, wanted_policy),)

    status, reason = plan_service_status(snapshot, [s.record for s in steps if not s.remove], settings, target)
    status_changes: tuple[tuple[str, ServiceStatus, str | None], ...] = ()
    if not deletions and (status, reason) != (service.status, service.status_reason):
        status_changes = ((service.name, status, reason),)
        if status is not service.status:
            events.append(Event(service.name, None, "service",
                                f"{status.value}" + (f": {reason}" if reason else "")))
    return PassPlan(
        replica_updates=updates, removals=removals, terminations=terminations, launches=tuple(launches),
        start_lbs=start_lbs, stop_lbs=stop_lbs, lb_policy_changes=policy_changes,
        status_changes=status_changes, deletions=deletions, events=tuple(events),
        active_version_changes=active_changes, autoscaler_updates=autoscaler_updates,
    )


def _originals(steps: Sequence[ReplicaStep], snapshot: ServiceSnapshot) -> list[ReplicaRecord]:
    by_id = {r.replica_id: r for r in snapshot.replicas}
    return [by_id[s.record.replica_id] for s in steps]


def _shut_down(step: ReplicaStep, now: float) -> ReplicaStep:
    """`serve down`: every live replica goes SHUTTING_DOWN; terminal rows are dropped with their instance."""
    record = step.record
    if step.remove:
        return step
    if record.status.is_terminal:
        # Terminal rows go once their instance is gone; plan_replica asked to terminate it if it is not.
        return ReplicaStep(record, terminate=step.terminate, remove=not step.terminate)
    if record.status is ReplicaStatus.SHUTTING_DOWN:
        # The load balancer is going away too: no need to wait for the drain.
        return dataclasses.replace(step, terminate=not step.remove)
    down = dataclasses.replace(record, status=ReplicaStatus.SHUTTING_DOWN, status_since=now,
                               status_reason="service is shutting down")
    # A launch recorded but never confirmed has no instance to wait for (plan_replica adopted any it found).
    return ReplicaStep(down, terminate=True, remove=record.instance_id is None)


def _live_of_version(steps: Sequence[ReplicaStep], version: int) -> list[ReplicaRecord]:
    return [s.record for s in steps if s.record.status.is_live and not s.remove and s.record.version == version]


def _reuse(snapshot: ServiceSnapshot, steps: list[ReplicaStep]) -> list[ReplicaStep]:
    """Bump live replicas of older versions whose replica config equals the current one (an update that
    changed only the `service` section, or a rollback to an equal config): same instance, new version."""
    version = snapshot.service.current_version
    # One comparison per older version, not per replica: the answer depends only on the two versions.
    reusable = {v for v in snapshot.versions
                if v != version and is_same_replica_config(snapshot.versions[v], snapshot.spec)}
    result = []
    for step in steps:
        record = step.record
        if record.status.is_live and not step.remove and record.version in reusable:
            step = dataclasses.replace(step, record=dataclasses.replace(record, version=version),
                                       event=f"reused for version {version} (same replica config)")
        result.append(step)
    return result


def _shut_down_step(step: ReplicaStep, now: float, reason: str) -> ReplicaStep:
    """Take a replica out of traffic now; ``plan_replica`` terminates it once it has drained."""
    down = dataclasses.replace(step.record, status=ReplicaStatus.SHUTTING_DOWN, status_since=now,
                               status_reason=reason)
    return ReplicaStep(down, event=f"draining: {reason}")


def _scale(snapshot: ServiceSnapshot, steps: list[ReplicaStep], now: float, target: int) -> list[ReplicaStep]:
    """Terminate the surplus of each market (spot, on demand) among current-version replicas."""
    live = _live_of_version(steps, snapshot.service.current_version)
    markets = _market_targets(snapshot, live, target)
    victims: set[int] = set()
    for is_spot in (False, True):
        in_market = [r for r in live if r.is_spot == is_spot]
        surplus = len(in_market) - markets.for_market(is_spot)
        victims.update(r.replica_id for r in find_scale_down_order(in_market)[:max(0, surplus)])
    return [_shut_down_step(s, now, f"scaling down to {target} replicas") if s.record.replica_id in victims
            else s for s in steps]


def _market_targets(snapshot: ServiceSnapshot, live: Sequence[ReplicaRecord], target: int) -> MarketTargets:
    ready_spot = sum(1 for r in live if r.is_spot and r.status is ReplicaStatus.READY)
    return plan_market_targets(snapshot.spec.resources.use_spot, snapshot.spec.service.replica_policy, target,
                               ready_spot)


def plan_autoscale(snapshot: ServiceSnapshot, steps: Sequence[ReplicaStep], now: float,
                   settings: ControllerSettings) -> tuple[Decision, AutoscalerObservation]:
    """The autoscaler's decision for this pass. In-flight counts come from the load balancer's report, for
    the replicas READY now (one that does not report counts as idle)."""
    policy = snapshot.spec.service.replica_policy
    autoscaler = make_autoscaler(policy, settings.autoscaler_period_seconds)
    state = carry_over(snapshot.autoscaler, policy, snapshot.service.current_version)
    metrics = snapshot.metrics or Metrics(now=now)
    ready_urls = [s.record.url for s in steps if s.record.status is ReplicaStatus.READY and not s.remove]
    in_flight = dict(metrics.ongoing_requests_by_url)
    metrics = dataclasses.replace(metrics, now=now,
                                  ongoing_requests=tuple(float(in_flight.get(url or "", 0)) for url in ready_urls))
    decision = autoscaler.decide(state, metrics)
    if not decision.decided and snapshot.observed is not None and snapshot.autoscaler == decision.state:
        return decision, snapshot.observed  # between decisions: nothing new to record
    observed = AutoscalerObservation(policy=autoscaler.name, raw_target=decision.raw_target, qps=decision.qps,
                                     average_ongoing=decision.average_ongoing, held_back=decision.held_back)
    return decision, observed


def _roll_out(snapshot: ServiceSnapshot, steps: list[ReplicaStep], now: float, target: int
              ) -> tuple[list[ReplicaStep], tuple[int, ...]]:
    """One step of the current version's rollout: which outdated replicas go, which versions serve."""
    version = snapshot.service.current_version
    policy = snapshot.spec.service.replica_policy
    outdated = [s.record for s in steps if s.record.status.is_live and not s.remove and s.record.version != version]
    rollout = plan_rollout_step(snapshot.mode, version, _live_of_version(steps, version), outdated,
                                target, policy.min_replicas)
    victims = set(rollout.terminate)
    steps = [_shut_down_step(s, now, f"replaced by version {version}") if s.record.replica_id in victims
             else s for s in steps]
    return steps, rollout.active_versions


def _prune_terminal(steps: list[ReplicaStep], keep: int) -> list[ReplicaStep]:
    """Drop terminal rows beyond the newest ``keep`` once their instance is gone."""
    terminal = sorted((s for s in steps if s.record.status.is_terminal and not s.terminate),
                      key=lambda s: -s.record.replica_id)
    stale = {s.record.replica_id for s in terminal[keep:]}
    return [dataclasses.replace(s, remove=True) if s.record.replica_id in stale else s for s in steps]


def _plan_launches(snapshot: ServiceSnapshot, steps: Sequence[ReplicaStep], settings: ControllerSettings,
                   target: int) -> list[LaunchBatch]:
    """One batch per market that is short of its target; unconfirmed launches are re-sent with it."""
    service = snapshot.service
    records = [s.record for s in steps if not s.remove]
    if is_launch_blocked(records, service.current_version, settings.failure_limit):
        return []
    live = [r for r in records if r.status.is_live and r.version == service.current_version]
    markets = _market_targets(snapshot, live, target)
    batches = []
    for is_spot in (False, True):
        retry = tuple(s.record for s in steps if s.relaunch and s.record.is_spot == is_spot)
        missing = max(0, markets.for_market(is_spot) - sum(1 for r in live if r.is_spot == is_spot))
        if missing or retry:
            batches.append(LaunchBatch(service=service.name, version=service.current_version,
                                       cloud=snapshot.spec.resources.cloud.value, is_spot=is_spot, count=missing,
                                       retry=retry))
    return batches


def plan_service_status(snapshot: ServiceSnapshot, replicas: Sequence[ReplicaRecord],
                        settings: ControllerSettings, target: int) -> tuple[ServiceStatus, str | None]:
    """The service status that follows from its replicas (after this pass's decisions), with a reason."""
    service = snapshot.service
    if service.deleting:
        return ServiceStatus.SHUTTING_DOWN, None
    blocked = None
    if is_launch_blocked(replicas, service.current_version, settings.failure_limit):
        failures = find_recent_failures(replicas, service.current_version)
        last = max(failures, key=lambda r: r.replica_id)
        blocked = (f"{len(failures)} replicas of version {service.current_version} failed before becoming ready, "
                   f"launching stopped; last: replica {last.replica_id} {last.status.value}: {last.status_reason}")
    if any(r.status is ReplicaStatus.READY for r in replicas):
        # Still serving (older replicas, or some of this version): READY, with the failing rollout named.
        return ServiceStatus.READY, blocked
    if blocked:
        return ServiceStatus.FAILED, blocked
    if target == 0 and not any(r.status.is_live for r in replicas):
        return ServiceStatus.NO_REPLICA, None
    return ServiceStatus.REPLICA_INIT, None
