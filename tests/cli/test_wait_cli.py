"""`serve update/rollback --wait`, `serve wait` and `serve down --replica-id` through the CLI, against a
controller whose reconcile pass (fake provider and prober) runs once per status read: real rollouts, no
background process, every exit code and message checked."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from skyserve_lite.api import DEFAULT_EVENTS, LocalController, ServiceView
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.waits import describe_termination

from ..controller.conftest import TASK, Harness
from .runner import Cli


class PassingController(LocalController):
    """This machine's state; each status read first runs one reconcile pass of ``harness``."""

    def __init__(self, harness: Harness) -> None:
        super().__init__(harness.home, harness.clock, start_daemon=False)
        self.harness = harness
        self.interrupt_after: int | None = None

    def get_status(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> list[ServiceView]:
        if self.interrupt_after is not None:
            self.interrupt_after -= 1
            if self.interrupt_after < 0:
                raise KeyboardInterrupt  # what Ctrl-C raises in the wait loop
        self.harness.tick()
        return super().get_status(names, events=events)


@pytest.fixture
def cli(harness: Harness) -> Cli:
    return Cli(PassingController(harness))


def task_file(tmp_path: Path, replicas: int = 2, run: str = "python -m http.server $PORT") -> str:
    path = tmp_path / f"task-{replicas}-{abs(hash(run))}.yaml"
    path.write_text(TASK.format(replicas=replicas).replace("python -m http.server $PORT", run))
    return str(path)


def test_update_waits_for_the_rollout_and_ends_with_one_line(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    code, stdout, stderr = cli("serve", "update", "svc", task_file(tmp_path, run="python serve.py"), "-y")
    assert code == 0, stderr
    # It follows the rollout itself: no pointer at `serve wait`, which would say it does not.
    assert "Service svc is rolling out version 2 (rolling).\n" in stdout
    assert "serve wait" not in stdout + stderr
    assert stdout.splitlines()[-1].startswith("svc: version 2 rolled out, 2/2 READY in ")
    statuses = {r.version: r.status.value for r in harness.replicas() if r.status.is_live}
    assert statuses == {2: "READY"}


def test_update_that_only_changes_the_service_section_is_done_at_the_first_pass(
        cli: Cli, harness: Harness, tmp_path: Path) -> None:
    code, stdout, _ = cli("serve", "update", "svc", task_file(tmp_path, replicas=3), "-y")
    assert code == 0
    assert "svc: version 2 rolled out, 3/3 READY in " in stdout
    assert len(harness.provider.calls_to("launch")) == 2  # the first two replicas were reused, one launched


def test_update_that_cannot_roll_out_exits_1_naming_why(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    harness.prober.default = ProbeResult(ok=False, detail="HTTP 503")
    for replica in harness.replicas():  # the old replicas keep answering
        harness.prober.set({("svc", replica.replica_id): ProbeResult(ok=True, detail="HTTP 200")})
    harness.provider.fail_next_launch("image not found", permanent=True, times=10)
    code, _, stderr = cli("serve", "update", "svc", task_file(tmp_path, run="python broken.py"), "-y")
    assert code == 1
    # Launches go two at a time (the target), so the third failure comes with a fourth.
    assert "Error: svc: version 2 did not roll out: 4 replicas of version 2 failed before becoming ready, " \
           "launching stopped" in stderr
    assert "FAILED_PROVISION: image not found" in stderr and "sky-lite serve logs svc" in stderr
    assert {r.status.value for r in harness.replicas() if r.version == 1} == {"READY"}  # still serving


def test_update_times_out_naming_the_replica_it_waits_for(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    harness.prober.default = ProbeResult(ok=False, detail="cannot connect: Connection refused")
    for replica in harness.replicas():
        harness.prober.set({("svc", replica.replica_id): ProbeResult(ok=True, detail="HTTP 200")})
    code, _, stderr = cli("serve", "update", "svc", task_file(tmp_path, run="python slow.py"), "-y", "--timeout", "1")
    assert code == 1
    assert "Error: svc: version 2 is not rolled out after 1s (0/2 READY); waiting for replica 3 to become READY" \
        in stderr


def test_no_wait_returns_once_stored_and_points_at_serve_wait(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    code, stdout, _ = cli("serve", "update", "svc", task_file(tmp_path, run="python serve.py"), "-y",
                               "--no-wait")
    assert code == 0
    assert "rolled out" not in stdout
    assert "Service svc is rolling out version 2 (rolling); follow it with `sky-lite serve wait svc`." in stdout
    code, stdout, _ = cli("serve", "wait", "svc")
    assert code == 0 and "svc: version 2 rolled out, 2/2 READY in " in stdout


def test_rollback_waits_too(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    assert cli("serve", "update", "svc", task_file(tmp_path, run="python serve.py"), "-y")[0] == 0
    code, stdout, stderr = cli("serve", "rollback", "svc", "-y")
    assert code == 0, stderr
    assert "svc: version 3 rolled out, 2/2 READY in " in stdout


def test_wait_for_an_unknown_version_or_service_exits_1(cli: Cli) -> None:
    code, _, stderr = cli("serve", "wait", "svc", "--version", "4")
    assert code == 1 and "service svc has no version 4 (its current version is 1)" in stderr
    code, _, stderr = cli("serve", "wait", "nope")
    assert code == 1 and "no service named 'nope'" in stderr


def test_wait_for_an_older_version_says_it_was_superseded(cli: Cli, tmp_path: Path) -> None:
    assert cli("serve", "update", "svc", task_file(tmp_path, run="python serve.py"), "-y")[0] == 0
    code, _, stderr = cli("serve", "wait", "svc", "--version", "1")
    assert code == 1
    assert "svc: stopped waiting for version 1: version 2 was submitted meanwhile; `sky-lite serve wait svc` " \
           "follows it" in stderr


def test_ctrl_c_while_waiting_says_the_rollout_goes_on_and_exits_130(harness: Harness, tmp_path: Path) -> None:
    controller = PassingController(harness)
    cli = Cli(controller)
    harness.prober.default = ProbeResult(ok=False, detail="HTTP 503")
    for replica in harness.replicas():
        harness.prober.set({("svc", replica.replica_id): ProbeResult(ok=True, detail="HTTP 200")})
    controller.interrupt_after = 3  # the plan's read, then two polls of the wait
    code, _, stderr = cli("serve", "update", "svc", task_file(tmp_path, run="python serve.py"), "-y")
    assert code == 130
    assert "Stopped waiting; the controller keeps rolling out version 2 of svc (`sky-lite serve wait svc` follows " \
           "it again); `sky-lite serve down svc` cancels it." in stderr
    assert harness.service().current_version == 2  # stored, and rolling out


def test_update_with_json_says_on_stderr_that_it_is_stored_and_prints_only_json(
        cli: Cli, tmp_path: Path) -> None:
    code, stdout, stderr = cli("serve", "update", "svc", task_file(tmp_path, run="python serve.py"), "-y", "-o", "json")
    assert code == 0, stderr
    assert "Service svc is rolling out version 2 (rolling).\n" in stderr and "serve wait" not in stderr
    assert json.loads(stdout[:stdout.rindex("}") + 1])["to_version"] == 2


def test_down_replica_id_terminates_one_replica_and_the_controller_replaces_it(
        cli: Cli, harness: Harness) -> None:
    code, stdout, stderr = cli("serve", "down", "svc", "--replica-id", "1", "-y")
    assert code == 0, stderr
    assert stdout == "Replica 1 of svc terminated.\n"
    # What the wait waited for, said once though polled at every pass of the drain (5 s of the harness):
    # the first poll's pass took the replica out of traffic already.
    assert stderr.splitlines() == [
        "Replica 1 of svc is draining (out of traffic); the controller terminates it SKY_LITE_DRAIN_SECONDS (10 s "
        "by default) after it left traffic, so that requests it has can finish..."]
    statuses = harness.statuses()
    assert 1 not in statuses and statuses[2] == "READY" and statuses[3] in ("PROVISIONING", "READY")
    assert harness.store.list_replica_terminations() == {}


def test_down_replica_id_asks_first_and_a_no_changes_nothing(cli: Cli, harness: Harness) -> None:
    code, stdout, _ = cli("serve", "down", "svc", "--replica-id", "2", input="n\n")
    assert code == 1
    assert "Terminate replica 2 of svc? The controller launches a replacement when the policy still wants " \
           "one." in stdout
    assert harness.store.list_replica_terminations() == {}
    assert harness.statuses() == {1: "READY", 2: "READY"}


@pytest.mark.parametrize(("args", "code", "message"), [
    (("svc", "--replica-id", "7"), 1, "service 'svc' has no replica 7 (its replicas: 1, 2)"),
    (("nope", "--replica-id", "1"), 1, "no service named 'nope'"),
    (("s*", "--replica-id", "1"), 2, "--replica-id terminates replicas of one service"),
    (("svc", "other", "--replica-id", "1"), 2, "name exactly one service"),
    (("--all", "--replica-id", "1"), 2, "name exactly one service"),
    (("svc", "--replica-id", "0"), 2, "Invalid value for '--replica-id'"),
])
def test_down_replica_id_refuses_bad_input_before_asking(cli: Cli, harness: Harness, args: tuple[str, ...],
                                                         code: int, message: str) -> None:
    exit_code, stdout, stderr = cli("serve", "down", *args)  # no -y: a question would read EOF and abort
    assert exit_code == code
    assert message in stderr
    assert "Terminate" not in stdout
    assert harness.store.list_replica_terminations() == {}


REPLICA = ReplicaRecord(service="web", replica_id=3, version=1, status=ReplicaStatus.READY, cloud="local",
                        launched_at=0.0, status_since=0.0, launch_token="t")


@pytest.mark.parametrize(("status", "line"), [
    (ReplicaStatus.READY, "Replica 3 of web is READY; waiting for the controller's next pass to take it out of "
     "traffic..."),
    (ReplicaStatus.STARTING, "Replica 3 of web is STARTING; waiting for the controller's next pass to take it out "
     "of traffic..."),
    (ReplicaStatus.SHUTTING_DOWN, "Replica 3 of web is draining (out of traffic); the controller terminates it "
     "SKY_LITE_DRAIN_SECONDS (10 s by default) after it left traffic, so that requests it has can finish..."),
])
def test_what_a_replica_termination_waits_for(status: ReplicaStatus, line: str) -> None:
    assert describe_termination("web", dataclasses.replace(REPLICA, status=status)) == line


def test_down_replica_id_says_each_phase_once_in_order(harness: Harness) -> None:
    """Read before the controller's pass: first READY (the request is stored, not yet carried out), then
    draining, each said once."""
    class ReadFirst(PassingController):
        def get_status(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> list[ServiceView]:
            views = LocalController.get_status(self, names, events=events)
            self.harness.tick()
            return views

    code, stdout, stderr = Cli(ReadFirst(harness))("serve", "down", "svc", "--replica-id", "2", "-y")
    assert code == 0, stderr
    assert [line.split(";")[0] for line in stderr.splitlines()] == [
        "Replica 2 of svc is READY", "Replica 2 of svc is draining (out of traffic)"]
    assert stdout == "Replica 2 of svc terminated.\n"
