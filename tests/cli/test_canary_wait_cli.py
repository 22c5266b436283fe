"""`serve wait` follows a canary through real reconcile passes (one per status read, fake provider and
prober): while it steps it names the step, the split and the rates it waits on; a version whose requests
fail is rolled back and the wait exits 1 with the rollback line; a good one is promoted and the wait ends 0."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from skyserve_lite.api import DEFAULT_EVENTS, ServiceView

from ..controller.conftest import TASK, Harness
from .runner import Cli
from .test_wait_cli import PassingController


class ServedController(PassingController):
    """Each pass also records what the load balancer would have counted in the second before it: 30
    requests to each version serving, ``new_5xx`` of them 500s for version 2."""

    new_5xx = 0

    def get_status(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> list[ServiceView]:
        store, second = self.harness.store, int(self.harness.clock.now())
        view = store.get_lb_view("svc")
        for version in set(() if view is None else view.versions):
            bad = self.new_5xx if version == 2 else 0
            store.record_version_counts("svc", {(version, second, "2xx"): 30 - bad, (version, second, "5xx"): bad})
        return super().get_status(names, events=events)


@pytest.fixture
def controller(harness: Harness) -> ServedController:
    return ServedController(harness)


def update(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "v2.yaml"
    path.write_text(TASK.format(replicas=2).replace("http.server $PORT", "http.server $PORT --bind 127.0.0.1"))
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", str(path), "--mode", "canary", "--steps", "50",
                          "--bake", "5s", "-y")
    assert code == 0, stderr


def test_wait_names_the_step_while_the_canary_bakes(controller: ServedController, tmp_path: Path) -> None:
    cli = Cli(controller)
    update(cli, tmp_path)
    code, _, stderr = cli("serve", "wait", "svc", "--timeout", "1")
    assert code == 1
    said = " ".join(stderr.split())
    assert "svc: version 2 is not rolled out after 1s" in said
    assert "waiting for the canary: version 2: step 1 of 1, " in said


def test_wait_follows_a_failing_canary_to_its_rollback_line(controller: ServedController, tmp_path: Path) -> None:
    cli = Cli(controller)
    update(cli, tmp_path)
    controller.new_5xx = 6  # 20% of version 2's requests
    code, _, stderr = cli("serve", "wait", "svc", "--timeout", "120")
    said = " ".join(stderr.split())
    assert code == 1, said
    assert "svc: version 2 did not roll out: version 2 rolled back: 5xx 20% (" in said
    assert "over 5s at 50%, limit 2%" in said


def test_wait_follows_a_good_canary_to_its_promotion(controller: ServedController, tmp_path: Path) -> None:
    cli = Cli(controller)
    update(cli, tmp_path)
    code, stdout, stderr = cli("serve", "wait", "svc", "--timeout", "120")
    assert code == 0, stdout + stderr
    assert controller.harness.store.list_canaries("svc")["svc"].state.phase.value == "promoted"
    assert {r.version for r in controller.harness.replicas() if r.status.is_live} == {2}
