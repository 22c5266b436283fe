"""The canary strategy of a controller pass: one step of ``plan.canary`` per pass, from the stored state.

``plan_canary_pass`` reads the stored rollout (or starts one), counts what the step needs from the census
and the load balancers' per-version counts, and decides (``plan.canary.plan_canary_step``). What follows
from the decision for this pass:

- stepping: the current version is scaled to the step's replicas (not to the target), nothing of the old
  version is terminated, and the new version is among the active versions only once its share is above 0;
- promoted (or nothing to judge): the rolling strategy takes over, old replicas go as new ones are READY;
- rolled back: the new version's replicas drain now (traffic is back on the old ones in this very pass) and
  the version the old replicas run becomes the next version (``Rollback``), so its replicas are reused and
  kept by the ordinary machinery from then on. A watched rolling or blue-green update (`--auto-rollback`)
  is rolled back the same way. Only while a READY replica of an older version remains: when none does (a
  rolling update had replaced them all), the new version's replicas keep serving, so capacity never drops
  to zero, and the rollback's rolling update replaces them as the old config's replicas become READY; the
  event says so.

Pure: values in, a value out; the executor stores the state and the rollback.
"""

from __future__ import annotations

from dataclasses import dataclass

from skyserve_lite.controller.pass_types import CanaryUpdate, Event, Rollback, ServiceSnapshot
from skyserve_lite.controller.replica_rules import ReplicaStep
from skyserve_lite.plan.canary import (
    CanaryAction,
    CanaryDecision,
    CanaryInputs,
    CanaryPhase,
    CanaryState,
    WatchInputs,
    compute_counts,
    find_canary_settings,
    plan_canary_step,
    plan_watch_step,
)
from skyserve_lite.state.models import ReplicaStatus, replace_replica

# A replica that could not be provisioned (no capacity, a quota) says nothing of the version it runs.
_NOT_THE_VERSIONS_FAULT = frozenset({ReplicaStatus.FAILED_PROVISION})


@dataclass(frozen=True)
class CanaryPass:
    decision: CanaryDecision
    version_target: int  # replicas of the current version this pass scales and launches to
    update: CanaryUpdate | None  # the state to store (None: as stored)
    rollback: Rollback | None
    event: Event | None
    # A watched rolling or blue-green update (`--auto-rollback`): the mode keeps its own replicas and traffic
    # until a rollback, which then takes traffic back as a canary's does (``plan_canary_drain``).
    is_watch: bool = False


def count_readiness_failures(steps: list[ReplicaStep], version: int) -> int:
    """Replicas of ``version`` that failed before they were ever READY. Every replica of the version was
    launched by its rollout, so each is a readiness failure of the version; one the cloud could not provision
    (``_NOT_THE_VERSIONS_FAULT``) is not."""
    return sum(1 for s in steps if s.record.version == version and s.record.status.is_app_failure
               and s.record.status not in _NOT_THE_VERSIONS_FAULT and s.record.first_ready_at is None)


def plan_canary_pass(snapshot: ServiceSnapshot, steps: list[ReplicaStep], now: float, target: int) -> CanaryPass:
    """The canary decision of this pass for the current version of ``snapshot`` (in mode canary), over the
    replica ``steps`` after reuse (reused replicas count as the current version's)."""
    service = snapshot.service
    version = service.current_version
    stored = snapshot.canary
    if stored is not None and stored.state.version == version:
        state, command = stored.state, stored.command
    else:  # not stored (yet), or a row of an earlier version's rollout
        settings = find_canary_settings(snapshot.spec.service.canary)  # flags come in the stored row
        state, command = CanaryState(version=version, settings=settings), None
    live = [s.record for s in steps if s.record.status.is_live and not s.remove]
    current = [r for r in live if r.version == version]
    outdated = [r for r in live if r.version != version]
    failures = count_readiness_failures(steps, version)
    new_counts, old_counts = compute_counts(snapshot.canary_counts, version)
    fresh = state.step == 0 and state.window_start is None and state.phase is CanaryPhase.STEPPING
    inputs = CanaryInputs(target=target, new_ready=sum(1 for r in current if r.status is ReplicaStatus.READY),
                          readiness_failures=failures, new_counts=new_counts, old_counts=old_counts,
                          config_changed=not (fresh and not outdated), command=command)
    decision = plan_canary_step(state, inputs, now)
    update = None
    if stored is None or stored.state != decision.state or stored.percent != decision.percent or command:
        update = CanaryUpdate(service.name, decision.state, decision.percent, command)
    rollback = plan_rollback(service.name, decision.state, steps)
    event = None
    message = _with_capacity_note(decision, steps, version)
    if message:
        event = Event(service.name, None, "canary", message,
                      warning=decision.action in (CanaryAction.ROLL_BACK, CanaryAction.PAUSED))
    version_target = target if decision.state.phase is not CanaryPhase.STEPPING else decision.new_replicas
    if decision.state.phase is CanaryPhase.ROLLED_BACK:
        version_target = compute_rolled_back_target(steps, version)
    return CanaryPass(decision, version_target, update, rollback, event)


def plan_watch_pass(snapshot: ServiceSnapshot, steps: list[ReplicaStep], now: float, target: int,
                    launch_blocked: bool) -> CanaryPass | None:
    """The watch of a rolling or blue-green update with `--auto-rollback` (a stored ``WATCHING`` row of the
    current version), or None when there is none to keep. The new version takes traffic once it has a READY
    replica among the versions the load balancer serves (as the last pass stored them).

    A ``ROLLED_BACK`` row of the current version is a rollback whose pass stopped after storing the verdict
    (the executor stores it first): this pass drains and rolls back again, as a canary's does."""
    service = snapshot.service
    version = service.current_version
    stored = snapshot.canary
    if stored is None or stored.state.version != version or stored.state.phase not in (CanaryPhase.WATCHING,
                                                                                        CanaryPhase.ROLLED_BACK):
        return None
    serving = service.active_versions or (version,)
    taking_traffic = version in serving and any(
        s.record.version == version and s.record.status is ReplicaStatus.READY and not s.remove for s in steps)
    failures = count_readiness_failures(steps, version)
    new_counts, old_counts = compute_counts(snapshot.canary_counts, version)
    decision = plan_watch_step(stored.state, WatchInputs(taking_traffic, failures, launch_blocked, new_counts,
                                                         old_counts), now)
    # The share stored is the decision's (100 while the mode's own traffic flows, 0 once rolled back), as
    # `serve status` shows it: storing 0 with the window's start made a watched version taking every request
    # read "0%".
    update = (None if decision.state == stored.state and decision.percent == stored.percent
              else CanaryUpdate(service.name, decision.state, decision.percent))
    rollback = plan_rollback(service.name, decision.state, steps)
    version_target = target
    if decision.state.phase is CanaryPhase.ROLLED_BACK:
        version_target = compute_rolled_back_target(steps, version)
    message = _with_capacity_note(decision, steps, version)
    event = None if message is None else Event(
        service.name, None, "canary", message, warning=decision.action is CanaryAction.ROLL_BACK)
    return CanaryPass(decision, version_target, update, rollback, event, is_watch=True)


def plan_rollback(service: str, state: CanaryState, steps: list[ReplicaStep]) -> Rollback | None:
    """The rollback of a canary (or watched update) whose ``state`` says ROLLED_BACK, None otherwise: to the
    newest older version with a live replica kept in ``steps``, else to the version before (3 rolled back
    with no older replica left goes to 2); None for version 1, which has nothing older.

    A replica whose row goes in this pass (``remove``) is no capacity to go back to: taking its version (2,
    say, over a kept READY replica of 1) would make the rollback's config one that no kept replica runs, and
    the version-1 replicas the traffic goes back to (``find_old_ready``, which skips it too) would be
    replaced by the rollback's rolling update rather than reused, unless the two configs are the same."""
    if state.phase is not CanaryPhase.ROLLED_BACK:
        return None
    version = state.version
    stable = max((s.record.version for s in steps if s.record.version != version and s.record.status.is_live
                  and not s.remove), default=version - 1)
    if stable < 1:
        return None
    return Rollback(service, version, stable, state.verdict or f"version {version} rolled back")


def find_old_ready(steps: list[ReplicaStep], version: int) -> tuple[int, ...]:
    """The older versions (not ``version``) with a READY replica kept in ``steps``, in order."""
    return tuple(sorted({s.record.version for s in steps if s.record.version != version and not s.remove
                         and s.record.status is ReplicaStatus.READY}))


def compute_rolled_back_target(steps: list[ReplicaStep], version: int) -> int:
    """Replicas of a rolled-back ``version`` to keep in the pass that rolls it back: none when an older
    version has a READY replica to take the traffic; else the live ones it has (4 of a rolling update that
    replaced all 4 old ones serve until the rollback's are READY), launching none more."""
    if find_old_ready(steps, version):
        return 0
    return sum(1 for s in steps if s.record.version == version and s.record.status.is_live and not s.remove)


def _with_capacity_note(decision: CanaryDecision, steps: list[ReplicaStep], version: int) -> str | None:
    """The decision's event text; a rollback with no READY replica of an older version left says that the
    rolled-back version keeps serving meanwhile."""
    message = decision.message
    if decision.action is not CanaryAction.ROLL_BACK or message is None or find_old_ready(steps, version):
        return message
    return (f"{message}; no READY replica of an older version remains: version {version} keeps serving until "
            "the rollback's replicas are READY")


def plan_canary_drain(steps: list[ReplicaStep], canary: CanaryPass, now: float) -> list[ReplicaStep]:
    """A rolled-back canary's (or watched update's) replicas taken out of traffic now, with the verdict as the
    reason, when a READY replica of an older version remains to take it; the very ``steps`` otherwise. With
    none (a rolling update that replaced all 4 old replicas before its window was judged), draining would
    leave 0 replicas serving: the new ones serve until the rollback's rolling update replaces them."""
    state = canary.decision.state
    if state.phase is not CanaryPhase.ROLLED_BACK:
        return steps
    version, reason = state.version, state.verdict or f"version {state.version} rolled back"
    if not any(s.record.version == version and s.record.status.is_live and not s.remove for s in steps):
        return steps
    if not find_old_ready(steps, version):
        return steps
    return [_drain(s, now, reason) if s.record.version == version and s.record.status.is_live and not s.remove
            else s for s in steps]


def plan_canary_rollout(snapshot: ServiceSnapshot, steps: list[ReplicaStep], canary: CanaryPass
                        ) -> tuple[list[ReplicaStep], tuple[int, ...]] | None:
    """The rollout step of a canary still stepping or rolled back: (steps, active versions); None once it is
    promoted (or had nothing to judge), when the rolling strategy takes over."""
    phase = canary.decision.state.phase
    if phase in (CanaryPhase.PROMOTED, CanaryPhase.NOTHING_TO_JUDGE):
        return None
    if canary.is_watch and phase is not CanaryPhase.ROLLED_BACK:  # the mode's own traffic until a rollback
        return None
    version = snapshot.service.current_version
    old_ready = find_old_ready(steps, version)
    if phase is CanaryPhase.ROLLED_BACK:  # its replicas drained already when older ones serve (``plan_canary_drain``)
        return steps, old_ready or (version,)
    if not old_ready:  # nothing old serves: the new version serves what it can
        return steps, (version,)
    return steps, tuple(old_ready) + ((version,) if canary.decision.percent > 0 else ())


def _drain(step: ReplicaStep, now: float, reason: str) -> ReplicaStep:
    down = replace_replica(step.record, status=ReplicaStatus.SHUTTING_DOWN, status_since=now, status_reason=reason)
    return ReplicaStep(down, event=f"draining: {reason}")
