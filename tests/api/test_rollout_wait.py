"""Waiting for a rollout (`serve update --wait`, `serve wait`): what one read of the service means
(``find_rollout_progress``, a table), and the loop that polls until done, failed, superseded or timed out."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController, ServiceView
from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.clock import FakeClock
from skyserve_lite.defaults import LB_REFRESH_SECONDS
from skyserve_lite.errors import WaitTimeoutError
from skyserve_lite.state.models import AutoscalerObservation, ReplicaRecord, ReplicaStatus, ServiceRecord, ServiceStatus
from skyserve_lite.waits import (
    LB_REFRESH_MARGIN_SECONDS,
    RolloutOutcome,
    find_rollout_progress,
    wait_for_rollout,
    wait_until_replicas_gone,
)

from ..controller.conftest import TASK, Harness

R = ReplicaStatus
S = ServiceStatus


def replica(replica_id: int, version: int, status: ReplicaStatus, reason: str | None = None) -> ReplicaRecord:
    return ReplicaRecord(service="web", replica_id=replica_id, version=version, status=status, cloud="local",
                         launched_at=0.0, status_since=0.0, launch_token="t", status_reason=reason)


def view(replicas: Sequence[ReplicaRecord], *, version: int = 2, target: int | None = 2,
         target_version: int | None = None, status: ServiceStatus = S.READY, reason: str | None = None,
         deleting: bool = False) -> ServiceView:
    service = ServiceRecord(name="web", current_version=version, status=status, status_reason=reason,
                            lb_port=30001, lb_pid=None, lb_policy="least_load", deleting=deleting, created_at=0.0,
                            next_replica_id=9)
    autoscaler = None if target is None else (
        AutoscalerState(version=target_version or version, target=target),
        AutoscalerObservation(policy="fixed", raw_target=target, qps=None, average_ongoing=None, held_back=None))
    return ServiceView(service=service, policy="Fixed 2 replicas", load_balancing_policy="least_load",
                       replicas=tuple(replicas), events=(), autoscaler=autoscaler)


CASES = [
    ("new READY at the target, old gone",
     view([replica(3, 2, R.READY), replica(4, 2, R.READY)]), RolloutOutcome.DONE, "2/2 READY"),
    ("old replicas draining do not hold it back",
     view([replica(1, 1, R.SHUTTING_DOWN), replica(3, 2, R.READY), replica(4, 2, R.READY)]),
     RolloutOutcome.DONE, "2/2 READY"),
    ("reused replicas count as the version's own",
     view([replica(1, 2, R.READY), replica(2, 2, R.READY)]), RolloutOutcome.DONE, "2/2 READY"),
    ("scaled to zero with nothing old left",
     view([], target=0, status=S.NO_REPLICA), RolloutOutcome.DONE, "0/0 READY"),
    ("the controller has not passed over the version yet",
     view([replica(1, 1, R.READY), replica(2, 1, R.READY)], target_version=1), RolloutOutcome.IN_PROGRESS,
     "the controller's first pass over version 2"),
    ("a stale reason of the previous version is not a failure before the first pass",
     view([replica(1, 1, R.READY)], target_version=1, reason="3 replicas of version 1 failed"),
     RolloutOutcome.IN_PROGRESS, "the controller's first pass over version 2"),
    ("a new replica starting: named with its reason",
     view([replica(1, 1, R.READY), replica(3, 2, R.READY), replica(4, 2, R.STARTING, "running setup (12s)")]),
     RolloutOutcome.IN_PROGRESS, "replica 4 to become READY, now STARTING: running setup (12s)"),
    ("enough new READY but an old one still serves",
     view([replica(1, 1, R.READY), replica(3, 2, R.READY), replica(4, 2, R.READY)]),
     RolloutOutcome.IN_PROGRESS, "replica 1 of older versions to leave traffic"),
    ("short of the target with nothing starting",
     view([replica(3, 2, R.READY)]), RolloutOutcome.IN_PROGRESS, "the controller to launch 1 more of version 2"),
    ("launching stopped while old replicas serve",
     view([replica(1, 1, R.READY), replica(3, 2, R.FAILED_INITIAL_DELAY)],
          reason="3 replicas of version 2 failed before becoming ready, launching stopped"),
     RolloutOutcome.FAILED, "3 replicas of version 2 failed before becoming ready, launching stopped "
     "(see `sky-lite serve logs web 3`)"),
    ("the service FAILED",
     view([replica(3, 2, R.FAILED)], status=S.FAILED, reason="launching stopped"), RolloutOutcome.FAILED,
     "launching stopped (see `sky-lite serve logs web 3`)"),
    ("a newer version was submitted",
     view([replica(3, 2, R.READY)], version=3), RolloutOutcome.SUPERSEDED, "version 3 was submitted meanwhile"),
    ("the service is going down",
     view([replica(3, 2, R.SHUTTING_DOWN)], deleting=True, status=S.SHUTTING_DOWN), RolloutOutcome.FAILED,
     "the service is shutting down"),
]


@pytest.mark.parametrize(("case", "seen", "outcome", "detail"), CASES, ids=[c[0] for c in CASES])
def test_rollout_progress(case: str, seen: ServiceView, outcome: RolloutOutcome, detail: str) -> None:
    progress = find_rollout_progress(seen, 2)
    assert progress.outcome is outcome
    assert progress.detail.startswith(detail)


def test_progress_counts_each_side_by_status() -> None:
    progress = find_rollout_progress(view([replica(1, 1, R.READY), replica(2, 1, R.SHUTTING_DOWN),
                                           replica(3, 2, R.READY), replica(4, 2, R.STARTING),
                                           replica(5, 2, R.FAILED)]), 2)
    assert progress.new == ((R.STARTING, 1), (R.READY, 1))
    assert progress.old == ((R.READY, 1), (R.SHUTTING_DOWN, 1))
    assert (progress.ready, progress.target) == (1, 2)
    assert progress.summary(41.2) == "web: version 2 rolled out, 1/2 READY in 41s"


class Scripted:
    """Answers ``get_status`` with the next view of a script (the last one repeats)."""

    def __init__(self, views: Sequence[ServiceView]) -> None:
        self._views = list(views)
        self.polls = 0

    def get_status(self, names: Sequence[str] = ()) -> list[ServiceView]:
        self.polls += 1
        return [self._views[min(self.polls, len(self._views)) - 1]]


def test_the_wait_follows_the_current_version_until_done() -> None:
    clock = FakeClock()
    script = Scripted([view([replica(1, 1, R.READY)], target_version=1),
                       view([replica(1, 1, R.READY), replica(3, 2, R.STARTING)]),
                       view([replica(1, 1, R.SHUTTING_DOWN), replica(3, 2, R.READY), replica(4, 2, R.READY)])])
    seen: list[RolloutOutcome] = []
    done = wait_for_rollout(script, "web", None, 60, on_progress=lambda p, _v: seen.append(p.outcome),
                            poll_seconds=1, clock=clock)
    assert (done.version, done.outcome, done.ready) == (2, RolloutOutcome.DONE, 2)
    assert seen == [RolloutOutcome.IN_PROGRESS, RolloutOutcome.IN_PROGRESS, RolloutOutcome.DONE]
    # Replica 1 drains: one load balancer refresh (and a margin) more, so that it no longer gets requests.
    assert clock.sleeps == [1, 1, LB_REFRESH_SECONDS + LB_REFRESH_MARGIN_SECONDS]


def test_old_replicas_gone_between_two_polls_still_leave_the_load_balancer_its_refresh() -> None:
    clock = FakeClock()
    script = Scripted([view([replica(1, 1, R.READY), replica(3, 2, R.READY)]),  # drained and removed unseen
                       view([replica(3, 2, R.READY), replica(4, 2, R.READY)])])
    wait_for_rollout(script, "web", 2, 60, poll_seconds=1, clock=clock)
    assert clock.sleeps == [1, LB_REFRESH_SECONDS + LB_REFRESH_MARGIN_SECONDS]


def test_a_rollout_with_nothing_old_left_returns_at_once() -> None:
    clock = FakeClock()
    done = wait_for_rollout(Scripted([view([replica(3, 2, R.READY), replica(4, 2, R.READY)])]), "web", 2, 60,
                            clock=clock)
    assert done.outcome is RolloutOutcome.DONE and clock.sleeps == []


def test_the_wait_gives_up_at_its_deadline_naming_the_stuck_replica() -> None:
    clock = FakeClock()
    script = Scripted([view([replica(1, 1, R.READY), replica(3, 2, R.STARTING, "cannot connect")])])
    with pytest.raises(WaitTimeoutError, match=r"web: version 2 is not rolled out after 3s \(0/2 READY\); "
                       r"waiting for replica 3 to become READY, now STARTING: cannot connect"):
        wait_for_rollout(script, "web", 2, 3, poll_seconds=1, clock=clock)
    assert script.polls == 4


@pytest.mark.parametrize(("seen", "message"), [
    (view([replica(3, 2, R.FAILED)], status=S.FAILED, reason="launching stopped"),
     "web: version 2 did not roll out: launching stopped"),
    (view([replica(3, 2, R.READY)], version=3), "web: stopped waiting for version 2: version 3 was submitted"),
])
def test_a_failed_or_superseded_rollout_ends_the_wait_at_once(seen: ServiceView, message: str) -> None:
    clock = FakeClock()
    with pytest.raises(WaitTimeoutError, match=message):
        wait_for_rollout(Scripted([seen]), "web", 2, 600, clock=clock)
    assert clock.sleeps == []


def test_waiting_for_a_version_not_stored_is_refused() -> None:
    with pytest.raises(WaitTimeoutError, match=r"service web has no version 5 \(its current version is 2\)"):
        wait_for_rollout(Scripted([view([])]), "web", 5, 600, clock=FakeClock())


def test_replicas_gone_once_none_is_live_or_draining() -> None:
    clock = FakeClock()
    script = Scripted([view([replica(1, 2, R.READY), replica(2, 2, R.READY)]),
                       view([replica(1, 2, R.SHUTTING_DOWN), replica(2, 2, R.READY)]),
                       view([replica(2, 2, R.READY), replica(3, 2, R.STARTING)])])
    wait_until_replicas_gone(script, "web", [1], 60, poll_seconds=1, clock=clock)
    assert script.polls == 3
    with pytest.raises(WaitTimeoutError, match=r"still terminating after 2s: replica 2 READY"):
        wait_until_replicas_gone(Scripted([view([replica(2, 2, R.READY)])]), "web", [2], 2, poll_seconds=1,
                                 clock=FakeClock())


def test_the_target_counts_the_overprovisioned_spares_the_controller_steers_to() -> None:
    seen = dataclasses.replace(view([replica(3, 2, R.READY), replica(4, 2, R.READY)]), target_replicas=3)
    progress = find_rollout_progress(seen, 2)
    assert (progress.outcome, progress.target) == (RolloutOutcome.IN_PROGRESS, 3)
    assert progress.detail == "the controller to launch 1 more of version 2"


def test_the_view_says_what_the_controller_steers_to(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "home")
    text = TASK.format(replicas=2).replace("  replicas: 2\n", "  replica_policy:\n    min_replicas: 2\n"
                                           "    max_replicas: 4\n    target_qps_per_replica: 5\n"
                                           "    num_overprovision: 1\n")
    harness.create(text=text)
    (before,) = LocalController(harness.home, start_daemon=False).get_status(["svc"])
    assert before.target_replicas is None  # no pass yet
    harness.tick()
    (after,) = LocalController(harness.home, start_daemon=False).get_status(["svc"])
    assert after.target_replicas == 3
    harness.store.close()
