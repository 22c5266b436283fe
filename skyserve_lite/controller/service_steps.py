"""One service's steps within a pass: reuse, autoscale, scale per market, roll out, prune, launch, status.

Pure functions over ``ReplicaStep`` lists; ``controller.plan`` composes them into the pass's ``PassPlan``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from skyserve_lite.autoscalers.base import Decision, Metrics
from skyserve_lite.autoscalers.dispatch import carry_over, make_autoscaler
from skyserve_lite.autoscalers.fallback import MarketTargets, plan_market_targets
from skyserve_lite.controller.pass_types import LaunchBatch, ServiceSnapshot
from skyserve_lite.controller.replica_rules import ReplicaStep, is_maybe_unlisted
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.plan.rollout import plan_rollout_step
from skyserve_lite.plan.scaling import find_recent_failures, find_scale_down_order, is_launch_blocked
from skyserve_lite.spec.config import is_same_replica_config
from skyserve_lite.state.models import (
    AutoscalerObservation,
    ReplicaRecord,
    ReplicaStatus,
    ServiceStatus,
)


def plan_shut_down(step: ReplicaStep, now: float, settings: ControllerSettings) -> ReplicaStep:
    """`serve down`: every live replica goes SHUTTING_DOWN; terminal rows are dropped with their instance."""
    record = step.record
    if step.remove:
        return step
    if record.status.is_terminal:
        # Terminal rows go once their instance is gone; plan_replica asked to terminate it if it is not.
        return ReplicaStep(record, terminate=step.terminate, remove=not step.terminate)
    if record.status is ReplicaStatus.SHUTTING_DOWN:
        # The load balancer is going away too: no need to wait for the drain.
        return step._replace(terminate=not step.remove)
    down = dataclasses.replace(record, status=ReplicaStatus.SHUTTING_DOWN, status_since=now,
                               status_reason="service is shutting down")
    # A launch recorded but never confirmed: plan_replica adopted its instance if the inventory lists it.
    # If not, the row stays (SHUTTING_DOWN) while the instance may just not be listed yet, so the service is
    # not deleted with an instance still starting somewhere; plan_replica removes it once the grace passed.
    forget = record.instance_id is None and not is_maybe_unlisted(record, now, settings)
    return ReplicaStep(down, terminate=record.instance_id is not None, remove=forget)


def _live_of_version(steps: Sequence[ReplicaStep], version: int) -> list[ReplicaRecord]:
    return [s.record for s in steps if s.record.status.is_live and not s.remove and s.record.version == version]


def plan_reuse(snapshot: ServiceSnapshot, steps: list[ReplicaStep]) -> list[ReplicaStep]:
    """Bump live replicas of older versions whose replica config equals the current one (an update that
    changed only the `service` section, or a rollback to an equal config): same instance, new version."""
    version = snapshot.service.current_version
    # One comparison per older version, not per replica: the answer depends only on the two versions.
    reuse_identical = snapshot.reuse_identical_files
    reusable = {v for v in snapshot.versions if v != version and is_same_replica_config(
        snapshot.versions[v], snapshot.spec, reuse_identical_files=reuse_identical)}
    result = []
    for step in steps:
        record = step.record
        if record.status.is_live and not step.remove and record.version in reusable:
            step = step._replace(record=dataclasses.replace(record, version=version),
                                       event=f"reused for version {version} (same replica config)")
        result.append(step)
    return result


def plan_requested_terminations(snapshot: ServiceSnapshot, steps: list[ReplicaStep], now: float,
                                known_clouds: Collection[str]) -> list[ReplicaStep]:
    """Drain the live replicas an operator asked to terminate. They stop counting toward the target, so the
    launch step of this same pass replaces them when the policy still wants that many replicas. A replica
    whose cloud's inventory is unknown this pass is left for a pass that can see it, as every other
    decision about it is."""
    asked = snapshot.terminate_requested
    if not asked:
        return steps
    return [_shut_down_step(s, now, "terminated by the operator (serve down --replica-id)")
            if s.record.replica_id in asked and s.record.status.is_live and not s.remove
            and s.record.cloud in known_clouds else s for s in steps]


def _shut_down_step(step: ReplicaStep, now: float, reason: str) -> ReplicaStep:
    """Take a replica out of traffic now; ``plan_replica`` terminates it once it has drained."""
    down = dataclasses.replace(step.record, status=ReplicaStatus.SHUTTING_DOWN, status_since=now,
                               status_reason=reason)
    return ReplicaStep(down, event=f"draining: {reason}")


def plan_scale_down(snapshot: ServiceSnapshot, steps: list[ReplicaStep], now: float, target: int) -> list[ReplicaStep]:
    """Terminate the surplus of each market (spot, on demand) among current-version replicas."""
    live = _live_of_version(steps, snapshot.service.current_version)
    markets = _market_targets(snapshot, live, target)
    victims: set[int] = set()
    for is_spot in (False, True):
        in_market = [r for r in live if r.is_spot == is_spot]
        surplus = len(in_market) - markets.for_market(is_spot)
        if surplus > 0:  # sorting is for choosing; with nothing to choose (most passes) skip it
            victims.update(r.replica_id for r in find_scale_down_order(in_market)[:surplus])
    reason = f"scaling down to {target} {'replica' if target == 1 else 'replicas'}"
    return [_shut_down_step(s, now, reason) if s.record.replica_id in victims
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


def plan_rollout(snapshot: ServiceSnapshot, steps: list[ReplicaStep], now: float, target: int
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


def plan_prune_terminal(steps: list[ReplicaStep], keep: int, version: int) -> list[ReplicaStep]:
    """Drop terminal rows beyond the newest ``keep`` once their instance is gone, but never a row that the
    launch circuit breaker counts for ``version`` (the current one): with keep 2 and a failure limit of 5,
    pruning those rows kept the count at 2 and launching never stopped (62 launches in 60 s). At most
    ``failure_limit`` rows are held back this way, since launching stops at that count."""
    counted = {r.replica_id for r in find_recent_failures([s.record for s in steps], version)}
    terminal = sorted((s for s in steps if s.record.status.is_terminal and not s.terminate),
                      key=lambda s: -s.record.replica_id)
    stale = {s.record.replica_id for s in terminal[keep:]} - counted
    return [s._replace(remove=True) if s.record.replica_id in stale else s for s in steps]


def plan_launches(snapshot: ServiceSnapshot, steps: Sequence[ReplicaStep], settings: ControllerSettings,
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
            versions = {service.current_version, *(r.version for r in retry)}
            batches.append(LaunchBatch(service=service.name, version=service.current_version,
                                       cloud=snapshot.spec.cloud.value, is_spot=is_spot, count=missing,
                                       retry=retry, specs={v: snapshot.versions[v] for v in versions}))
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


def plan_load_balancer(snapshot: ServiceSnapshot
                       ) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    """(load balancers to start, to stop, policy changes): one per live service, none for one going down."""
    service = snapshot.service
    if service.deleting:
        alive = snapshot.lb_alive and service.lb_pid is not None
        return (), (((service.name, service.lb_pid),) if alive and service.lb_pid else ()), ()
    start = () if snapshot.lb_alive else (service.name,)
    wanted = snapshot.spec.service.lb_policy
    return start, (), ((service.name, wanted),) if wanted != service.lb_policy else ()
