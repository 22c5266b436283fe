"""One service's steps within a pass: reuse, autoscale, scale per market, roll out, prune, launch, status.

Pure functions over ``ReplicaStep`` lists; ``controller.plan`` composes them into the pass's ``PassPlan``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from skyserve_lite.autoscalers.base import Decision, Metrics
from skyserve_lite.autoscalers.dispatch import make_autoscaler
from skyserve_lite.autoscalers.fallback import MarketTargets, plan_market_targets
from skyserve_lite.autoscalers.target import carry_over
from skyserve_lite.controller.canary_steps import CanaryPass, plan_canary_rollout
from skyserve_lite.controller.pass_types import LaunchBatch, ServiceLoad, ServiceSnapshot
from skyserve_lite.controller.replica_rules import ReplicaStep, is_maybe_unlisted
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.plan.rollout import plan_rollout_step
from skyserve_lite.plan.scaling import find_recent_failures, find_scale_down_order, is_launch_blocked
from skyserve_lite.plan.spot_placer import (
    find_preemptive_zones,
    find_spot_zones,
    plan_spot_zone_orders,
    with_spot_zone_order,
)
from skyserve_lite.spec.config import is_same_replica_config
from skyserve_lite.state.models import (
    AutoscalerObservation,
    ReplicaRecord,
    ReplicaStatus,
    ServiceStatus,
    replace_replica,
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
    down = replace_replica(record, status=ReplicaStatus.SHUTTING_DOWN, status_since=now,
                           status_reason="service is shutting down")
    # A launch recorded but never confirmed: plan_replica adopted its instance if the inventory lists it.
    # If not, the row stays (SHUTTING_DOWN) while the instance may just not be listed yet, so the service is
    # not deleted with an instance still starting somewhere; plan_replica removes it once the grace passed.
    forget = record.instance_id is None and not is_maybe_unlisted(record, now, settings)
    return ReplicaStep(down, terminate=record.instance_id is not None, remove=forget)


@dataclass(frozen=True, slots=True)
class StepCensus:
    """What the steps of one service pass ask of its replicas, counted in one scan of the steps: the
    phases below read these instead of each scanning every replica again. Counted once per pass when no
    phase changes a step (the steady case), again after each phase that does (``recount``)."""

    version: int  # the service's current version
    live_current: tuple[ReplicaRecord, ...]  # live rows kept, of the current version (reused ones included)
    outdated: tuple[ReplicaRecord, ...]  # live rows kept, of an older version
    ready_urls: tuple[str | None, ...]  # the urls of READY rows kept, in order
    kept: tuple[ReplicaRecord, ...]  # every row this pass keeps (not removed)
    prunable: int  # terminal rows not asked to terminate their instance (again): what pruning may drop
    relaunch: tuple[ReplicaRecord, ...]  # launches recorded, never confirmed: re-sent with this pass's batch
    recent_failures: tuple[ReplicaRecord, ...]  # ``find_recent_failures`` of the kept rows, current version

    @classmethod
    def of(cls, steps: Sequence[ReplicaStep], version: int) -> StepCensus:
        live_current: list[ReplicaRecord] = []
        outdated: list[ReplicaRecord] = []
        kept: list[ReplicaRecord] = []
        relaunch: list[ReplicaRecord] = []
        ready_urls: list[str | None] = []
        prunable = 0
        ready = ReplicaStatus.READY
        for step in steps:
            record = step.record
            status = record.status
            if step.relaunch:
                relaunch.append(record)
            if status.is_terminal and not step.terminate:
                prunable += 1
            if step.remove:
                continue
            kept.append(record)
            if status.is_live:
                (live_current if record.version == version else outdated).append(record)
                if status is ready:
                    ready_urls.append(record.url)
        return cls(version, tuple(live_current), tuple(outdated), tuple(ready_urls), tuple(kept), prunable,
                   tuple(relaunch), tuple(find_recent_failures(kept, version)))

    def recount(self, before: Sequence[ReplicaStep], after: Sequence[ReplicaStep]) -> StepCensus:
        """The census of ``after``: this one when a phase returned its steps unchanged."""
        return self if after is before else StepCensus.of(after, self.version)

    def is_launch_blocked(self, failure_limit: int) -> bool:
        """``plan.scaling.is_launch_blocked`` of the kept rows, for the current version."""
        return is_launch_blocked(self.recent_failures, failure_limit)


def plan_reuse(snapshot: ServiceSnapshot, steps: list[ReplicaStep]) -> list[ReplicaStep]:
    """Bump live replicas of older versions whose replica config equals the current one (an update that
    changed only the `service` section, or a rollback to an equal config): same instance, new version."""
    version = snapshot.service.current_version
    # One comparison per older version, not per replica: the answer depends only on the two versions.
    reuse_identical = snapshot.reuse_identical_files
    reusable = {v for v in snapshot.versions if v != version and is_same_replica_config(
        snapshot.versions[v], snapshot.spec, reuse_identical_files=reuse_identical)}
    if not reusable:  # one version, or none equal to it (most passes): every step as it was
        return steps
    result = []
    for step in steps:
        record = step.record
        if record.status.is_live and not step.remove and record.version in reusable:
            step = step._replace(record=replace_replica(record, version=version),
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
    down = replace_replica(step.record, status=ReplicaStatus.SHUTTING_DOWN, status_since=now,
                           status_reason=reason)
    return ReplicaStep(down, event=f"draining: {reason}")


def plan_scale_down(snapshot: ServiceSnapshot, steps: list[ReplicaStep], census: StepCensus, now: float,
                    target: int) -> list[ReplicaStep]:
    """Terminate the surplus of each market (spot, on demand) among current-version replicas."""
    live = census.live_current
    markets = _market_targets(snapshot, live, target)
    victims: set[int] = set()
    for is_spot in (False, True):
        in_market = [r for r in live if r.is_spot == is_spot]
        surplus = len(in_market) - markets.for_market(is_spot)
        if surplus > 0:  # sorting is for choosing; with nothing to choose (most passes) skip it
            victims.update(r.replica_id for r in find_scale_down_order(in_market)[:surplus])
    if not victims:
        return steps
    reason = f"scaling down to {target} {'replica' if target == 1 else 'replicas'}"
    return [_shut_down_step(s, now, reason) if s.record.replica_id in victims
            else s for s in steps]


def _market_targets(snapshot: ServiceSnapshot, live: Sequence[ReplicaRecord], target: int) -> MarketTargets:
    use_spot = snapshot.spec.resources.use_spot
    ready_spot = sum(1 for r in live if r.is_spot and r.status is ReplicaStatus.READY) if use_spot else 0
    return plan_market_targets(use_spot, snapshot.spec.service.replica_policy, target, ready_spot)


def plan_autoscale(snapshot: ServiceSnapshot, census: StepCensus, now: float,
                   settings: ControllerSettings) -> tuple[Decision, AutoscalerObservation]:
    """The autoscaler's decision for this pass. In-flight counts come from the load balancer's report, for
    the replicas READY now (one that does not report counts as idle)."""
    policy = snapshot.spec.service.replica_policy
    autoscaler = make_autoscaler(policy, settings.autoscaler_period_seconds)
    state = carry_over(snapshot.autoscaler, policy, snapshot.service.current_version)
    load = snapshot.load or ServiceLoad()
    in_flight = load.ongoing_requests_by_url
    ongoing: tuple[float, ...] = ()
    if in_flight:  # what the load balancer reported, for the replicas READY now (one not reported is idle)
        counts = dict(in_flight)
        ongoing = tuple(float(counts.get(url or "", 0)) for url in census.ready_urls)
    else:
        ongoing = (0.0,) * len(census.ready_urls)
    metrics = Metrics(now=now, requests_in_window=load.requests_in_window, window_seconds=load.window_seconds,
                      ongoing_requests=ongoing, waiting_requests=load.waiting_requests,
                      ongoing_requests_by_url=in_flight)
    decision = autoscaler.decide(state, metrics)
    if not decision.decided and snapshot.observed is not None and snapshot.autoscaler == decision.state:
        return decision, snapshot.observed  # between decisions: nothing new to record
    observed = AutoscalerObservation(policy=autoscaler.name, raw_target=decision.raw_target, qps=decision.qps,
                                     average_ongoing=decision.average_ongoing, held_back=decision.held_back)
    return decision, observed


def plan_rollout(snapshot: ServiceSnapshot, steps: list[ReplicaStep], census: StepCensus, now: float, target: int,
                 canary: CanaryPass | None = None) -> tuple[list[ReplicaStep], tuple[int, ...]]:
    """One step of the current version's rollout: which outdated replicas go, which versions serve. A canary
    still stepping (or rolled back) decides this itself (``controller.canary_steps``); once promoted, the
    rolling strategy drains the old replicas."""
    if canary is not None:
        decided = plan_canary_rollout(snapshot, steps, canary)
        if decided is not None:
            return decided
    version = snapshot.service.current_version
    policy = snapshot.spec.service.replica_policy
    rollout = plan_rollout_step(snapshot.mode, version, census.live_current, census.outdated,
                                target, policy.min_replicas)
    victims = set(rollout.terminate)
    if not victims:
        return steps, rollout.active_versions
    steps = [_shut_down_step(s, now, f"replaced by version {version}") if s.record.replica_id in victims
             else s for s in steps]
    return steps, rollout.active_versions


def plan_prune_terminal(steps: list[ReplicaStep], census: StepCensus, keep: int) -> list[ReplicaStep]:
    """Drop terminal rows beyond the newest ``keep`` once their instance is gone, but never a row that the
    launch circuit breaker counts for the current version: with keep 2 and a failure limit of 5, pruning
    those rows kept the count at 2 and launching never stopped (62 launches in 60 s). At most
    ``failure_limit`` rows are held back this way, since launching stops at that count."""
    if census.prunable <= keep:  # nothing to prune (most passes): no sorting
        return steps
    terminal = sorted((s for s in steps if s.record.status.is_terminal and not s.terminate),
                      key=lambda s: -s.record.replica_id)
    counted = {r.replica_id for r in census.recent_failures}
    stale = {s.record.replica_id for s in terminal[keep:]} - counted
    if not stale:
        return steps
    return [s._replace(remove=True) if s.record.replica_id in stale else s for s in steps]


def plan_launches(snapshot: ServiceSnapshot, census: StepCensus, settings: ControllerSettings,
                  target: int, now: float) -> list[LaunchBatch]:
    """One batch per market that is short of its target; unconfirmed launches are re-sent with it. With
    ``spot_placer: dynamic_fallback`` the spot market's new replicas are split by the zone each tries first
    (``plan.spot_placer``), a batch per zone order."""
    service = snapshot.service
    if census.is_launch_blocked(settings.failure_limit):
        return []
    live = census.live_current
    markets = _market_targets(snapshot, live, target)
    batches = []
    for is_spot in (False, True):
        retry = tuple(r for r in census.relaunch if r.is_spot == is_spot)
        missing = max(0, markets.for_market(is_spot) - sum(1 for r in live if r.is_spot == is_spot))
        if missing or retry:
            versions = {service.current_version, *(r.version for r in retry)}
            batch = LaunchBatch(service=service.name, version=service.current_version,
                                cloud=snapshot.spec.cloud.value, is_spot=is_spot, count=missing, retry=retry,
                                specs={v: snapshot.versions[v] for v in versions})
            placer = snapshot.spec.service.replica_policy.spot_placer
            batches.extend(_place_spot(snapshot, batch, now) if is_spot and placer and missing else [batch])
    return batches


def _place_spot(snapshot: ServiceSnapshot, batch: LaunchBatch, now: float) -> list[LaunchBatch]:
    """``batch`` (spot) split by the zone order the spot placer gives each new replica; the retried rows
    go with the first part, in their version's own order."""
    spec = snapshot.spec
    zones = find_spot_zones(spec)
    if len(zones) < 2:
        return [batch]
    live = Counter(r.zone for r in snapshot.replicas if r.is_spot and r.status.is_live and r.zone in zones)
    orders = plan_spot_zone_orders(zones, live, find_preemptive_zones(snapshot.replicas, now), batch.count)
    parts: list[LaunchBatch] = []
    for order, count in Counter(orders).items():  # in the order first given
        specs = {**batch.specs, batch.version: with_spot_zone_order(spec, order)}
        parts.append(dataclasses.replace(batch, count=count, retry=batch.retry if not parts else (), specs=specs))
    return parts


def plan_service_status(snapshot: ServiceSnapshot, census: StepCensus, settings: ControllerSettings,
                        target: int) -> tuple[ServiceStatus, str | None]:
    """The status of a service that is not going down, as follows from its replicas (after this pass's
    decisions), with a reason."""
    service = snapshot.service
    blocked = None
    if census.is_launch_blocked(settings.failure_limit):
        failures = census.recent_failures
        last = max(failures, key=lambda r: r.replica_id)
        blocked = (f"{len(failures)} replicas of version {service.current_version} failed before becoming ready, "
                   f"launching stopped; last: replica {last.replica_id} {last.status.value}: {last.status_reason}")
    if census.ready_urls:
        # Still serving (older replicas, or some of this version): READY, with the failing rollout named.
        return ServiceStatus.READY, blocked
    if blocked:
        return ServiceStatus.FAILED, blocked
    if target == 0 and not census.live_current and not census.outdated:
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
