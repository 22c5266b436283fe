"""Update scenarios as data files: old task(s), new task, replicas -> the expected plan (cases/*.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.update import plan_update
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus

CASES = sorted((Path(__file__).parent / "cases").glob("*.yaml"))


def replica(row: dict[str, Any]) -> ReplicaRecord:
    return ReplicaRecord(service="svc", replica_id=row["id"], version=row["version"],
                         status=ReplicaStatus(row["status"]), cloud="local", launched_at=float(row["id"]),
                         status_since=float(row["id"]), launch_token="t")


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_update_scenario(case_file: Path) -> None:
    case = yaml.safe_load(case_file.read_text())
    specs = {int(v): parse_task(text) for v, text in case["versions"].items()}
    from_version = case.get("from_version", max(specs))
    plan = plan_update("svc", from_version, from_version + 1, UpdateMode(case.get("mode", "rolling")),
                       parse_task(case["new"]), specs, [replica(r) for r in case["replicas"]])
    result = plan.to_json()
    expected = case["expected"]
    assert {key: result[key] for key in expected} == expected, case["description"]
    assert result["from_version"] == from_version and result["to_version"] == from_version + 1


def test_there_are_scenarios() -> None:
    assert len(CASES) >= 10
