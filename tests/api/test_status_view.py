"""What `serve status` reads: a STARTING replica's reason with the seconds it has waited, added when shown
(the stored reason stays the same while the replica waits, so waiting writes nothing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import UNFENCED

from ..controller.conftest import Harness


def test_a_starting_replica_shows_how_long_of_its_initial_delay_it_has_waited(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "home")
    harness.create(replicas=2)  # initial_delay_seconds: 60
    harness.tick()
    harness.tick()
    first, second = harness.replicas()
    clock = FakeClock(harness.clock.now())
    harness.store.put_replicas([
        dataclasses.replace(first, status=ReplicaStatus.STARTING, status_since=clock.now() - 12,
                            status_reason="running setup"),
        dataclasses.replace(second, status=ReplicaStatus.STARTING, status_since=clock.now() - 8,
                            status_reason="running, waiting for the readiness probe on :8080; HTTP 503"),
    ])
    (view,) = LocalController(harness.home, clock, start_daemon=False).get_status(["svc"])
    reasons = [r.status_reason for r in view.replicas]
    assert reasons == ["running setup (12s)",
                       "running, waiting for the readiness probe on :8080 (8s of 60s); HTTP 503"]
    stored: list[ReplicaRecord] = harness.replicas()
    assert [r.status_reason for r in stored] == ["running setup",
                                                 "running, waiting for the readiness probe on :8080; HTTP 503"]
    harness.store.close()


def test_a_named_status_reads_the_named_services_rows_only(tmp_path: Path) -> None:
    """Another service's autoscaler row that cannot be decoded does not fail the status of a service named."""
    harness = Harness(tmp_path / "home")
    harness.create("svc", replicas=1)
    harness.create("other", replicas=1)
    harness.tick()
    harness.tick()
    with harness.store._write(UNFENCED) as tx:
        db = tx.db
        db.execute("UPDATE autoscaler_state SET observed_json = '{\"unknown\": 1}' WHERE service = 'other'")
    controller = LocalController(harness.home, FakeClock(harness.clock.now()), start_daemon=False)
    (view,) = controller.get_status(["svc"])
    assert view.service.name == "svc" and view.autoscaler is not None and view.autoscaler[0].target == 1
    harness.store.close()
