"""The classes of replica status every planner asks about (one row per status), and the fast copy of a
replica row with some fields changed."""

from __future__ import annotations

import dataclasses

import pytest

from skyserve_lite.state.models import (
    REPLICA_STATUS_BY_VALUE,
    ReplicaChanges,
    ReplicaRecord,
    ReplicaStatus,
    replace_replica,
    replica_from_fields,
)

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


def _row() -> ReplicaRecord:
    return ReplicaRecord(service="api", replica_id=3, version=2, status=ReplicaStatus.STARTING, cloud="aws",
                         launched_at=10.0, status_since=11.0, launch_token="t-1", region="us-east-1",
                         instance_id="i-3", url="http://127.0.0.1:9000")


def test_replica_changes_name_every_field_of_the_row_with_its_type() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(ReplicaRecord)}
    # A TypedDict keeps its (postponed) annotations as forward references; the dataclass as text.
    changes = {name: getattr(kind, "__forward_arg__", kind) for name, kind in ReplicaChanges.__annotations__.items()}
    assert changes == fields


def test_replace_replica_gives_what_dataclasses_replace_gives() -> None:
    row = _row()
    changes = {"status": ReplicaStatus.READY, "status_since": 12.0, "first_ready_at": 12.0, "status_reason": None}
    fast, slow = replace_replica(row, **changes), dataclasses.replace(row, **changes)  # type: ignore[arg-type]
    assert fast == slow and hash(fast) == hash(slow) and type(fast) is ReplicaRecord
    assert row.status is ReplicaStatus.STARTING  # the row itself is left as it was
    assert replace_replica(row) == row


def test_replace_replica_refuses_a_field_the_row_has_not() -> None:
    with pytest.raises(TypeError, match="no field 'statuss'"):
        replace_replica(_row(), statuss=ReplicaStatus.READY)  # type: ignore[call-arg]


def test_a_row_from_its_fields_is_the_row_the_dataclass_makes() -> None:
    row = _row()
    made = replica_from_fields(dict(row.__dict__))
    assert made == row and hash(made) == hash(row) and type(made) is ReplicaRecord
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.status = ReplicaStatus.READY  # type: ignore[misc]
    with pytest.raises(TypeError, match="19 fields, not 18"):
        replica_from_fields({k: v for k, v in row.__dict__.items() if k != "zone"})
