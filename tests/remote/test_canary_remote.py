"""A canary update over the remote protocol (``RemoteController`` through real pipes to the host's server):
the flags reach the host and are stored with the version, the dry run lists the same steps as on the host,
and `serve rollout` commands arrive, or are refused with the same error, as they are locally."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.errors import StateConflictError
from skyserve_lite.plan.canary import CanarySettings, CanaryState, Command
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.transport import InProcessTransport
from skyserve_lite.spec.parse import load_task_file
from tests.controller.conftest import TASK, Harness

FLAGS = CanarySettings(steps=(5, 25, 60), bake_seconds=45, max_error_rate=0.01, min_requests=30, max_extensions=2)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "host-home")
    h.create("web", replicas=4)
    for _ in range(3):
        h.tick()
    yield h
    h.store.close()


def test_a_canary_update_and_its_commands_cross_the_protocol(harness: Harness, tmp_path: Path) -> None:
    path = tmp_path / "v2.yaml"
    path.write_text(TASK.format(replicas=4).replace("http.server $PORT", "http.server $PORT --bind 127.0.0.1"))
    task = load_task_file(path)
    local = LocalController(harness.home, start_daemon=False)
    remote = RemoteController(InProcessTransport(harness.home))
    plan = remote.plan_update("web", task, UpdateMode.CANARY, canary=FLAGS)
    assert plan == local.plan_update("web", task, UpdateMode.CANARY, canary=FLAGS)
    assert [(s.percent, s.new_replicas) for s in plan.canary] == [(5, 1), (25, 1), (60, 3)]
    assert remote.submit_update("web", task, UpdateMode.CANARY, canary=FLAGS).version == 2
    stored = harness.store.list_canaries("web")["web"]
    assert (stored.state, stored.percent) == (CanaryState(2, FLAGS), 0)
    with pytest.raises(StateConflictError, match="is not paused; nothing to resume"):
        remote.request_rollout("web", Command.RESUME)
    assert harness.store.list_canaries("web")["web"].command is None
    remote.request_rollout("web", Command.PAUSE)
    assert harness.store.list_canaries("web")["web"].command is Command.PAUSE
