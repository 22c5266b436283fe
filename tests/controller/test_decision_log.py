"""The controller's log says what `serve status` says: one line per event a pass stores (each launch, reuse,
drain, termination), a failure at WARNING with its reason, each naming the service and the replica."""

from __future__ import annotations

import logging

import pytest

from skyserve_lite.providers.base import InstanceState

from .conftest import TASK, Harness

LOGGER = "skyserve_lite.controller.executor"
INFO, WARNING = logging.INFO, logging.WARNING


def tick_logged(harness: Harness, caplog: pytest.LogCaptureFixture, seconds: float = 1.0) -> list[tuple[int, str]]:
    """One pass; the replica lines it logged (level, message)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        harness.tick(seconds)
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER and " replica " in r.getMessage()]


def test_a_launch_and_a_failure_each_log_one_line(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    harness.create(replicas=1)
    assert tick_logged(harness, caplog) == [(INFO, "service svc replica 1: launching version 1 on local")]
    assert tick_logged(harness, caplog) == [(INFO, "service svc replica 1: ready")]
    harness.provider.set_state(harness.provider.instance_for("svc", 1).instance_id, InstanceState.EXITED,
                               "run exited with code 3")
    assert tick_logged(harness, caplog) == [
        (WARNING, "service svc replica 1: FAILED: the workload exited (run exited with code 3)"),
        (INFO, "service svc replica 2: launching version 1 on local"),
    ]


@pytest.mark.parametrize(
    ("permanent", "expected"),
    [
        pytest.param(True, (WARNING, "service svc replica 1: FAILED_PROVISION: no capacity"), id="permanent"),
        pytest.param(False, (WARNING, "service svc replica 1: launch failed: no capacity"), id="transient"),
    ],
)
def test_a_launch_error_is_a_warning_with_its_reason(harness: Harness, caplog: pytest.LogCaptureFixture,
                                                     permanent: bool, expected: tuple[int, str]) -> None:
    harness.create(replicas=1)
    harness.provider.fail_next_launch("no capacity", permanent=permanent)
    assert tick_logged(harness, caplog) == [(INFO, "service svc replica 1: launching version 1 on local"), expected]


def test_a_replica_that_fails_its_probe_and_a_reuse_are_said(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    from skyserve_lite.controller.replica_rules import ProbeResult

    harness.create(replicas=1)
    harness.tick()
    harness.tick()
    assert harness.statuses() == {1: "READY"}
    harness.prober.set({("svc", 1): ProbeResult(ok=False, detail="HTTP 503")})
    assert tick_logged(harness, caplog) == [(WARNING, "service svc replica 1: probe failed: HTTP 503")]
    harness.prober.set({("svc", 1): ProbeResult(ok=True, detail="HTTP 200")})
    harness.tick()
    # Only the service section changes: the same replica serves version 2.
    harness.update(TASK.format(replicas=1).replace("initial_delay_seconds: 60", "initial_delay_seconds: 90"))
    assert tick_logged(harness, caplog) == [
        (INFO, "service svc replica 1: reused for version 2 (same replica config)")]


def test_a_drain_says_why(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    harness.create(replicas=2)
    harness.tick()
    harness.tick()
    harness.update(TASK.format(replicas=1))
    lines = tick_logged(harness, caplog)
    assert [line for line in lines if "draining" in line[1]] == [
        (INFO, "service svc replica 2: draining: scaling down to 1 replica")]


def test_every_stored_event_is_a_log_line(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    harness.create(replicas=2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            harness.tick()
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    stored = [f"service {e.service}" + (f" replica {e.replica_id}" if e.replica_id is not None else "")
              + f": {e.message}" for e in sorted(harness.store.list_events("svc"), key=lambda e: e.time)]
    assert sorted(logged) == sorted(stored) and len(logged) >= 5
