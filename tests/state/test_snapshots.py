"""Snapshots in the store: a version keeps its files' manifest, shared versions share it, old versions'
snapshots expire past the setting (never one a replica runs), and what is needed is what GC keeps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store
from tests.plan.fleets import make_files

TEXT = "workdir: ./app\nservice: {replicas: 1}\nrun: python app.py\n"


def submitted(contents: str) -> SubmittedTask:
    spec = dataclasses.replace(parse_task(TEXT), files=make_files({"workdir": {"app.py": contents}}))
    return SubmittedTask(text=TEXT, source="/t/svc.yaml", spec=spec)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path)


def test_a_version_keeps_its_snapshot_and_its_spec_carries_it(store: Store) -> None:
    task = submitted("v1")
    store.create_service("svc", task, 30001, 0.0)
    record = store.get_version("svc", 1)
    assert record.files == task.spec.files
    assert record.spec.files == task.spec.files and record.spec == task.spec
    assert store.find_needed_blobs() == task.spec.files.blob_digests()  # type: ignore[union-attr]


def test_versions_with_equal_files_share_one_snapshot_row(store: Store) -> None:
    store.create_service("svc", submitted("v1"), 30001, 0.0)
    store.add_version("svc", submitted("v1"), "rolling", 1.0)
    assert store._db.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0] == 1


def test_old_snapshots_expire_past_the_setting_but_never_one_a_replica_runs(store: Store) -> None:
    store.create_service("svc", submitted("v1"), 30001, 0.0)
    store.add_replicas("svc", 1, ReplicaRecord(service="svc", replica_id=0, version=1, status=ReplicaStatus.READY,
                                               cloud="local", launched_at=0.0, status_since=0.0, launch_token="t"))
    for number in (2, 3, 4):
        store.add_version("svc", submitted(f"v{number}"), "rolling", float(number), keep_snapshot_versions=2)
    expired = {v.version: v.files_expired for v in store.list_versions("svc")}
    assert expired == {1: False, 2: True, 3: False, 4: False}  # 1 still runs; 3 and 4 are the newest two
    assert store.get_version("svc", 2).files is None
    assert store.gc_pending
    needed = store.find_needed_blobs()
    assert len(needed) == 3  # v1, v3, v4's app.py
    assert store._db.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0] == 3


def test_without_the_setting_every_snapshot_is_kept(store: Store) -> None:
    store.create_service("svc", submitted("v1"), 30001, 0.0)
    for number in range(2, 6):
        store.add_version("svc", submitted(f"v{number}"), "rolling", float(number))
    assert not any(v.files_expired for v in store.list_versions("svc"))
    assert not store.gc_pending


def test_the_reuse_flag_is_stored_per_version(store: Store) -> None:
    store.create_service("svc", submitted("v1"), 30001, 0.0)
    store.add_version("svc", submitted("v1"), "rolling", 1.0, reuse_identical_files=True)
    assert [v.reuse_identical_files for v in store.list_versions("svc")] == [False, True]
