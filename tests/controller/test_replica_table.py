"""What a pass asks of every replica at once (``ReplicaTable``), and that it is asked again only of new rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

from skyserve_lite.controller.replica_table import ReplicaTable, ReplicaTables
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, replace_replica

from .conftest import Harness


def row(service: str, replica_id: int, status: ReplicaStatus, *, cloud: str = "aws", region: str | None = "us-east-1",
        instance_id: str | None = None) -> ReplicaRecord:
    return ReplicaRecord(service=service, replica_id=replica_id, version=1, status=status, cloud=cloud,
                         launched_at=0.0, status_since=0.0, launch_token=f"t-{service}-{replica_id}", region=region,
                         instance_id=instance_id)


ROWS = (
    row("api", 1, ReplicaStatus.READY, instance_id="i-1"),
    row("api", 2, ReplicaStatus.PROVISIONING),  # launch never confirmed: found by its tags
    row("api", 3, ReplicaStatus.SHUTTING_DOWN, instance_id="i-3", region="us-west-2"),
    row("api", 4, ReplicaStatus.FAILED, instance_id="i-4"),
    row("web", 1, ReplicaStatus.STARTING, cloud="local", region=None, instance_id="pid-7"),
)


def test_the_table_answers_every_question_of_the_rows() -> None:
    table = ReplicaTable.of(ROWS)
    assert {name: [r.replica_id for r in rows] for name, rows in table.by_service.items()} == {
        "api": [1, 2, 3, 4], "web": [1]}
    assert table.regions == {"aws": {"us-east-1", "us-west-2"}, "local": {None}}
    assert table.claimed == {"aws": {"i-1", "i-3", "i-4"}, "local": {"pid-7"}}
    assert table.adoptable == {("aws", "api", 2)}
    # Live and departing replicas are looked up by id when a listing leaves them out; a failed one is not.
    assert table.watched == {"aws": {"i-1", "i-3"}, "local": {"pid-7"}}


def test_the_same_rows_give_the_same_table_and_new_rows_a_new_one() -> None:
    tables = ReplicaTables()
    first = tables.table(ROWS)
    assert tables.table(ROWS) is first
    equal_copy = tuple(ROWS)  # the same tuple object: tuples of tuples are not copied
    assert tables.table(equal_copy) is first
    changed = (*ROWS[:4], row("web", 1, ReplicaStatus.READY, cloud="local", region=None, instance_id="pid-8"))
    second = tables.table(changed)
    assert second is not first and second.claimed["local"] == {"pid-8"}
    # The service whose rows are the very same keeps its very tuple; the other gets its new rows.
    assert second.by_service["api"] is first.by_service["api"]
    assert second.by_service["web"] == (changed[4],) and second.by_service["web"] is not first.by_service["web"]
    # Equal rows that are other objects are not the same rows: a new tuple.
    copied = tuple(dataclasses.replace(r) for r in changed)
    assert tables.table(copied).by_service["api"] is not first.by_service["api"]


def test_a_pass_reads_again_only_the_replicas_of_services_whose_counter_moved(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "home")
    harness.create("svc", replicas=3)
    harness.create("other", replicas=2)
    for _ in range(4):
        harness.tick()
    asked: list[list[str]] = []
    read = harness.store.list_replicas_of

    def recording(services: Collection[str]) -> dict[str, tuple[ReplicaRecord, ...]]:
        asked.append(sorted(services))
        return read(services)

    harness.store.list_replicas_of = recording  # type: ignore[method-assign]
    harness.tick(1)  # a steady pass writes no row: nothing is read again
    rows = harness.replicas("svc")
    harness.store.put_replicas([replace_replica(rows[1], status_reason="changed elsewhere")])
    harness.tick(1)
    assert asked == [["svc"]]
    harness.store.close()
