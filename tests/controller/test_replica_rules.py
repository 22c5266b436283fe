"""The life of one replica, as a table: row + instance + probe -> next status and side effects."""

from __future__ import annotations

import dataclasses

import pytest

from skyserve_lite.controller.replica_rules import (
    ProbeResult,
    compute_starting_reason,
    describe_starting,
    plan_replica,
)
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.base import Instance, InstanceState, Phase
from skyserve_lite.spec.model import ReadinessProbe
from skyserve_lite.state.models import ReplicaRecord
from skyserve_lite.state.models import ReplicaStatus as S

NOW = 10_000.0
SETTINGS = ControllerSettings(probe_failure_grace_seconds=180, provision_timeout_seconds=600)
PROBE = ReadinessProbe(initial_delay_seconds=60)
OK = ProbeResult(ok=True, detail="HTTP 200")
BAD = ProbeResult(ok=False, detail="HTTP 503")


def replica(status: S, *, instance_id: str | None = "i-1", age: float = 10, since: float = 10,
            failing_for: float | None = None, ever_ready: bool = False, seen: bool = True) -> ReplicaRecord:
    """``seen``: the inventory has listed its instance before."""
    return ReplicaRecord(
        service="svc", replica_id=1, version=1, status=status, cloud="fake", launched_at=NOW - age,
        status_since=NOW - since, launch_token="t", instance_id=instance_id, url="http://u" if seen else None,
        seen_at=NOW - age if seen else None,
        first_ready_at=NOW - age if ever_ready else None,
        probe_failing_since=None if failing_for is None else NOW - failing_for,
    )


def instance(state: InstanceState, detail: str | None = None) -> Instance:
    return Instance(instance_id="i-1", service="svc", replica_id=1, version=1, state=state, url="http://u",
                    detail=detail)


RUNNING = instance(InstanceState.RUNNING)


@pytest.mark.parametrize(
    ("row", "inst", "probe", "status", "terminate", "remove", "relaunch"),
    [
        pytest.param(replica(S.PROVISIONING), instance(InstanceState.PENDING), None,
                     S.PROVISIONING, False, False, False, id="pending-instance-stays-provisioning"),
        pytest.param(replica(S.PROVISIONING), RUNNING, None,
                     S.STARTING, False, False, False, id="running-instance-starts"),
        pytest.param(replica(S.PROVISIONING), RUNNING, OK,
                     S.READY, False, False, False, id="running-and-probe-ok-is-ready-at-once"),
        pytest.param(replica(S.STARTING, since=30), RUNNING, BAD,
                     S.STARTING, False, False, False, id="starting-within-initial-delay-waits"),
        pytest.param(replica(S.STARTING, since=61), RUNNING, BAD,
                     S.FAILED_INITIAL_DELAY, True, False, False, id="starting-past-initial-delay-fails"),
        pytest.param(replica(S.STARTING), RUNNING, OK,
                     S.READY, False, False, False, id="starting-probe-ok-ready"),
        pytest.param(replica(S.READY, ever_ready=True), RUNNING, BAD,
                     S.NOT_READY, False, False, False, id="ready-probe-fails-not-ready"),
        pytest.param(replica(S.NOT_READY, failing_for=100, ever_ready=True), RUNNING, OK,
                     S.READY, False, False, False, id="not-ready-recovers"),
        pytest.param(replica(S.NOT_READY, failing_for=170, ever_ready=True), RUNNING, BAD,
                     S.NOT_READY, False, False, False, id="not-ready-within-grace-waits"),
        pytest.param(replica(S.NOT_READY, failing_for=181, ever_ready=True), RUNNING, BAD,
                     S.FAILED_PROBING, True, False, False, id="not-ready-past-grace-fails"),
        pytest.param(replica(S.READY), RUNNING, None,
                     S.READY, False, False, False, id="no-probe-this-pass-no-change"),
        pytest.param(replica(S.READY), instance(InstanceState.EXITED, "run exited with code 1"), None,
                     S.FAILED, True, False, False, id="workload-exit-fails"),
        pytest.param(replica(S.READY), instance(InstanceState.PREEMPTED, "spot interruption"), None,
                     S.PREEMPTED, True, False, False, id="preempted"),
        pytest.param(replica(S.READY), None, None,
                     S.FAILED, True, False, False, id="instance-vanished-fails"),
        pytest.param(replica(S.PROVISIONING, instance_id=None, age=5), None, None,
                     S.PROVISIONING, False, False, True, id="unconfirmed-launch-relaunches"),
        pytest.param(replica(S.PROVISIONING, instance_id=None, age=601), None, None,
                     S.FAILED_PROVISION, True, False, False, id="unconfirmed-launch-times-out"),
        pytest.param(replica(S.PROVISIONING, age=601), instance(InstanceState.PENDING), None,
                     S.FAILED_PROVISION, True, False, False, id="pending-too-long-fails"),
        pytest.param(replica(S.SHUTTING_DOWN), RUNNING, None,
                     S.SHUTTING_DOWN, True, False, False, id="shutting-down-keeps-terminating"),
        pytest.param(replica(S.SHUTTING_DOWN), None, None,
                     S.SHUTTING_DOWN, False, True, False, id="shutting-down-gone-removed"),
        pytest.param(replica(S.FAILED), RUNNING, None,
                     S.FAILED, True, False, False, id="terminal-with-live-instance-cleaned-up"),
        pytest.param(replica(S.FAILED), None, None,
                     S.FAILED, False, False, False, id="terminal-without-instance-kept-as-record"),
        pytest.param(replica(S.PREEMPTED), instance(InstanceState.PREEMPTED, "spot interruption"), None,
                     S.PREEMPTED, False, False, False, id="preempted-instance-is-not-terminated-again"),
        pytest.param(replica(S.SHUTTING_DOWN), instance(InstanceState.PREEMPTED), None,
                     S.SHUTTING_DOWN, False, True, False, id="shutting-down-preempted-counts-as-gone"),
        # Eventual consistency: RunInstances returned the instance, DescribeInstances does not list it yet.
        pytest.param(replica(S.PROVISIONING, seen=False, age=10), None, None,
                     S.PROVISIONING, False, False, False, id="launched-not-listed-yet-waits"),
        pytest.param(replica(S.PROVISIONING, seen=False, age=121), None, None,
                     S.FAILED, True, False, False, id="launched-not-listed-past-the-grace-fails"),
        pytest.param(replica(S.STARTING, age=10), None, None,
                     S.FAILED, True, False, False, id="seen-running-then-missing-is-gone-at-once"),
        pytest.param(replica(S.SHUTTING_DOWN, seen=False, age=10), None, None,
                     S.SHUTTING_DOWN, True, False, False, id="shut-down-before-listed-is-asked-again-by-id"),
        pytest.param(replica(S.SHUTTING_DOWN, seen=False, age=121), None, None,
                     S.SHUTTING_DOWN, False, True, False, id="shut-down-not-listed-past-the-grace-is-gone"),
        pytest.param(replica(S.SHUTTING_DOWN, instance_id=None, seen=False, age=10), None, None,
                     S.SHUTTING_DOWN, False, False, False, id="unconfirmed-launch-shut-down-is-not-forgotten"),
        pytest.param(replica(S.SHUTTING_DOWN, instance_id=None, seen=False, age=10, since=0), RUNNING, None,
                     S.SHUTTING_DOWN, False, False, False, id="unconfirmed-launch-shut-down-adopted-drains"),
        pytest.param(replica(S.SHUTTING_DOWN, instance_id=None, seen=False, age=20, since=20), RUNNING, None,
                     S.SHUTTING_DOWN, True, False, False, id="unconfirmed-launch-shut-down-adopted-terminated"),
    ],
)
def test_plan_replica(row: ReplicaRecord, inst: Instance | None, probe: ProbeResult | None, status: S,
                      terminate: bool, remove: bool, relaunch: bool) -> None:
    step = plan_replica(row, inst, probe, PROBE, NOW, SETTINGS)
    assert (step.record.status, step.terminate, step.remove, step.relaunch) == (
        status, terminate, remove, relaunch)


def test_a_shut_down_replica_adopts_the_instance_of_its_unconfirmed_launch_to_terminate_it() -> None:
    row = replica(S.SHUTTING_DOWN, instance_id=None, seen=False, age=20, since=20)
    step = plan_replica(row, dataclasses.replace(RUNNING, instance_id="i-late"), None, PROBE, NOW, SETTINGS)
    assert (step.record.instance_id, step.terminate) == ("i-late", True)


def test_adopts_instance_launched_before_a_crash() -> None:
    row = replica(S.PROVISIONING, instance_id=None)
    found = dataclasses.replace(RUNNING, instance_id="i-adopted", zone="z1")
    step = plan_replica(row, found, None, PROBE, NOW, SETTINGS)
    assert step.record.instance_id == "i-adopted"
    assert step.record.zone == "z1"
    assert step.record.status is S.STARTING
    assert not step.relaunch


def test_failures_record_the_reason() -> None:
    step = plan_replica(replica(S.READY), instance(InstanceState.EXITED, "run exited with code 3"), None,
                        PROBE, NOW, SETTINGS)
    assert step.record.status_reason == "the workload exited (run exited with code 3)"
    assert step.event == "FAILED: the workload exited (run exited with code 3)"
    assert step.record.status_since == NOW


def test_initial_delay_message_names_setting_and_last_probe() -> None:
    step = plan_replica(replica(S.STARTING, since=61), RUNNING, BAD, PROBE, NOW, SETTINGS)
    assert step.record.status_reason == "not ready within initial_delay_seconds=60 (last probe: HTTP 503)"


def test_first_ready_time_is_kept_across_recoveries() -> None:
    row = replica(S.NOT_READY, failing_for=10, ever_ready=True)
    step = plan_replica(row, RUNNING, OK, PROBE, NOW, SETTINGS)
    assert step.record.first_ready_at == row.first_ready_at
    assert step.record.probe_failing_since is None


REFUSED = "cannot connect: Connection refused"


@pytest.mark.parametrize(("phase", "detail", "reason"), [
    (Phase.SETUP, REFUSED, "running setup"),
    (Phase.SETUP, "HTTP 503", "running setup"),
    (Phase.RUN, REFUSED, "running, waiting for the readiness probe on :8080; cannot connect: Connection refused "
     "(the workload must listen on $PORT, 8080)"),
    (Phase.RUN, "HTTP 503", "running, waiting for the readiness probe on :8080; HTTP 503"),
    (None, REFUSED, REFUSED),  # a cloud VM: the provider cannot tell setup from run
])
def test_starting_reason_by_phase(phase: Phase | None, detail: str, reason: str) -> None:
    assert compute_starting_reason(phase, "http://127.0.0.1:8080", detail) == reason


@pytest.mark.parametrize(("stored", "shown"), [
    ("running setup", "running setup (12s)"),
    ("running, waiting for the readiness probe on :8080; HTTP 503",
     "running, waiting for the readiness probe on :8080 (12s of 1200s); HTTP 503"),
    (REFUSED, REFUSED),
    (None, None),
])
def test_describe_starting_adds_the_seconds_when_shown(stored: str | None, shown: str | None) -> None:
    assert describe_starting(stored, 12.4, 1200) == shown


def test_a_replica_in_setup_says_so_and_its_next_pass_writes_nothing() -> None:
    in_setup = dataclasses.replace(RUNNING, phase=Phase.SETUP, url="http://127.0.0.1:8080")
    step = plan_replica(replica(S.STARTING, since=5), in_setup, ProbeResult(False, REFUSED), PROBE, NOW, SETTINGS)
    assert (step.record.status, step.record.status_reason) == (S.STARTING, "running setup")
    again = plan_replica(step.record, in_setup, ProbeResult(False, REFUSED), PROBE, NOW + 2, SETTINGS)
    assert again.record is step.record  # unchanged: no write while setup runs
    running = dataclasses.replace(in_setup, phase=Phase.RUN)
    step = plan_replica(step.record, running, ProbeResult(False, REFUSED), PROBE, NOW + 4, SETTINGS)
    reason = step.record.status_reason or ""
    assert reason.startswith("running, waiting for the readiness probe on :8080; cannot connect")
    assert "must listen on $PORT" in reason
