"""A canary update is stored as one transaction: the version and the rollout its flags start (steps, bake,
limit) are written together or not at all, so a crash between two writes can never leave the new version
current with its rollout started from the task's `service.canary` or the defaults instead of the flags."""

from __future__ import annotations

from pathlib import Path

import pytest

import skyserve_lite.state.store as store_module
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings, CanaryStart, CanaryState, Command
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.connection import StoreConnection
from skyserve_lite.state.models import StoredCanary
from skyserve_lite.state.store import Store

TEXT = "service:\n  replicas: 2\nrun: echo hi\n"
TASK = SubmittedTask(text=TEXT, source="svc.yaml", spec=parse_task(TEXT))
# Not the defaults, and not what the task says (it says nothing): what a lost write would replace.
FLAGS = CanarySettings(steps=(5, 25, 60), bake_seconds=45, max_error_rate=0.01, min_requests=30, max_extensions=2)


class DiskGone(OSError):
    pass


def _store(tmp_path: Path) -> Store:
    store = Store.open(tmp_path)
    store.create_service("svc", TASK, 30001, now=1.0)
    return store


@pytest.mark.parametrize(("start", "expected"), [
    (CanaryStart(FLAGS), StoredCanary(CanaryState(2, FLAGS), 0, None)),
    (CanaryStart(FLAGS, watch=True), StoredCanary(CanaryState(2, FLAGS, phase=CanaryPhase.WATCHING), 100, None)),
])
def test_the_version_and_its_rollout_are_stored_together(tmp_path: Path, start: CanaryStart,
                                                          expected: StoredCanary) -> None:
    store = _store(tmp_path)
    store.put_canary("svc", CanaryState(1, CanarySettings()), 0, fenced=False)
    store.request_canary_command("svc", Command.PAUSE)  # a command of the rollout it replaces is forgotten
    version = store.add_version("svc", TASK, "canary" if not start.watch else "rolling", 2.0, canary=start)
    store.close()
    again = Store.open(tmp_path)  # what a controller starting now reads
    assert version.version == again.get_service("svc").current_version == 2
    assert again.list_canaries("svc") == {"svc": expected}


def test_a_failure_after_the_version_write_stores_neither(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path)
    written: list[int] = []

    def fail(db: StoreConnection, service: str, state: CanaryState, percent: int, *, clear_command: bool) -> None:
        row = db.execute("SELECT current_version FROM services WHERE name = ?", (service,)).fetchone()
        written.append(int(row[0]))
        raise DiskGone("no space left on device")

    with monkeypatch.context() as patched, pytest.raises(DiskGone):
        patched.setattr(store_module, "_upsert_canary", fail)
        store.add_version("svc", TASK, "canary", 2.0, canary=CanaryStart(FLAGS))
    assert written == [2]  # the fault came after the version was written, inside the transaction
    store.close()
    again = Store.open(tmp_path)
    assert again.get_service("svc").current_version == 1
    assert [v.version for v in again.list_versions("svc")] == [1]
    assert again.list_canaries() == {}
