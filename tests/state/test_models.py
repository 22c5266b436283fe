"""The classes of replica status every planner asks about, one row per status."""

from __future__ import annotations

import pytest

from skyserve_lite.state.models import REPLICA_STATUS_BY_VALUE, ReplicaStatus

# status: (live, terminal, a failure of the workload itself)
CLASSES = {
    ReplicaStatus.PENDING: (True, False, False),
    ReplicaStatus.PROVISIONING: (True, False, False),
    ReplicaStatus.STARTING: (True, False, False),
    ReplicaStatus.READY: (True, False, False),
    ReplicaStatus.NOT_READY: (True, False, False),
    ReplicaStatus.SHUTTING_DOWN: (False, False, False),
    ReplicaStatus.FAILED: (False, True, True),
    ReplicaStatus.FAILED_INITIAL_DELAY: (False, True, True),
    ReplicaStatus.FAILED_PROBING: (False, True, True),
    ReplicaStatus.FAILED_PROVISION: (False, True, True),
    ReplicaStatus.PREEMPTED: (False, True, False),  # the cloud took a spot instance back
}


def test_every_status_is_classified() -> None:
    assert set(CLASSES) == set(ReplicaStatus)


@pytest.mark.parametrize(("status", "classes"), CLASSES.items(), ids=[s.value for s in CLASSES])
def test_status_classes(status: ReplicaStatus, classes: tuple[bool, bool, bool]) -> None:
    assert (status.is_live, status.is_terminal, status.is_app_failure) == classes


def test_status_by_stored_text() -> None:
    assert {text: status.value for text, status in REPLICA_STATUS_BY_VALUE.items()} == {
        s.value: s.value for s in ReplicaStatus}
    assert REPLICA_STATUS_BY_VALUE["READY"] is ReplicaStatus.READY
