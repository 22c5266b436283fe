"""Failover with real processes: three `controller run` processes on one PostgreSQL database, three services
of the local provider; the owner of one service is killed with SIGKILL between a launch's intent and its
outcome, then (the controller started again) mid rolling update. Each time: its services are taken over, no
replica is launched twice or runs twice, no replica process is left that the store does not claim, every
service reaches its target, and after `serve down` nothing of the fleet runs. The harness
(tests/e2e/failover_harness.py) is the one benchmarks/failover_bench.py runs 20 trials of."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.postgres import PostgresServer

from .failover_harness import Fleet, running_fleet, summarize

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_controller_killed_mid_launch_and_mid_rolling_update_loses_its_service_without_duplicates_or_leaks(
        tmp_path: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The homes' own db_url settings name the database; a variable in this environment would win over them.
    monkeypatch.delenv("SKY_LITE_DB_URL", raising=False)
    database = postgres_server.create_database()
    fleet: Fleet | None = None
    try:
        with running_fleet(tmp_path, postgres_server.url(database)) as fleet:
            rng = random.Random(26)
            results = [fleet.run_trial(1, rng, "launch"), fleet.run_trial(2, rng, "rolling")]
            print("\n".join([*(r.describe() for r in results), *summarize(results)]))
            for result in results:
                assert result.takeover_seconds is not None, result.describe()  # within 5 TTLs + 30 s
                assert result.duplicates == (), result.describe()
                assert result.leaked == (), result.describe()
                assert result.unconverged == (), result.describe()
                assert result.converge_seconds is not None, result.describe()
                assert result.left_after_down == (), result.describe()
        assert fleet.fleet_processes() == []  # closed: no controller, load balancer or replica left
    finally:
        postgres_server.drop_database(database)
