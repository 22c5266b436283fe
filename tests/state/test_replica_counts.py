"""``Store.count_replicas_by_status``: the replicas of each (service, version, status) counted by the database,
the same numbers as counting the decoded rows, on both engines."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store

TEXT = "service:\n  replicas: 1\nrun: echo hi\n"

# (service, version, status, how many)
REPLICAS = (
    ("api", 1, ReplicaStatus.READY, 3),
    ("api", 1, ReplicaStatus.FAILED_PROBING, 1),
    ("api", 2, ReplicaStatus.PROVISIONING, 2),
    ("api", 2, ReplicaStatus.READY, 1),
    ("web", 1, ReplicaStatus.SHUTTING_DOWN, 1),
    ("web", 1, ReplicaStatus.PREEMPTED, 2),
    ("web", 3, ReplicaStatus.NOT_READY, 1),
)


def test_replicas_are_counted_by_service_version_and_status(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    try:
        assert store.count_replicas_by_status() == {}
        for port, name in enumerate(("api", "web", "idle"), start=30001):
            store.create_service(name, SubmittedTask(text=TEXT, source="/t.yaml", spec=parse_task(TEXT)), port, 0.0)
        for service, version, status, count in REPLICAS:
            template = ReplicaRecord(service=service, replica_id=0, version=version, status=status, cloud="local",
                                     launched_at=0.0, status_since=0.0, launch_token="t")
            store.add_replicas(service, count, template)
        decoded = Counter((r.service, r.version, r.status) for r in store.list_replicas())
        counted = store.count_replicas_by_status()
        assert counted == decoded
        assert counted == {(service, version, status): count for service, version, status, count in REPLICAS}
        assert all(type(status) is ReplicaStatus for _, _, status in counted)  # typed, as the records are
    finally:
        store.close()
