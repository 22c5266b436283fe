"""Autoscaling carried out by reconcile passes: metrics from the store, state that survives a restart,
bounds re-clipped by an update, spot/on-demand fallback, wake from zero."""

from __future__ import annotations

import dataclasses

from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.providers.base import InstanceState
from skyserve_lite.state.models import LbReport, ReplicaStatus, ServiceStatus

from .conftest import Harness

AUTO = """\
service:
  readiness_probe: /health
  replica_policy:
    min_replicas: {min}
    max_replicas: {max}
    target_qps_per_replica: 1
    upscale_delay_seconds: {up}
    downscale_delay_seconds: {down}
run: python -m http.server $PORT
"""

SPOT = """\
resources:
  use_spot: true
service:
  readiness_probe: /health
  replica_policy:
    min_replicas: 4
    max_replicas: 4
    target_qps_per_replica: 1
    base_ondemand_fallback_replicas: 1
    dynamic_ondemand_fallback: true
run: python -m http.server $PORT
"""


def with_period(h: Harness, seconds: float) -> None:
    h.settings = dataclasses.replace(h.settings, autoscaler_period_seconds=seconds)
    h.reconciler = Reconciler(h.store, {"local": h.provider}, h.prober, h.lbs, h.clock, h.settings)


def load(h: Harness, qps: int, seconds: int = 60) -> None:
    """The load balancer saw ``qps`` requests per second for the last ``seconds``."""
    now = int(h.clock.now())
    h.store.record_request_counts("svc", {second: qps for second in range(now - seconds, now)})


def live(h: Harness) -> int:
    return sum(1 for r in h.replicas() if r.status.is_live)


def test_request_rate_scales_up_after_the_delay_and_back_down(harness: Harness) -> None:
    with_period(harness, 10)
    harness.create(text=AUTO.format(min=1, max=4, up=20, down=30))
    harness.tick()
    harness.tick()
    assert live(harness) == 1
    load(harness, 3)
    harness.tick(10)  # first upscale decision: held (threshold int(20 / 10) = 2)
    view = harness.store.get_autoscaler_state("svc")
    assert view is not None and view[1].held_back == "upscale delay 1/2" and view[1].raw_target == 3
    assert live(harness) == 1
    load(harness, 3, seconds=10)  # the 10 s since the last load() call
    harness.tick(10)
    assert harness.store.get_autoscaler_state("svc")[0].target == 3  # type: ignore[index]
    assert live(harness) == 3
    # Load gone: three decisions (int(30 / 10)) later the target is back at min_replicas.
    for _ in range(2):
        harness.tick(61)
        assert live(harness) == 3
    harness.tick(10)
    assert live(harness) == 1


def test_hysteresis_survives_a_controller_restart(harness: Harness) -> None:
    with_period(harness, 10)
    harness.create(text=AUTO.format(min=1, max=4, up=20, down=30))
    harness.tick()
    load(harness, 3)
    harness.tick(10)
    with_period(harness, 10)  # a new Reconciler: only the store carries over
    load(harness, 3, seconds=10)
    harness.tick(10)
    assert live(harness) == 3


def test_update_reclips_the_target_at_once(harness: Harness) -> None:
    with_period(harness, 10)
    harness.create(text=AUTO.format(min=1, max=4, up=0, down=600))
    harness.tick()
    load(harness, 4)
    harness.tick(10)
    harness.tick()
    assert live(harness) == 4
    harness.update(AUTO.format(min=1, max=2, up=0, down=600))
    harness.tick(1)  # no decision is due, yet the new bounds apply
    assert live(harness) == 2
    state = harness.store.get_autoscaler_state("svc")
    assert state is not None and (state[0].version, state[0].target) == (2, 2)


def report_in_flight(h: Harness, count: int, age: float) -> None:
    """An in-flight service with one READY replica, whose load balancer reported ``count`` in flight
    ``age`` seconds ago."""
    with_period(h, 10)
    h.create(text=AUTO.format(min=1, max=5, up=0, down=600).replace("target_qps_per_replica",
                                                                    "target_ongoing_requests_per_replica"))
    h.tick()
    h.tick()
    (replica,) = h.replicas()
    h.store.record_lb_report("svc", LbReport(reported_at=h.clock.now() - age, in_flight=((replica.url or "", count),)))


def test_in_flight_policy_reads_the_load_balancer_report(harness: Harness) -> None:
    report_in_flight(harness, 4, age=0)
    harness.tick(10)
    assert live(harness) == 4
    observed = harness.store.get_autoscaler_state("svc")
    assert observed is not None and observed[1].average_ongoing == 4.0


def test_a_stale_report_is_ignored(harness: Harness) -> None:
    report_in_flight(harness, 40, age=60)
    harness.tick(10)
    assert live(harness) == 1


def test_first_request_wakes_a_service_at_zero(harness: Harness) -> None:
    harness.create(text=AUTO.format(min=0, max=3, up=300, down=1200))
    harness.tick()
    assert live(harness) == 0
    assert harness.service().status is ServiceStatus.NO_REPLICA
    harness.store.record_lb_report("svc", LbReport(reported_at=harness.clock.now(), waiting=1))
    load(harness, 1, seconds=1)
    harness.tick(1)
    assert live(harness) == 1


def spot_counts(h: Harness) -> tuple[int, int]:
    rows = [r for r in h.replicas() if r.status.is_live]
    return sum(1 for r in rows if r.is_spot), sum(1 for r in rows if not r.is_spot)


def test_spot_fallback_launches_on_demand_until_spot_is_ready(harness: Harness) -> None:
    from skyserve_lite.controller.replica_rules import ProbeResult

    harness.create(text=SPOT)
    harness.tick()
    # Target 4 = 1 base on-demand + 3 spot; none of the spot is READY, so 3 on-demand stand-ins too.
    assert spot_counts(harness) == (3, 4)
    spot_ids = [r.replica_id for r in harness.replicas() if r.is_spot]
    assert all(harness.provider.instance_for("svc", i).is_spot for i in spot_ids)
    # The spot replicas are slow to become ready; the on-demand ones serve meanwhile.
    harness.prober.set({("svc", i): ProbeResult(False, "HTTP 503") for i in spot_ids})
    harness.tick()
    assert spot_counts(harness) == (3, 4)
    harness.prober.set({("svc", i): ProbeResult(True, "HTTP 200") for i in spot_ids})
    harness.tick()
    # Spot READY: the stand-ins go, the base on-demand replica stays.
    assert spot_counts(harness) == (3, 1)
    assert harness.service().status is ServiceStatus.READY


def test_preempted_spot_is_replaced_with_a_stand_in_meanwhile(harness: Harness) -> None:
    harness.create(text=SPOT)
    harness.tick()
    harness.tick()
    harness.tick()
    assert spot_counts(harness) == (3, 1)
    victim = next(r for r in harness.replicas() if r.is_spot and r.status.is_live)
    harness.provider.set_state(victim.instance_id or "", InstanceState.PREEMPTED, "spot interruption")
    harness.tick()
    rows = {r.replica_id: r for r in harness.replicas()}
    assert rows[victim.replica_id].status is ReplicaStatus.PREEMPTED
    assert rows[victim.replica_id].status_reason == "spot interruption"
    # One new spot replica, and one on-demand stand-in while it is not READY.
    assert spot_counts(harness) == (3, 2)
