"""`serve update / history / rollback` through the CLI: plans, confirmation, and nothing stored on refusal."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.plan.canary import CanarySettings
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, VersionRecord
from skyserve_lite.state.store import Store

from .homes import home_with_service, versions, write
from .runner import Cli

V1 = "resources:\n  infra: local\n  image_id: img-1\nservice:\n  replicas: 2\nrun: python serve.py\n"


@pytest.fixture
def cli(home: Path) -> Cli:
    return Cli(LocalController(home, FakeClock(), start_daemon=False))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return home_with_service(tmp_path, V1, replicas=2)


def test_dry_run_json_is_the_plan_and_stores_nothing(cli: Cli, home: Path, tmp_path: Path) -> None:
    new = write(tmp_path, V1.replace("replicas: 2", "replicas: 3"))
    code, stdout, _ = cli("serve", "update", "--no-wait", "svc", new, "--dry-run", "-o", "json")
    assert code == 0
    assert json.loads(stdout) == {
        "service": "svc", "from_version": 1, "to_version": 2, "mode": "rolling", "target_replicas": 3,
        "replicas": [{"replica_id": 1, "version": 1, "action": "reuse", "reasons": []},
                     {"replica_id": 2, "version": 1, "action": "reuse", "reasons": []}],
        "launches": [{"replica_id": 3, "spot": False, "kept": True}],
        "steps": [{"launch": [3], "drain": [], "active_versions": [2]}],
        "launch": 1, "terminate": [], "summary": "reuse 2, replace 0, launch 1, terminate 0", "converged": True,
        "notes": []}
    assert versions(home) == [1]


def test_an_update_plan_notes_a_reference_nothing_fills_in(cli: Cli, home: Path, tmp_path: Path) -> None:
    text = V1.replace("run:", "envs:\n  MODEL: m\nrun:").replace(
        "service:", "service:\n  readiness_probe:\n    path: /$MODEL\n    headers: {X-Key: $NO_SUCH}")
    code, stdout, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, text), "--dry-run")
    assert code == 0, stderr
    assert ("Note: service.readiness_probe.headers.X-Key: $NO_SUCH is neither in envs nor in secrets, so it is "
            "used as written") in " ".join(stdout.split())
    assert "$MODEL" not in stdout  # filled in: no note for it
    code, stdout, _ = cli("serve", "update", "--no-wait", "svc", write(tmp_path, text), "--dry-run", "-o", "json")
    assert json.loads(stdout)["notes"] == ["service.readiness_probe.headers.X-Key: $NO_SUCH is neither in envs "
                                           "nor in secrets, so it is used as written"]


def test_dry_run_table_names_the_field_that_forces_replacement(cli: Cli, home: Path, tmp_path: Path) -> None:
    new = write(tmp_path, V1.replace("img-1", "img-2"))
    code, stdout, _ = cli("serve", "update", "--no-wait", "svc", new, "--dry-run", "--mode", "blue_green")
    assert code == 0
    assert "resources.image_id: img-1 -> img-2" in stdout
    assert "blue_green" in stdout
    assert " 1. launch 3, 4 (traffic: version 1)" in stdout
    assert " 2. drain 1, 2 (traffic: version 2)" in stdout
    assert "reuse 0, replace 2, launch 2, terminate 2" in stdout


def test_update_with_yes_stores_the_next_version(cli: Cli, home: Path, tmp_path: Path) -> None:
    new = write(tmp_path, V1.replace("replicas: 2", "replicas: 1"))
    code, stdout, _ = cli("serve", "update", "--no-wait", "svc", new, "-y")
    assert code == 0
    assert "reuse 1, replace 0, launch 0, terminate 1" in stdout
    assert "rolling out version 2 (rolling)" in stdout
    assert versions(home) == [1, 2]


def test_declining_the_confirmation_stores_nothing(cli: Cli, home: Path, tmp_path: Path) -> None:
    new = write(tmp_path, V1.replace("replicas: 2", "replicas: 1"))
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", new, input="n\n")
    assert code == 1
    assert "Apply this update?" in stderr
    assert versions(home) == [1]


@pytest.mark.parametrize(
    ("args", "text", "code", "message"),
    [
        pytest.param(["svc"], "service:\n  replicas: -1\nrun: x\n", 2, "service.replicas: must be at least 1",
                     id="invalid-yaml"),
        pytest.param(["nope"], V1, 1, "no service named 'nope'", id="unknown-service"),
        pytest.param(["svc", "--expect-version", "5"], V1, 1, "is at version 1, not 5", id="expect-version"),
        pytest.param(["svc", "--mode", "recreate"], V1, 2, "Invalid value for '--mode'", id="unknown-mode"),
    ],
)
def test_refused_updates_store_nothing(cli: Cli, home: Path, tmp_path: Path, args: list[str], text: str, code: int,
                                       message: str) -> None:
    new = write(tmp_path, text)
    exit_code, _, stderr = cli("serve", "update", "--no-wait", args[0], new, *args[1:], "-y")
    assert exit_code == code
    assert message in stderr
    assert versions(home) == [1]


def test_history_summarizes_each_version(cli: Cli, home: Path, tmp_path: Path) -> None:
    cli("serve", "update", "--no-wait", "svc", write(tmp_path, V1.replace("replicas: 2", "replicas: 3")), "-y")
    cli("serve", "update", "--no-wait", "svc", write(tmp_path, V1.replace("replicas: 2", "replicas: 3")
                                            .replace("img-1", "img-2")), "-y", "--mode", "blue_green")
    code, stdout, _ = cli("serve", "history", "svc", "-o", "json")
    assert code == 0
    history = json.loads(stdout)
    assert history["current_version"] == 3
    assert [(v["version"], v["mode"], v["summary"]) for v in history["versions"]] == [
        (1, "initial", "initial version"),
        (2, "rolling", "reuses replicas: service.replicas: 2 -> 3"),  # as the file says it
        (3, "blue_green", "replaces replicas: resources.image_id: img-1 -> img-2"),
    ]
    assert "replaces replicas" in cli("serve", "history", "svc")[1]


def test_rollback_goes_to_the_previous_text_with_a_note(cli: Cli, home: Path, tmp_path: Path) -> None:
    cli("serve", "update", "--no-wait", "svc", write(tmp_path, V1.replace("img-1", "img-2")), "-y")
    code, stdout, _ = cli("serve", "rollback", "--no-wait", "svc", "--dry-run", "-o", "json")
    assert code == 0
    plan = json.loads(stdout)
    assert (plan["from_version"], plan["to_version"]) == (2, 3)
    assert {r["action"] for r in plan["replicas"]} == {"reuse"}  # replicas still run version 1's config
    assert versions(home) == [1, 2]
    assert cli("serve", "rollback", "--no-wait", "svc", "-y")[0] == 0
    store = Store.open(home)
    rolled = store.get_version("svc", 3)
    assert (rolled.text, rolled.note) == (V1, "rollback to version 1")
    store.close()


def test_a_rollback_is_headed_and_asked_as_a_rollback_naming_the_version_it_brings_back(
        cli: Cli, home: Path, tmp_path: Path) -> None:
    """A rollback to version 1 stores version 3: "Update svc: version 2 -> 3" alone read as a step forward."""
    cli("serve", "update", "--no-wait", "svc", write(tmp_path, V1.replace("img-1", "img-2")), "-y")
    code, stdout, stderr = cli("serve", "rollback", "--no-wait", "svc", input="y\n")
    assert code == 0, stderr
    assert stdout.splitlines()[0] == "Rollback svc: version 2 -> 3 (version 1's task, rolling), target 2 replicas"
    assert "Update svc" not in stdout
    assert "Apply this rollback?" in stderr and "Apply this update?" not in stderr
    assert stdout.splitlines()[-1] == ("Service svc is rolling out version 3 (rolling), version 1's task; follow it "
                                       "with `sky-lite serve wait svc`.")
    assert versions(home) == [1, 2, 3]


@pytest.mark.parametrize(("command", "title"), [
    (["update", "--no-wait", "svc", "NEW"], "Update svc: version 1 -> 2 (rolling), target 2 replicas"),
    (["rollback", "--no-wait", "svc", "--to", "1", "--mode", "blue_green"],
     "Rollback svc: version 2 -> 3 (version 1's task, blue_green), target 2 replicas"),
])
def test_dry_run_titles(cli: Cli, home: Path, tmp_path: Path, command: list[str], title: str) -> None:
    new = write(tmp_path, V1.replace("img-1", "img-2"))
    if command[0] == "rollback":
        cli("serve", "update", "--no-wait", "svc", new, "-y")
    code, stdout, _ = cli("serve", *[new if arg == "NEW" else arg for arg in command], "--dry-run")
    assert code == 0
    assert stdout.splitlines()[0] == title


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param([], "has only version 1; nothing to roll back to", id="nothing-before"),
        pytest.param(["--to", "9"], "has no version 9", id="unknown-version"),
        pytest.param(["--to", "1"], "is already at version 1", id="current-version"),
    ],
)
def test_refused_rollbacks(cli: Cli, home: Path, args: list[str], message: str) -> None:
    code, _, stderr = cli("serve", "rollback", "--no-wait", "svc", *args, "-y")
    assert code == 1
    assert message in stderr
    assert versions(home) == [1]


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_a_task_the_cloud_cannot_run_is_refused_before_the_plan(cli: Cli, home: Path, tmp_path: Path,
                                                                dry_run: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("skyserve_lite.providers._has_module", lambda _name: False)  # no GCP library here
    new = write(tmp_path, V1.replace("infra: local\n  image_id: img-1", "cloud: gcp"))
    code, stdout, stderr = cli("serve", "update", "--no-wait", "svc", new, *dry_run, input="y\n")
    assert code == 2
    assert "resources.cloud: cloud 'gcp' is not available here" in stderr
    assert stdout == "" and "Apply this update?" not in stderr
    assert versions(home) == [1]


class RacingController(LocalController):
    """Another update lands between our plan and our submit (once)."""

    def __init__(self, home: Path, racer: SubmittedTask) -> None:
        super().__init__(home, FakeClock(), start_daemon=False)
        self.racer: SubmittedTask | None = racer

    def submit_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                      expect_version: int | None = None, note: str | None = None,
                      reuse_identical_files: bool = False, key: str | None = None,
                      canary: CanarySettings | None = None) -> VersionRecord:
        if self.racer is not None:
            racer, self.racer = self.racer, None
            LocalController(self.home, FakeClock(), start_daemon=False).submit_update(name, racer, mode)
        return super().submit_update(name, task, mode, expect_version=expect_version, note=note,
                                     reuse_identical_files=reuse_identical_files, key=key, canary=canary)


def test_an_update_that_loses_a_race_plans_again_and_names_the_version_it_stores(home: Path, tmp_path: Path) -> None:
    racer = load_task_file(Path(write(tmp_path, V1.replace("img-1", "img-9"))))
    new = write(tmp_path, V1.replace("replicas: 2", "replicas: 3"))
    code, stdout, stderr = Cli(RacingController(home, racer))("serve", "update", "--no-wait", "svc", new, "-y")
    assert code == 0, stderr
    assert "version 1 -> 2" in stdout and "version 2 -> 3" in stdout  # the first plan, then the real one
    assert "updated by someone else meanwhile; planning again" in stderr
    assert "rolling out version 3" in stdout
    assert versions(home) == [1, 2, 3]


def test_with_expect_version_a_lost_race_is_refused(home: Path, tmp_path: Path) -> None:
    racer = load_task_file(Path(write(tmp_path, V1.replace("img-1", "img-9"))))
    new = write(tmp_path, V1.replace("replicas: 2", "replicas: 3"))
    code, _, stderr = Cli(RacingController(home, racer))("serve", "update", "--no-wait", "svc", new, "-y",
                                                         "--expect-version", "1")
    assert code == 1
    assert "is at version 2, not 1" in stderr
    assert versions(home) == [1, 2]  # the racer's version only


WD = "workdir: ./app\nservice:\n  replicas: 2\nrun: python app.py\n"


@dataclass(frozen=True)
class WorkdirService:
    cli: Cli
    home: Path
    project: Path


@pytest.fixture
def wd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkdirService:
    """A service with a workdir at version 1, with two READY replicas (a state directory of its own),
    submitted from its project's folder (relative paths resolve against the working directory)."""
    root = tmp_path / "project"
    (root / "app").mkdir(parents=True)
    monkeypatch.chdir(root)
    (root / "app" / "app.py").write_text("print('v1')")
    (root / "svc.yaml").write_text(WD)
    home = tmp_path / "wd-home"
    LocalController(home, FakeClock(), start_daemon=False).create_service("svc", load_task_file(root / "svc.yaml"))
    store = Store.open(home)
    store.add_replicas("svc", 2, ReplicaRecord(service="svc", replica_id=0, version=1, status=ReplicaStatus.READY,
                                               cloud="local", launched_at=0.0, status_since=0.0, launch_token="t"))
    store.close()
    return WorkdirService(Cli(LocalController(home, FakeClock(), start_daemon=False)), home, root)


def test_an_identical_workdir_is_replaced_by_default_and_the_plan_says_it_is_identical(wd: WorkdirService) -> None:
    (wd.project / "svc.yaml").write_text(WD.replace("replicas: 2", "replicas: 3"))
    code, stdout, _ = wd.cli("serve", "update", "--no-wait", "svc", str(wd.project / "svc.yaml"), "--dry-run")
    assert code == 0
    assert "workdir: contents identical (sha256" in stdout and "--reuse-identical-files keeps it" in stdout
    assert "reuse 0, replace 2, launch 3, terminate 2" in stdout


def test_reuse_identical_files_makes_a_scale_up_launch_only_the_difference(wd: WorkdirService,
                                                                           home: Path) -> None:
    (wd.project / "svc.yaml").write_text(WD.replace("replicas: 2", "replicas: 3"))
    args = ("serve", "update", "--no-wait", "svc", str(wd.project / "svc.yaml"), "--reuse-identical-files")
    assert "reuse 2, replace 0, launch 1, terminate 0" in wd.cli(*args, "--dry-run")[1]
    code, stdout, _ = wd.cli(*args, "-y")
    assert code == 0 and "reuse 2, replace 0, launch 1, terminate 0" in stdout
    store = Store.open(wd.home)
    assert store.get_version("svc", 2).reuse_identical_files
    store.close()


def test_a_changed_file_is_named_and_history_shows_each_snapshot(wd: WorkdirService) -> None:
    (wd.project / "app" / "app.py").write_text("print('v2')")
    (wd.project / "app" / "new.py").write_text("")
    code, stdout, _ = wd.cli("serve", "update", "--no-wait", "svc", str(wd.project / "svc.yaml"),
                             "--reuse-identical-files", "-y")
    assert code == 0
    assert "workdir: contents changed (2 files: app.py, +new.py)" in stdout
    history = json.loads(wd.cli("serve", "history", "svc", "-o", "json")[1])["versions"]
    first, second = (v["files"] for v in history)
    assert first["size"] == len("print('v1')") and second["size"] == len("print('v2')")
    assert first["digest"] != second["digest"] and not first["expired"]
    table = wd.cli("serve", "history", "svc")[1]
    assert f"sha256 {first['digest'][:8]} (11 bytes)" in table


def test_rollback_runs_the_files_of_the_version_it_goes_back_to(wd: WorkdirService) -> None:
    (wd.project / "app" / "app.py").write_text("print('v2')")
    assert wd.cli("serve", "update", "--no-wait", "svc", str(wd.project / "svc.yaml"), "-y")[0] == 0
    (wd.project / "app" / "app.py").write_text("edited on disk, never submitted")
    assert wd.cli("serve", "rollback", "--no-wait", "svc", "--to", "1", "-y")[0] == 0
    store = Store.open(wd.home)
    v1, v3 = store.get_version("svc", 1).files, store.get_version("svc", 3).files
    store.close()
    assert v1 is not None and v3 is not None and v3.digest == v1.digest


def test_rollback_to_a_version_whose_files_expired_says_so(wd: WorkdirService,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(wd.home)
    store.delete_replicas([("svc", 1), ("svc", 2)])  # nothing runs version 1 any more
    store.close()
    monkeypatch.setenv("SKY_LITE_KEEP_SNAPSHOT_VERSIONS", "1")
    for text in ("print('v2')", "print('v3')"):
        (wd.project / "app" / "app.py").write_text(text)
        assert wd.cli("serve", "update", "--no-wait", "svc", str(wd.project / "svc.yaml"), "-y")[0] == 0
    code, _, stderr = wd.cli("serve", "rollback", "--no-wait", "svc", "--to", "1", "-y")
    assert code == 1
    assert "version 1 of 'svc' cannot be rolled back to: its files were dropped" in stderr
    assert "expired" in wd.cli("serve", "history", "svc")[1]
    assert versions(wd.home) == [1, 2, 3]
