"""Update scenarios as data files: old task(s), new task, replicas -> the expected plan (cases/*.yaml).

The plan is the forecast: the controller's pass planner run forward until the rollout settles.
``tests/controller/test_forecast_matches_controller.py`` runs the same files through the controller itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fleets import CASES, load_case


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_update_scenario(case_file: Path) -> None:
    fleet, case = load_case(case_file)
    result = fleet.forecast().to_json()
    expected = case["expected"]
    assert {key: result[key] for key in expected} == expected, case["description"]
    assert result["from_version"] == fleet.from_version and result["to_version"] == fleet.from_version + 1
    assert result["converged"] is True


def test_there_are_scenarios() -> None:
    assert len(CASES) >= 10
