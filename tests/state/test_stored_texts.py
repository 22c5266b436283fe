"""A version an earlier sky-lite stored keeps running after an upgrade: the rules that came with SkyServe's
stricter readings refuse new submissions only, and a stored text gets the reading it had when stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.api import LocalController, rollback_task
from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import SpecError
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.spec.inputs import BoundInputs
from skyserve_lite.spec.model import LoadBalancingPolicy, SubmittedTask
from skyserve_lite.spec.parse import parse_task, read_task
from skyserve_lite.state.store import Store

# Accepted by the sky-lite before: each of these is refused for a new submission today.
EARLIER = """\
resources:
  accelerators: {A100: 1, L4: 1}
service:
  ports: "8080"
  readiness_probe:
    initial_delay_seconds: 30
    headers: {X-Count: 5}
  replica_policy:
    max_replicas: 3
    target_qps_per_replica: {A100: 5, L4: 2}
run: serve --port 8080
"""
REFUSED_TODAY = ["service.ports", "service.readiness_probe.path",
                 "service.readiness_probe.headers.X-Count", "service.replica_policy.min_replicas",
                 "service.load_balancing_policy"]


def store_as_earlier(home: Path, text: str, inputs: BoundInputs | None) -> Store:
    """A store holding ``text`` as version 1, as an earlier sky-lite wrote it (without today's checks)."""
    store = Store.open(home)
    task = SubmittedTask(text=text, source="/t/web.yaml", spec=parse_task(text, "/t/web.yaml", strict=False))
    store.create_service("web", task, 30001, 0.0, inputs=inputs)
    return store


def test_the_text_is_refused_for_a_new_submission_on_the_first_rule_it_breaks() -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(EARLIER, "web.yaml")
    assert caught.value.path in REFUSED_TODAY


def test_a_stored_text_reads_as_it_did(tmp_path: Path) -> None:
    store = store_as_earlier(tmp_path / "home", EARLIER, BoundInputs(infra="aws"))
    spec = store.get_version("web", 1).spec
    probe, policy = spec.service.readiness_probe, spec.service.replica_policy
    assert (spec.service.port, probe.path, probe.headers) == (8080, "/", (("X-Count", "5"),))
    assert (policy.min_replicas, policy.max_replicas, policy.qps_per_accelerator) == (1, 3, (("A100", 5.0),
                                                                                           ("L4", 2.0)))
    assert spec.service.load_balancing_policy is LoadBalancingPolicy.LEAST_LOAD
    store.close()


def test_the_home_still_answers_status_and_a_rollback_to_the_stored_text_is_accepted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    earlier = EARLIER.replace("    target_qps_per_replica: {A100: 5, L4: 2}\n", "    target_qps_per_replica: 2\n")
    store_as_earlier(home, earlier.replace("accelerators: {A100: 1, L4: 1}", "infra: local"), None).close()
    controller = LocalController(home, FakeClock(), start_daemon=False)
    [view] = controller.get_status()
    assert (view.service.name, view.policy) == ("web", "Autoscaling 1-3 replicas (2 qps/replica)")
    today = "service:\n  replicas: 2\nrun: serve --port $PORT\n"
    controller.submit_update("web", read_task(today, "/t/web.yaml"), UpdateMode.ROLLING)
    task, target = rollback_task(controller.get_rollout_state("web"), None)
    assert target == 1
    stored = controller.submit_update("web", task, UpdateMode.ROLLING, note="rollback to version 1")
    assert stored.version == 3 and stored.spec.service.replica_policy.max_replicas == 3


@pytest.mark.parametrize(("inputs", "as_root"), [
    pytest.param(BoundInputs(infra="aws"), True, id="stored-before-replicas-ran-as-sky"),
    pytest.param(BoundInputs(infra="aws", runs_as_user=True), False, id="stored-since"),
    pytest.param(None, False, id="local-runs-as-the-caller-either-way"),
])
def test_a_cloud_version_stored_before_replicas_ran_as_sky_keeps_root(tmp_path: Path, inputs: BoundInputs | None,
                                                                      as_root: bool) -> None:
    text = "resources:\n  cpus: 2+\nservice:\n  replicas: 1\nrun: sudo serve\n"
    store = store_as_earlier(tmp_path / "home", text, inputs)
    spec = store.get_version("web", 1).spec
    assert [c.run_as_root for c in spec.resource_candidates] == [as_root]
    store.close()


def test_runs_as_user_round_trips_and_is_absent_from_earlier_inputs() -> None:
    assert BoundInputs.from_json(BoundInputs(runs_as_user=True).to_json()).runs_as_user
    assert not BoundInputs.from_json('{"infra": "aws", "envs": {}, "secrets": {}}').runs_as_user
