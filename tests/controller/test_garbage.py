"""The controller deletes the blobs no stored version needs: after a service is taken down (the last one
leaves no snapshot data at all), when submissions expired old snapshots, and never while a capture runs."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.files.capture import capture_task_files
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.store import Store

TEXT = "workdir: ./app\nservice: {replicas: 1}\nrun: python app.py\n"


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.project = tmp_path / "project"
        (self.project / "app").mkdir(parents=True)
        self.store = Store.open(self.home)
        self.blobs = blob_store_of(self.home)
        self.clock = FakeClock()
        self.provider = FakeProvider(name="local")
        self.reconciler = Reconciler(self.store, {"local": self.provider}, FakeProber(), FakeLoadBalancerRunner(),
                                     self.clock, ControllerSettings(drain_seconds=0), blobs=self.blobs)

    def task(self, contents: str) -> SubmittedTask:
        (self.project / "app" / "app.py").write_text(contents)
        spec = parse_task(TEXT)
        files = capture_task_files(spec, self.project, str(self.project / "svc.yaml"), self.blobs)
        return SubmittedTask(TEXT, str(self.project / "svc.yaml"), dataclasses.replace(spec, files=files))

    def tick(self) -> None:
        self.clock.advance(1)
        self.reconciler.reconcile_once()


def test_down_of_the_last_service_leaves_no_blob(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.store.create_service("a", world.task("a"), 30001, 0.0)
    world.store.create_service("b", world.task("b"), 30002, 0.0)
    world.tick()
    world.tick()
    assert len(world.blobs.digests()) == 2
    world.store.mark_deleting(["a"])
    for _ in range(4):
        world.tick()
    assert world.store.find_service("a") is None
    assert len(world.blobs.digests()) == 1  # b's file stays
    world.store.mark_deleting(["b"])
    for _ in range(4):
        world.tick()
    assert world.store.list_services() == []
    assert not world.blobs.root.exists()
    world.store.close()


def test_expired_snapshots_are_collected_on_the_next_pass(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.store.create_service("a", world.task("v1"), 30001, 0.0)
    world.tick()  # the first pass collects what a failed submission may have left: nothing here
    for number in (2, 3):
        world.store.add_version("a", world.task(f"v{number}"), "rolling", 0.0, keep_snapshot_versions=1)
    for _ in range(4):  # v1's replica is replaced by v3's, then v1 and v2 expire on the next submission
        world.tick()
    world.store.add_version("a", world.task("v4"), "rolling", 0.0, keep_snapshot_versions=1)
    assert world.store.gc_pending
    for _ in range(4):
        world.tick()
    assert not world.store.gc_pending
    needed = {v.version for v in world.store.list_versions("a") if not v.files_expired}
    assert world.blobs.digests() == world.store.find_needed_blobs()
    assert 4 in needed and 2 not in needed
    world.store.close()


def test_blobs_of_a_submission_that_failed_half_way_go_on_the_first_pass(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.store.create_service("a", world.task("kept"), 30001, 0.0)
    world.blobs.put(io.BytesIO(b"written, then the submission failed"))
    assert len(world.blobs.digests()) == 2
    world.tick()
    assert len(world.blobs.digests()) == 1
    world.store.close()


def test_a_capture_under_way_defers_collection(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.store.create_service("a", world.task("kept"), 30001, 0.0)
    with world.blobs.writing():
        orphan, _size = world.blobs.put(io.BytesIO(b"for a version being stored"))
        world.tick()
        assert orphan in world.blobs.digests() and world.store.gc_pending
    world.tick()
    assert orphan not in world.blobs.digests() and not world.store.gc_pending
    world.store.close()
