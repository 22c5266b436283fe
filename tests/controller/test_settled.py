"""A settled service (its last pass decided nothing over the same rows) is not planned whole again, and
anything that could change its plan makes the next pass plan it whole: each case below changes one input
of a settled service and expects the pass to act on it. (Every controller test also checks each settled
plan against the whole pass's: ``conftest.settled_services_plan_what_a_whole_pass_plans``.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.controller.snapshots import REPORT_STALE_SECONDS
from skyserve_lite.providers.base import InstanceState
from skyserve_lite.state.models import AutoscalerObservation, LbReport, ReplicaStatus, ServiceStatus

from .conftest import TASK, Harness


def of(snapshots: list[ServiceSnapshot], name: str) -> list[ServiceSnapshot]:
    return [s for s in snapshots if s.service.name == name]


def settle(harness: Harness, names: tuple[str, ...] = ("svc", "other")) -> None:
    for name in names:
        harness.create(name, replicas=2)
    for _ in range(3):
        harness.tick()
    assert all(harness.statuses(name) == {1: "READY", 2: "READY"} for name in names)


def test_a_settled_service_is_not_planned_whole_again(harness: Harness, carried: list[str]) -> None:
    settle(harness)
    carried.clear()
    for _ in range(5):
        assert harness.tick().is_empty
    assert carried == ["other", "svc"] * 5


def _probe_fails(h: Harness) -> None:
    h.prober.set({("svc", 1): ProbeResult(ok=False, detail="HTTP 503")})


def _instance_exits(h: Harness) -> None:
    (replica,) = [r for r in h.replicas() if r.replica_id == 1]
    assert replica.instance_id is not None
    h.provider.set_state(replica.instance_id, InstanceState.EXITED, "exit code 1")


def _load_balancer_dies(h: Harness) -> None:
    pid = h.service().lb_pid
    assert pid is not None
    h.lbs.crash(pid)


def _scaled_by_update(h: Harness) -> None:
    h.update(TASK.format(replicas=3))


def _operator_terminates_a_replica(h: Harness) -> None:
    h.store.request_replica_termination("svc", 2, h.clock.now())


def _service_row_changed_elsewhere(h: Harness) -> None:
    h.store.set_service_status("svc", ServiceStatus.REPLICA_INIT, None)  # another process wrote the row


def _autoscaler_row_changed_elsewhere(h: Harness) -> None:
    h.store.put_autoscaler_states([("svc", AutoscalerState(version=1, target=1),
                                    AutoscalerObservation(policy="fixed", raw_target=1))])


def _inventory_unavailable(h: Harness) -> None:
    h.provider.fail_inventory(times=1)


CHANGES: dict[str, tuple[Callable[[Harness], None], Callable[[Harness], bool]]] = {
    "probe fails": (_probe_fails, lambda h: h.statuses()[1] == "NOT_READY"),
    "instance exits": (_instance_exits, lambda h: h.statuses()[1] == "FAILED"),
    "load balancer dies": (_load_balancer_dies, lambda h: [n for n, _ in h.lbs.started].count("svc") == 2),
    "update scales up": (_scaled_by_update, lambda h: len(h.replicas()) == 3),
    "operator terminates": (_operator_terminates_a_replica, lambda h: h.statuses()[2] == "SHUTTING_DOWN"),
    # Written back by the pass: the service status follows from the replicas, the target from the policy.
    "service row": (_service_row_changed_elsewhere, lambda h: h.service().status is ServiceStatus.READY),
    "autoscaler row": (_autoscaler_row_changed_elsewhere, lambda h: h.store.get_autoscaler_state("svc") is not None
                       and h.store.get_autoscaler_state("svc")[0].target == 2),  # type: ignore[index]
    # The cloud of both services: nothing is decided blind for either, and neither is settled.
    "inventory unavailable": (_inventory_unavailable, lambda h: {r.status for r in h.replicas()} == {
        ReplicaStatus.READY}),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_change_to_a_settled_service_is_planned_whole(harness: Harness, carried: list[str], change: str) -> None:
    settle(harness)
    harness.tick()
    make, done = CHANGES[change]
    carried.clear()
    make(harness)
    harness.tick()
    # The other service stays settled; this one is planned whole.
    assert carried == ([] if change == "inventory unavailable" else ["other"])
    assert done(harness)


AUTOSCALED = """\
service:
  readiness_probe: /health
  replica_policy:
    min_replicas: 1
    max_replicas: 3
    target_qps_per_replica: 10
run: python -m http.server $PORT
"""


def test_an_autoscaled_service_settles_between_decisions_and_follows_a_new_target(
        harness: Harness, carried: list[str]) -> None:
    harness.create("svc", text=AUTOSCALED)
    for _ in range(3):
        harness.tick()
    assert harness.statuses() == {1: "READY"}
    carried.clear()
    harness.tick()
    assert carried == ["svc"]  # no request, no decision due: nothing to decide
    # A target written meanwhile (the decision is not due again for a period): followed at once.
    _state, observed = harness.store.get_autoscaler_state("svc") or pytest.fail("no autoscaler state")
    written = AutoscalerState(version=1, target=2, last_decision_at=harness.clock.now())
    harness.store.put_autoscaler_states([("svc", written, observed)])
    carried.clear()
    harness.tick()
    assert carried == [] and len(harness.replicas()) == 2


def _requests_counted(h: Harness) -> None:
    h.store.record_request_counts("svc", {int(h.clock.now()): 3})


def _load_balancer_reports(h: Harness) -> None:
    h.store.record_lb_report("svc", LbReport(reported_at=h.clock.now(), in_flight=(("http://127.0.0.1:1", 2),)))


# What a snapshot holds besides the replicas' observations (probes and instances are not in it).
SNAPSHOT_CHANGES: dict[str, Callable[[Harness], None]] = {
    "load balancer dies": _load_balancer_dies,
    "update": _scaled_by_update,
    "operator terminates": _operator_terminates_a_replica,
    "service row": _service_row_changed_elsewhere,
    "autoscaler row": _autoscaler_row_changed_elsewhere,
    "requests counted": _requests_counted,
    "load balancer reports": _load_balancer_reports,
}


def test_a_pass_over_unchanged_rows_is_handed_the_last_snapshot(harness: Harness, read: list[ServiceSnapshot]) -> None:
    settle(harness)
    harness.tick()
    read.clear()
    for _ in range(3):
        harness.tick()
    for name in ("svc", "other"):
        first, *rest = of(read, name)
        assert len(rest) == 2 and all(s is first for s in rest), name


@pytest.mark.parametrize("change", SNAPSHOT_CHANGES, ids=list(SNAPSHOT_CHANGES))
def test_a_change_to_what_a_snapshot_holds_reads_a_new_one(harness: Harness, read: list[ServiceSnapshot],
                                                            change: str) -> None:
    settle(harness)
    harness.tick()
    read.clear()
    harness.tick()
    SNAPSHOT_CHANGES[change](harness)
    harness.tick()
    before, after = of(read, "svc")
    assert after is not before and after != before
    assert of(read, "other")[0] is of(read, "other")[1]  # the other service's rows did not change


def test_a_load_balancer_report_going_stale_reads_a_new_snapshot(harness: Harness,
                                                                 read: list[ServiceSnapshot]) -> None:
    settle(harness)
    _load_balancer_reports(harness)
    harness.tick()
    read.clear()
    harness.tick()
    harness.tick(seconds=REPORT_STALE_SECONDS)
    fresh, stale = of(read, "svc")
    assert fresh.load is not None and fresh.load.ongoing_requests_by_url == (("http://127.0.0.1:1", 2),)
    assert stale.load is not None and stale.load.ongoing_requests_by_url == ()


def test_a_replica_written_for_one_service_leaves_the_others_settled(harness: Harness, carried: list[str],
                                                                    read: list[ServiceSnapshot]) -> None:
    settle(harness)
    harness.tick()
    _probe_fails(harness)
    harness.tick()  # svc's replica 1 is written NOT_READY
    assert harness.statuses()[1] == "NOT_READY"
    carried.clear()
    harness.tick()
    # The pass after the write reads other's rows as the very same values: still settled, its snapshot kept.
    assert "other" in carried
    before, after = of(read, "other")[-2:]
    assert after is before
