"""One controller pass, decided: desired state (store) + observed state (inventory, probes) -> ``PassPlan``.

A pass is ``plan_service_pass`` for each service plus ``plan_orphans``, merged (``merge_plans``); the
``Reconciler`` composes them, and ``controller.forecast`` runs ``plan_service_pass`` forward to plan an
update. Pure: no I/O, no clock reads; the executor applies the plan. Level-based: the plan depends only on the
snapshot, never on what the previous pass did, so a pass after a crash simply continues.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.autoscalers.target import compute_target_replicas
from skyserve_lite.controller.canary_steps import CanaryPass, plan_canary_drain, plan_canary_pass, plan_watch_pass
from skyserve_lite.controller.pass_types import (
    EMPTY_PLAN,
    Event,
    LaunchBatch,
    Observation,
    PassPlan,
    ProbeTarget,
    ReplicaKey,
    ServiceSnapshot,
    Termination,
)
from skyserve_lite.controller.replica_rules import ProbeResult, ReplicaStep, plan_replica
from skyserve_lite.controller.replica_table import ReplicaTable
from skyserve_lite.controller.service_steps import (
    StepCensus,
    plan_autoscale,
    plan_launches,
    plan_load_balancer,
    plan_prune_terminal,
    plan_requested_terminations,
    plan_reuse,
    plan_rollout,
    plan_scale_down,
    plan_service_status,
    plan_shut_down,
)
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.controller.settled import ServiceMemos
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.providers.base import Instance, InstanceState
from skyserve_lite.state.models import (
    AutoscalerObservation,
    ReplicaRecord,
    ReplicaStatus,
    ServiceStatus,
)

__all__ = ["Event", "InstanceIndex", "LaunchBatch", "Observation", "PassPlan", "ProbeTarget", "ReplicaKey",
           "ServiceSnapshot", "Termination", "find_probe_targets", "merge_plans", "plan_orphans", "plan_service_pass",
           "plan_service_status"]


class InstanceIndex:
    """The observed instances, found by id or (for a launch never confirmed) by the tags they carry."""

    def __init__(self, observation: Observation) -> None:
        self.known_clouds = observation.known_clouds
        self._instances = observation.instances
        # By cloud, then id: ids are unique within a cloud, and a (cloud, id) key per instance cost a tuple.
        self._by_id = {cloud: {i.instance_id: i for i in found} for cloud, found in observation.instances.items()}
        self._by_tag: dict[tuple[str, str, int], Instance] | None = None
        # What ``find_all`` found last, by the identity of the rows it was asked about (kept, so that the id
        # is not reused): probing and planning both ask about every service's replicas in one pass.
        self._found: dict[int, tuple[Sequence[ReplicaRecord], list[Instance | None]]] = {}

    @property
    def by_tag(self) -> dict[tuple[str, str, int], Instance]:
        """Instances by (cloud, service, replica id): built on first use, since only a launch that was never
        confirmed (a rare row with no instance id) is looked up this way."""
        if self._by_tag is None:
            self._by_tag = {(cloud, i.service, i.replica_id): i for cloud, found in self._instances.items()
                            for i in found if i.state is not InstanceState.TERMINATED}
        return self._by_tag

    def find(self, replica: ReplicaRecord) -> Instance | None:
        if replica.instance_id is not None:
            ids = self._by_id.get(replica.cloud)
            return None if ids is None else ids.get(replica.instance_id)
        return self.by_tag.get((replica.cloud, replica.service, replica.replica_id))

    def find_all(self, replicas: Sequence[ReplicaRecord]) -> list[Instance | None]:
        """``find`` of each of ``replicas``, in order; asked again about the very same rows, the same list."""
        found = self._found.get(id(replicas))
        if found is not None and found[0] is replicas:
            return found[1]
        instances = [self.find(replica) for replica in replicas]
        self._found[id(replicas)] = (replicas, instances)
        return instances


def find_probe_targets(snapshots: Sequence[ServiceSnapshot], index: InstanceIndex) -> list[ProbeTarget]:
    """Replicas worth probing this pass: live, with a running instance that has a url."""
    targets = []
    known, running = index.known_clouds, InstanceState.RUNNING
    for snapshot in snapshots:
        probes = snapshot.readiness_probes
        for replica, instance in zip(snapshot.replicas, index.find_all(snapshot.replicas), strict=True):
            if not replica.status.is_live or replica.cloud not in known:
                continue
            if instance is None or instance.state is not running or instance.url is None:
                continue
            targets.append(ProbeTarget(replica.service, replica.replica_id, instance.url, probes[replica.version]))
    return targets


def merge_plans(parts: Sequence[PassPlan]) -> PassPlan:
    """One plan holding every part's decisions, in order; terminations once each."""
    parts = [p for p in parts if p is not EMPTY_PLAN]  # most services' parts in a steady pass
    if not parts:
        return EMPTY_PLAN
    return PassPlan(
        replica_updates=tuple(r for p in parts for r in p.replica_updates),
        removals=tuple(k for p in parts for k in p.removals),
        terminations=tuple(sorted({t for p in parts for t in p.terminations})),
        launches=tuple(b for p in parts for b in p.launches),
        start_lbs=tuple(s for p in parts for s in p.start_lbs),
        stop_lbs=tuple(s for p in parts for s in p.stop_lbs),
        lb_policy_changes=tuple(c for p in parts for c in p.lb_policy_changes),
        status_changes=tuple(c for p in parts for c in p.status_changes),
        deletions=tuple(d for p in parts for d in p.deletions),
        active_version_changes=tuple(c for p in parts for c in p.active_version_changes),
        autoscaler_updates=tuple(u for p in parts for u in p.autoscaler_updates),
        requests_done=tuple(k for p in parts for k in p.requests_done),
        canary_updates=tuple(u for p in parts for u in p.canary_updates),
        rollbacks=tuple(r for p in parts for r in p.rollbacks),
        events=tuple(e for p in parts for e in p.events),
    )


def plan_orphans(table: ReplicaTable, observation: Observation, unknown_services: Collection[str] = ()) -> PassPlan:
    """Terminate instances no replica row claims (launched before a crash for a row that is gone).

    Instances of ``unknown_services`` (services whose state could not be read this pass) are never
    orphans: their rows exist, this pass just cannot see them.
    """
    unknown = set(unknown_services)
    none: frozenset[str] = frozenset()
    claimed, adoptable = table.claimed, table.adoptable
    orphans: list[tuple[str, Instance]] = []
    for cloud, found in observation.instances.items():
        ids = claimed.get(cloud, none)
        orphans.extend((cloud, i) for i in found
                       if i.instance_id not in ids and i.state is not InstanceState.TERMINATED
                       and i.service not in unknown and (cloud, i.service, i.replica_id) not in adoptable)
    return PassPlan(
        terminations=tuple(sorted({Termination(i.service, cloud, i.instance_id) for cloud, i in orphans})),
        events=tuple(Event(i.service, i.replica_id, "orphan", f"terminating {cloud} instance {i.instance_id} "
                           "that no replica claims") for cloud, i in orphans),
    )


def plan_service_pass(snapshot: ServiceSnapshot, index: InstanceIndex,
                      probes: Mapping[ReplicaKey, ProbeResult], now: float,
                      settings: ControllerSettings, settled: ServiceMemos | None = None) -> PassPlan:
    """Everything one pass does for one service: each replica's next step, reuse, the autoscaler, scaling
    per market, one rollout step, launches, the load balancer and the service status.

    ``settled`` (the controller's memos, kept across passes) remembers services whose pass decided nothing:
    when nothing this pass reads of one changed in the database (its change counter stands) and it leaves
    every replica and the autoscaler as they were, it decides nothing again, and the steps after the
    replicas' own are not taken (``controller.settled``).
    """
    steps, unchanged = plan_replica_steps(snapshot, index, probes, now, settings)
    known = index.known_clouds
    if settled is not None and not snapshot.service.deleting and unchanged and not is_canary_stepping(snapshot):
        census = settled.find(snapshot, known)
        if census is not None and (not snapshot.spec.service.replica_policy.is_autoscaling
                                   or _is_decision_stored(snapshot, census, now, settings)):
            # A fixed policy decides from nothing the key leaves out (its version's policy): as last pass.
            settled.carry(snapshot)
            return EMPTY_PLAN
    plan, census = _plan_service_steps(snapshot, steps, known, now, settings)
    if settled is not None and plan is EMPTY_PLAN and census is not None:
        settled.remember(snapshot, known, census)  # EMPTY_PLAN: every step was unchanged
    return plan


def is_canary_stepping(snapshot: ServiceSnapshot) -> bool:
    """Whether a canary rollout (or the watch of an update with `--auto-rollback`) of the current version is
    under way: its bake window ends with no row changing, so such a service is never taken as settled."""
    stored = snapshot.canary
    if snapshot.mode is not UpdateMode.CANARY:
        return (stored is not None and stored.state.version == snapshot.service.current_version
                and not stored.state.is_done)
    return (stored is None or stored.state.version != snapshot.service.current_version
            or not stored.state.is_done or stored.command is not None)


def _is_decision_stored(snapshot: ServiceSnapshot, census: StepCensus, now: float,
                        settings: ControllerSettings) -> bool:
    """Whether the autoscaler's decision this pass is the one the store holds (no update to write)."""
    decision, observed = plan_autoscale(snapshot, census, now, settings)
    return (decision.state, observed) == (snapshot.autoscaler, snapshot.observed)


def plan_replica_steps(snapshot: ServiceSnapshot, index: InstanceIndex, probes: Mapping[ReplicaKey, ProbeResult],
                       now: float, settings: ControllerSettings) -> tuple[list[ReplicaStep], bool]:
    """Each replica's own next step (``plan_replica``), in the order of ``snapshot.replicas``, and whether
    every step keeps its replica's very row and asks for nothing (told in the same loop: it is asked of
    every service of every pass)."""
    steps: list[ReplicaStep] = []
    unchanged = True
    known, name = index.known_clouds, snapshot.service.name
    readiness = snapshot.readiness_probes
    for replica, instance in zip(snapshot.replicas, index.find_all(snapshot.replicas), strict=True):
        if replica.cloud not in known:
            steps.append(ReplicaStep(replica))  # inventory unknown this pass: decide nothing
            continue
        step = plan_replica(replica, instance, probes.get((name, replica.replica_id)), readiness[replica.version],
                            now, settings)
        if unchanged and (step.record is not replica or step.terminate or step.remove or step.relaunch
                          or step.event):
            unchanged = False
        steps.append(step)
    return steps, unchanged


def _plan_service_steps(snapshot: ServiceSnapshot, steps: list[ReplicaStep], known: frozenset[str], now: float,
                        settings: ControllerSettings) -> tuple[PassPlan, StepCensus | None]:
    """The rest of ``plan_service_pass`` after the replicas' own steps; with the census of the final steps
    (None for a service going down)."""
    service, name = snapshot.service, snapshot.service.name
    active_changes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    autoscaler_updates: tuple[tuple[str, AutoscalerState, AutoscalerObservation], ...] = ()
    target = version_target = 0
    canary: CanaryPass | None = None
    census: StepCensus | None = None  # None: the service is going down
    if service.deleting:
        steps = [plan_shut_down(step, now, settings) for step in steps]
    else:
        # Each phase returns the very steps it was given when it changes none (most passes), and the
        # census of the steps is counted again only after a phase that changed some.
        steps = plan_requested_terminations(snapshot, plan_reuse(snapshot, steps), now, known)
        census = StepCensus.of(steps, service.current_version)
        decision, observed = plan_autoscale(snapshot, census, now, settings)
        target = compute_target_replicas(snapshot.spec.service.replica_policy, decision.state)
        if (decision.state, observed) != (snapshot.autoscaler, snapshot.observed):
            autoscaler_updates = ((service.name, decision.state, observed),)
        # A canary scales its version to the step's replicas, not to the target (``controller.canary_steps``).
        canary = (plan_canary_pass(snapshot, steps, now, target) if snapshot.mode is UpdateMode.CANARY
                  else plan_watch_pass(snapshot, steps, now, target, census.is_launch_blocked(settings.failure_limit)))
        version_target = target if canary is None else canary.version_target
        if canary is not None:
            read, steps = steps, plan_canary_drain(steps, canary, now)
            census = census.recount(read, steps)
        read, steps = steps, plan_scale_down(snapshot, steps, census, now, version_target)
        census = census.recount(read, steps)
        read, (steps, active) = steps, plan_rollout(snapshot, steps, census, now, version_target, canary)
        census = census.recount(read, steps)
        read, steps = steps, plan_prune_terminal(steps, census, settings.keep_terminal_replicas)
        census = census.recount(read, steps)
        if active != service.active_versions:
            active_changes = ((service.name, active),)

    launches = [] if census is None else plan_launches(snapshot, census, settings, version_target, now)
    events: list[Event] = [] if canary is None or canary.event is None else [canary.event]
    updates: list[ReplicaRecord] = []
    terminations: list[Termination] = []
    removals: list[ReplicaKey] = []
    # Every step above maps the replica at its place, so the rows as read line up with the steps. Identity
    # first: an unchanged replica's step holds the very row it was given, and comparing 10,000 rows field
    # by field was a tenth of a steady pass.
    for s, old in zip(steps, snapshot.replicas, strict=True):
        record = s.record
        if record is old and not s.event and not s.terminate and not s.remove:
            continue  # nothing decided for this replica (most replicas of most passes)
        if s.event:
            events.append(Event(name, record.replica_id, "replica", s.event, warning=is_failing_step(record, old)))
        if s.terminate and record.instance_id is not None:
            terminations.append(Termination(name, record.cloud, record.instance_id))
        if s.remove:
            removals.append((name, record.replica_id))
        elif record is not old and record != old:
            updates.append(record)
    # A request is done once its replica is no longer live after this pass (drained above, gone, or taken
    # with the whole service); one whose cloud's inventory was unknown this pass waits for the next.
    requests_done: tuple[ReplicaKey, ...] = ()
    if snapshot.terminate_requested:
        still_live = {s.record.replica_id for s in steps if s.record.status.is_live and not s.remove}
        requests_done = tuple((service.name, replica_id) for replica_id in sorted(snapshot.terminate_requested)
                              if replica_id not in still_live)

    start_lbs, stop_lbs, policy_changes = plan_load_balancer(snapshot)
    deletions: tuple[str, ...] = ()
    # Rows removed in this pass have no instance left, and the load balancer stops before deletion.
    if service.deleting and all(s.remove for s in steps):
        deletions = (service.name,)
        events.append(Event(name, None, "service", "service removed"))

    status, reason = ((ServiceStatus.SHUTTING_DOWN, None) if census is None
                      else plan_service_status(snapshot, census, settings, target))
    status_changes: tuple[tuple[str, ServiceStatus, str | None], ...] = ()
    if not deletions and (status, reason) != (service.status, service.status_reason):
        status_changes = ((service.name, status, reason),)
        if status is not service.status:
            events.append(Event(service.name, None, "service", f"{status.value}" + (f": {reason}" if reason else ""),
                                warning=status is ServiceStatus.FAILED))
    canary_updates = () if canary is None or canary.update is None else (canary.update,)
    rollbacks = () if canary is None or canary.rollback is None else (canary.rollback,)
    if not (updates or removals or terminations or launches or start_lbs or stop_lbs or policy_changes
            or status_changes or deletions or events or active_changes or autoscaler_updates or requests_done
            or canary_updates or rollbacks):
        return EMPTY_PLAN, census  # nothing decided (most services of a steady pass): one shared plan
    return PassPlan(
        replica_updates=tuple(updates), removals=tuple(removals), terminations=tuple(terminations),
        launches=tuple(launches),
        start_lbs=start_lbs, stop_lbs=stop_lbs, lb_policy_changes=policy_changes,
        status_changes=status_changes, deletions=deletions, events=tuple(events),
        active_version_changes=active_changes, autoscaler_updates=autoscaler_updates,
        requests_done=requests_done, canary_updates=canary_updates, rollbacks=rollbacks,
    ), census


def is_failing_step(record: ReplicaRecord, old: ReplicaRecord) -> bool:
    """Whether a pass took a replica from ``old`` into a failing status (FAILED*, PREEMPTED, NOT_READY):
    its event is a warning. A replica reused while NOT_READY is no new failure."""
    status = record.status
    return status is not old.status and (status.is_terminal or status is ReplicaStatus.NOT_READY)

