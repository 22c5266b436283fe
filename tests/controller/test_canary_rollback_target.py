"""Which version a rolled-back canary, or watched `--auto-rollback` update, goes back to
(``canary_steps.plan_rollback``, which both passes ask): the newest older version with a live replica kept
this pass. A replica whose row goes this pass does not count; the watch's pass used to count it, and went back
to its version while the traffic went back to another. Values in, a value out: the steps are built here."""

from __future__ import annotations

import pytest

from skyserve_lite.controller.canary_steps import find_old_ready, plan_canary_pass, plan_rollback, plan_watch_pass
from skyserve_lite.controller.pass_types import Rollback, ServiceSnapshot
from skyserve_lite.controller.replica_rules import ReplicaStep
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings, CanaryState, Command
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceRecord, ServiceStatus, StoredCanary

TASK = parse_task("service: {replicas: 2}\nrun: python serve.py\n")
READY, FAILED = ReplicaStatus.READY, ReplicaStatus.FAILED


def step(replica_id: int, version: int, status: ReplicaStatus = READY, remove: bool = False) -> ReplicaStep:
    record = ReplicaRecord(service="svc", replica_id=replica_id, version=version, status=status, cloud="local",
                           launched_at=0.0, status_since=0.0, launch_token=f"t{replica_id}",
                           first_ready_at=0.0 if status is READY else None)
    return ReplicaStep(record, remove=remove)


def rolled_back(version: int) -> CanaryState:
    return CanaryState(version=version, settings=CanarySettings(), phase=CanaryPhase.ROLLED_BACK,
                       verdict=f"version {version} rolled back: bad")


# Version 3 rolled back; a version-1 replica is kept READY and a version-2 one is live but its row goes this
# pass: the rollback goes to 1, where the traffic goes (``find_old_ready``), not to 2.
GOING = [step(1, 1), step(2, 2, remove=True), step(3, 3), step(4, 3)]


@pytest.mark.parametrize(("steps", "to_version"), [
    (GOING, 1),
    ([step(1, 1), step(2, 2), step(3, 3)], 2),  # the newest older version kept
    ([step(1, 1, FAILED), step(3, 3)], 2),  # no older replica live: the version before
    ([step(3, 3), step(4, 3)], 2),
])
def test_the_rollback_goes_to_the_newest_older_version_kept(steps: list[ReplicaStep], to_version: int) -> None:
    rollback = plan_rollback("svc", rolled_back(3), steps)
    assert rollback == Rollback("svc", 3, to_version, "version 3 rolled back: bad")


def test_no_rollback_of_version_1_or_of_a_rollout_not_rolled_back() -> None:
    assert plan_rollback("svc", rolled_back(1), [step(1, 1)]) is None
    assert plan_rollback("svc", CanaryState(version=3, settings=CanarySettings()), GOING) is None


def snapshot(mode: UpdateMode, state: CanaryState, command: Command | None = None) -> ServiceSnapshot:
    service = ServiceRecord(name="svc", current_version=3, status=ServiceStatus.READY, status_reason=None,
                            lb_port=30001, lb_pid=None, lb_policy="least_load", deleting=False, created_at=0.0,
                            next_replica_id=5, active_versions=(1, 2, 3))
    replicas = tuple(s.record for s in GOING)
    return ServiceSnapshot(service=service, versions={1: TASK, 2: TASK, 3: TASK}, replicas=replicas, lb_alive=True,
                           mode=mode, canary=StoredCanary(state, 10, command))


def test_a_canary_and_a_watched_update_go_back_where_the_traffic_goes() -> None:
    """The case where the two passes differed: the watch went back to version 2, whose only replica goes."""
    assert find_old_ready(GOING, 3) == (1,)
    stepping = CanaryState(version=3, settings=CanarySettings(), window_start=0.0)
    canary = plan_canary_pass(snapshot(UpdateMode.CANARY, stepping, Command.ABORT), GOING, 10.0, 2)
    watching = CanaryState(version=3, settings=CanarySettings(), phase=CanaryPhase.WATCHING)
    # Launching stopped on the new version's failures: the watch rolls back in this pass.
    watch = plan_watch_pass(snapshot(UpdateMode.ROLLING, watching), GOING, 10.0, 2, launch_blocked=True)
    assert watch is not None
    assert canary.decision.state.phase is CanaryPhase.ROLLED_BACK
    assert watch.decision.state.phase is CanaryPhase.ROLLED_BACK
    assert canary.rollback is not None and canary.rollback.to_version == 1
    assert watch.rollback is not None and watch.rollback.to_version == 1
