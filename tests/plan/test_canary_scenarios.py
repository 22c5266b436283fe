"""Canary steps as data files (canary_cases/*.yaml): settings, the stored state and what one pass knows ->
the decision (action, new replicas wanted, the new version's share, the event, the state to store).

Only the keys a file names under ``expected`` (and ``expected.state``) are compared."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from skyserve_lite.plan.canary import (
    CanaryDecision,
    CanaryInputs,
    CanaryPhase,
    CanarySettings,
    CanaryState,
    Command,
    VersionCounts,
    WatchInputs,
    plan_canary_step,
    plan_watch_step,
)

CASES = sorted((Path(__file__).parent / "canary_cases").glob("*.yaml"))


def _counts(data: dict[str, int] | None) -> VersionCounts:
    return VersionCounts(**(data or {}))


def _state_json(state: CanaryState) -> dict[str, Any]:
    values = dataclasses.asdict(state)
    values["phase"] = state.phase.value
    return values


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_canary_scenario(case_file: Path) -> None:
    case = yaml.safe_load(case_file.read_text())
    settings = CanarySettings.from_json(case["settings"])
    raw_state = dict(case["state"])
    phase = CanaryPhase(raw_state.pop("phase", "stepping"))
    state = CanaryState(settings=settings, phase=phase, **raw_state)
    raw = dict(case["inputs"])
    new_counts, old_counts = _counts(raw.pop("new_counts", None)), _counts(raw.pop("old_counts", None))
    decision: CanaryDecision
    if case.get("watch"):  # a rolling or blue-green update with --auto-rollback
        decision = plan_watch_step(state, WatchInputs(new_counts=new_counts, old_counts=old_counts, **raw),
                                   float(case["now"]))
    else:
        command = raw.pop("command", None)
        inputs = CanaryInputs(new_counts=new_counts, old_counts=old_counts,
                              command=Command(command) if command else None, **raw)
        decision = plan_canary_step(state, inputs, float(case["now"]))
    result: dict[str, Any] = {"action": decision.action.value, "new_replicas": decision.new_replicas,
                              "percent": decision.percent, "message": decision.message}
    stored = _state_json(decision.state)
    expected = dict(case["expected"])
    expected_state = expected.pop("state", {})
    assert {key: result[key] for key in expected} == expected, case["description"]
    assert {key: stored[key] for key in expected_state} == expected_state, case["description"]


def test_there_are_scenarios() -> None:
    assert len(CASES) >= 15


def test_a_decision_on_a_finished_rollout_changes_nothing() -> None:
    done = CanaryState(version=4, phase=CanaryPhase.ROLLED_BACK, verdict="version 4 rolled back: x")
    decision = plan_canary_step(done, CanaryInputs(target=4, new_ready=1, readiness_failures=3), 10.0)
    assert (decision.state, decision.new_replicas, decision.percent, decision.message) == (done, 0, 0, None)
