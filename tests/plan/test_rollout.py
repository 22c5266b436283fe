"""One rollout step per pass, as tables: which outdated replicas go and which versions serve."""

from __future__ import annotations

import pytest

from skyserve_lite.plan.rollout import RolloutStep, UpdateMode, plan_rollout_step
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus

R, S, N = ReplicaStatus.READY, ReplicaStatus.STARTING, ReplicaStatus.NOT_READY


def rows(*specs: tuple[int, int, ReplicaStatus]) -> list[ReplicaRecord]:
    return [ReplicaRecord(service="svc", replica_id=i, version=v, status=s, cloud="local", launched_at=0,
                          status_since=0, launch_token="t") for i, v, s in specs]


@pytest.mark.parametrize(
    ("current", "outdated", "target", "expected"),
    [
        pytest.param([(4, 2, S), (5, 2, S), (6, 2, S)], [(1, 1, R), (2, 1, R), (3, 1, R)], 3,
                     RolloutStep((), (1,)), id="nothing-new-ready-old-keep-serving"),
        pytest.param([(4, 2, R), (5, 2, S), (6, 2, S)], [(1, 1, R), (2, 1, R), (3, 1, R)], 3,
                     RolloutStep((3,), (1, 2)), id="one-new-ready-one-old-goes-newest-first"),
        pytest.param([(4, 2, R), (5, 2, R), (6, 2, R)], [(1, 1, R), (2, 1, R)], 3,
                     RolloutStep((2, 1), (2,)), id="all-new-ready-all-old-go"),
        pytest.param([(4, 2, S)], [(1, 1, N), (2, 1, R)], 2,
                     RolloutStep((1,), (1,)), id="not-ready-old-goes-at-once"),
        pytest.param([(5, 3, R)], [(1, 1, R), (3, 2, R)], 2,
                     RolloutStep((1,), (2, 3)), id="older-version-goes-first"),
        pytest.param([(1, 2, R), (2, 2, R)], [], 2, RolloutStep((), (2,)), id="no-outdated"),
        pytest.param([(1, 2, S)], [], 1, RolloutStep((), (2,)), id="nothing-ready-current-version-active"),
    ],
)
def test_rolling(current: list[tuple[int, int, ReplicaStatus]], outdated: list[tuple[int, int, ReplicaStatus]],
                 target: int, expected: RolloutStep) -> None:
    current_version = max(v for _, v, _ in current)
    step = plan_rollout_step(UpdateMode.ROLLING, current_version, rows(*current), rows(*outdated), target,
                             min_replicas=target)
    assert step == expected


@pytest.mark.parametrize(
    ("current", "outdated", "min_replicas", "expected"),
    [
        pytest.param([(3, 2, S), (4, 2, S)], [(1, 1, R), (2, 1, R)], 2, RolloutStep((), (1,)),
                     id="old-serves-while-new-starts"),
        pytest.param([(3, 2, R), (4, 2, S)], [(1, 1, R), (2, 1, R)], 2, RolloutStep((), (1,)),
                     id="old-serves-until-min-ready"),
        pytest.param([(3, 2, R), (4, 2, R)], [(1, 1, R), (2, 1, N)], 2, RolloutStep((1, 2), (2,)),
                     id="switch-all-at-once"),
        pytest.param([(3, 2, R)], [(1, 1, N)], 2, RolloutStep((), (2,)),
                     id="no-old-ready-new-serves-what-it-can"),
        pytest.param([(3, 2, R)], [], 1, RolloutStep((), (2,)), id="no-outdated"),
    ],
)
def test_blue_green(current: list[tuple[int, int, ReplicaStatus]], outdated: list[tuple[int, int, ReplicaStatus]],
                    min_replicas: int, expected: RolloutStep) -> None:
    step = plan_rollout_step(UpdateMode.BLUE_GREEN, 2, rows(*current), rows(*outdated), target=min_replicas,
                             min_replicas=min_replicas)
    assert step == expected


@pytest.mark.parametrize(("stored", "mode"), [("initial", UpdateMode.ROLLING), ("rolling", UpdateMode.ROLLING),
                                              ("blue_green", UpdateMode.BLUE_GREEN)])
def test_mode_of_a_stored_version(stored: str, mode: UpdateMode) -> None:
    assert UpdateMode.of_version(stored) is mode
