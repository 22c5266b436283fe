"""Scale-down order and the launch circuit breaker, as tables."""

from __future__ import annotations

import pytest

from skyserve_lite.plan.scaling import find_recent_failures, find_scale_down_order, is_launch_blocked
from skyserve_lite.state.models import ReplicaRecord
from skyserve_lite.state.models import ReplicaStatus as S


def r(replica_id: int, version: int, status: S, launched_at: float = 0.0,
      first_ready_at: float | None = None) -> ReplicaRecord:
    return ReplicaRecord(service="svc", replica_id=replica_id, version=version, status=status, cloud="fake",
                         launched_at=launched_at, status_since=launched_at, launch_token="t",
                         first_ready_at=first_ready_at)


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        pytest.param([r(1, 1, S.READY), r(2, 1, S.STARTING), r(3, 2, S.READY), r(4, 1, S.READY)],
                     [2, 4, 1, 3], id="not-ready-first-then-older-version-then-newest"),
        pytest.param([r(1, 1, S.READY), r(2, 1, S.READY)], [2, 1], id="newest-first-among-equals"),
        pytest.param([r(1, 2, S.READY), r(2, 1, S.READY)], [2, 1], id="older-version-first"),
        pytest.param([r(1, 2, S.NOT_READY), r(2, 1, S.READY)], [1, 2], id="not-ready-beats-older-version"),
        pytest.param([r(5, 1, S.PROVISIONING), r(6, 1, S.STARTING)], [6, 5], id="all-not-ready-newest-first"),
    ],
)
def test_scale_down_order(replicas: list[ReplicaRecord], expected: list[int]) -> None:
    assert [x.replica_id for x in find_scale_down_order(replicas)] == expected


@pytest.mark.parametrize(
    ("replicas", "blocked"),
    [
        pytest.param([r(1, 1, S.FAILED), r(2, 1, S.FAILED_INITIAL_DELAY)], False, id="two-failures-keep-going"),
        pytest.param([r(1, 1, S.FAILED), r(2, 1, S.FAILED), r(3, 1, S.FAILED_PROBING)], True,
                     id="three-failures-block"),
        pytest.param([r(1, 1, S.FAILED), r(2, 1, S.FAILED), r(3, 1, S.FAILED), r(4, 1, S.READY, 5, 6)], False,
                     id="a-ready-replica-unblocks"),
        pytest.param([r(1, 1, S.FAILED), r(2, 1, S.FAILED), r(3, 1, S.PREEMPTED)], False,
                     id="preemption-is-not-the-apps-fault"),
        pytest.param([r(1, 0, S.FAILED), r(2, 0, S.FAILED), r(3, 0, S.FAILED)], False,
                     id="failures-of-an-older-version-do-not-count"),
        pytest.param([r(1, 1, S.FAILED, 0, 5), r(2, 1, S.FAILED, 1), r(3, 1, S.FAILED, 2),
                      r(4, 1, S.FAILED, 10), r(5, 1, S.FAILED, 11)], False,
                     id="only-failures-since-the-last-ready-count"),
        pytest.param([r(2, 1, S.FAILED, 6), r(3, 1, S.FAILED, 7), r(4, 1, S.FAILED, 10),
                      r(1, 1, S.FAILED, 0, 5)], True, id="three-failures-after-the-last-ready-block"),
    ],
)
def test_launch_blocked(replicas: list[ReplicaRecord], blocked: bool) -> None:
    assert is_launch_blocked(find_recent_failures(replicas, version=1), failure_limit=3) is blocked
