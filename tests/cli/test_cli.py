"""The CLI with click's runner: exit codes, messages, and that bad input changes nothing."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import click
import pytest

from skyserve_lite import procs
from skyserve_lite.api import DEFAULT_EVENTS, ControllerStatus, LocalController, StatusReport
from skyserve_lite.cli.main import main
from skyserve_lite.cli.params import FiniteFloatRange
from skyserve_lite.clock import FakeClock
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.store import Store

from .runner import Cli

TASK = "service:\n  replicas: 1\nrun: echo hi\n"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def cli(home: Path) -> Cli:
    return Cli(LocalController(home, start_daemon=False))


def add_service(home: Path, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(TASK)
    LocalController(home, start_daemon=False).create_service(name, load_task_file(path))


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param(["serve", "status", "nope"], 1, "Error: no service named 'nope'", id="status-unknown"),
        pytest.param(["serve", "down", "nope", "-y"], 1, "Error: no service named 'nope'", id="down-unknown"),
        pytest.param(["serve", "down", "-y"], 2, "name the services to take down, or pass --all",
                     id="down-nothing-named"),
        pytest.param(["serve", "logs", "nope", "1"], 1, "Error: no service named 'nope'", id="logs-unknown"),
        pytest.param(["serve", "up", "missing.yaml"], 2, "missing.yaml: cannot read the file",
                     id="up-missing-file"),
        pytest.param(["serve", "status", "-o", "xml"], 2, "Invalid value for '-o'", id="bad-output"),
    ],
)
def test_errors_exit_with_a_message_and_no_traceback(cli: Cli, home: Path, args: list[str], code: int,
                                                     message: str) -> None:
    exit_code, _stdout, stderr = cli(*args)
    assert exit_code == code
    assert message in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("text", "name_args", "message"),
    [
        pytest.param("service: [\n", [], "invalid YAML (line 2, column 1)", id="yaml-syntax"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: azure\n", [],
                     "resources.cloud: cloud 'azure' is not offered by sky-lite", id="unknown-cloud"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: gcp\n", [],
                     "resources.cloud: cloud 'gcp' is not available here", id="unavailable-cloud"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: local\n  accelerators: A100:1\n", [],
                     "resources.accelerators: A100:1: the local cloud runs replicas as processes", id="local-gpu"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: aws\n  accelerators: Z9000:1\n", [],
                     "resources.accelerators: ", id="aws-unknown-accelerator"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: aws\n  region: us-east-7\n", [],
                     "resources.region: ", id="aws-unknown-region"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: gcp\n  region: uscentral\n", [],
                     "resources.region: ", id="gcp-unknown-region"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: gcp\n  region: us-central1\n"
                     "file_mounts:\n  /d: s3://b/k\n", [], "file_mounts./d: 's3://b/k': cloud gcp copies local paths "
                     "and gs:// sources only", id="gcp-foreign-mount-scheme"),
        pytest.param("service:\n  replicas: 1\nrun: x\nresources:\n  cloud: aws\n  image_id: ami-1\n"
                     "file_mounts:\n  /data: gs://bucket/data\n", [],
                     "file_mounts./data: 'gs://bucket/data': cloud aws copies local paths and s3:// sources only",
                     id="aws-foreign-mount-scheme"),
        pytest.param(TASK, ["-n", "Bad_Name"], "invalid service name 'Bad_Name'", id="invalid-name"),
        pytest.param(TASK + "workdir: ./nope\n", [], "workdir: './nope' does not exist", id="missing-workdir"),
        pytest.param(TASK + "file_mounts:\n  /data: ./missing.csv\n", [],
                     "file_mounts./data: './missing.csv' does not exist", id="missing-mount-source"),
        pytest.param(TASK + "file_mounts:\n  ../../../../tmp/x: ./app.py\n", [],
                     "file_mounts.../../../../tmp/x: the destination may not contain '..'", id="dotdot-destination"),
    ],
)
def test_bad_input_to_up_exits_2_and_writes_nothing(cli: Cli, home: Path, tmp_path: Path, text: str,
                                                    name_args: list[str], message: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if "not available here" in message:  # a cloud whose library this installation lacks
        monkeypatch.setattr("skyserve_lite.providers._has_module", lambda _name: False)
    monkeypatch.delenv("SKY_LITE_GCP_REGION", raising=False)
    path = tmp_path / "task.yaml"
    path.write_text(text)
    (tmp_path / "app.py").write_text("print(1)")
    exit_code, stdout, stderr = cli("serve", "up", str(path), *name_args)
    assert exit_code == 2
    assert message in stderr
    assert stdout == ""
    assert not (home / "state.db").exists() or json.loads(cli("serve", "status", "-o", "json")[1])["services"] == []
    assert not (home / "blobs").exists()


def test_a_snapshot_over_the_limit_is_refused_and_stores_no_version(cli: Cli, home: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKY_LITE_SNAPSHOT_LIMIT_BYTES", "10")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "big.bin").write_text("x" * 11)
    path = tmp_path / "task.yaml"
    path.write_text(TASK + "workdir: ./app\n")
    exit_code, _, stderr = cli("serve", "up", str(path))
    assert exit_code == 2
    assert "workdir: the task's files exceed the snapshot limit of 10 bytes per version" in stderr
    assert json.loads(cli("serve", "status", "-o", "json")[1])["services"] == []


def test_status_json_is_only_json_on_stdout(cli: Cli, home: Path, tmp_path: Path) -> None:
    add_service(home, tmp_path, "alpha")
    add_service(home, tmp_path, "beta")
    exit_code, stdout, _ = cli("serve", "status", "-o", "json")
    assert exit_code == 0
    services = json.loads(stdout)["services"]
    assert [(s["name"], s["status"], s["version"], s["policy"]) for s in services] == [
        ("alpha", "CONTROLLER_INIT", 1, "Fixed 1 replica"), ("beta", "CONTROLLER_INIT", 1, "Fixed 1 replica")]
    endpoints = [s["endpoint"] for s in services]
    assert all(re.fullmatch(r"http://127\.0\.0\.1:30\d\d\d", e) for e in endpoints)
    assert endpoints[0] != endpoints[1]


def test_status_table_names_services(cli: Cli, home: Path, tmp_path: Path) -> None:
    add_service(home, tmp_path, "alpha")
    exit_code, stdout, _ = cli("serve", "status", "alpha")
    assert exit_code == 0
    assert "alpha" in stdout and "CONTROLLER_INIT" in stdout and "Fixed 1 replica" in stdout


class _StatusCalls(LocalController):
    """A local controller that records the ``events`` each status read asked for."""

    def __init__(self, home: Path) -> None:
        super().__init__(home, start_daemon=False)
        self.events_asked: list[int] = []

    def get_status_report(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> StatusReport:
        self.events_asked.append(events)
        return super().get_status_report(names, events=events)


@pytest.mark.parametrize(("args", "events"), [
    (["serve", "status"], 0),  # the fleet's table shows no events: none read
    (["serve", "status", "alpha"], DEFAULT_EVENTS),
    (["serve", "status", "-o", "json"], DEFAULT_EVENTS),
    (["serve", "status", "--events", "3", "-o", "json"], 3),
])
def test_status_reads_events_only_where_it_shows_them(home: Path, tmp_path: Path, args: list[str],
                                                      events: int) -> None:
    add_service(home, tmp_path, "alpha")
    controller = _StatusCalls(home)
    exit_code, stdout, _ = Cli(controller)(*args)
    assert exit_code == 0 and "alpha" in stdout
    assert controller.events_asked == [events]


class _CollectionSeen(LocalController):
    """A local controller that records whether automatic garbage collection was on during the status read."""

    def __init__(self, home: Path) -> None:
        super().__init__(home, start_daemon=False)
        self.collecting: list[bool] = []

    def get_status_report(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> StatusReport:
        self.collecting.append(gc.isenabled())
        return super().get_status_report(names, events=events)


def test_status_reads_and_prints_without_automatic_collection_and_restores_it(home: Path, tmp_path: Path) -> None:
    add_service(home, tmp_path, "alpha")
    controller = _CollectionSeen(home)
    assert gc.isenabled()
    exit_code, stdout, _ = Cli(controller)("serve", "status")
    assert exit_code == 0 and "alpha" in stdout
    assert controller.collecting == [False]
    assert gc.isenabled()  # restored for what runs after the command
    exit_code, _, _ = Cli(controller)("serve", "status", "nosuch")  # an error on the way out restores it too
    assert exit_code != 0 and controller.collecting == [False, False] and gc.isenabled()


def test_one_shot_collection_leaves_collection_off_when_it_was_off() -> None:
    from skyserve_lite.cli.common import one_shot_collection

    gc.disable()
    try:
        with one_shot_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_status_without_services_says_how_to_start_one(cli: Cli, home: Path) -> None:
    exit_code, stdout, _ = cli("serve", "status")
    assert exit_code == 0
    assert "sky-lite serve up TASK.yaml" in stdout


def test_down_asks_for_confirmation_and_declining_changes_nothing(cli: Cli, home: Path, tmp_path: Path) -> None:
    add_service(home, tmp_path, "alpha")
    exit_code, stdout, _ = cli("serve", "down", "alpha", input="n\n")
    assert exit_code == 1
    assert "Take down alpha?" in stdout
    (view,) = LocalController(home, start_daemon=False).get_status(["alpha"])
    assert not view.service.deleting


def test_default_name_is_the_yaml_name_else_the_file_stem(tmp_path: Path) -> None:
    from skyserve_lite.api import default_service_name

    named = tmp_path / "whatever.yaml"
    named.write_text("name: fromyaml\n" + TASK)
    stem = tmp_path / "my_service.yaml"
    stem.write_text(TASK)
    assert default_service_name(load_task_file(named)) == "fromyaml"
    assert default_service_name(load_task_file(stem)) == "my-service"


# What a command imports only when it runs: `sky-lite --help` (and every command's own help) starts in about
# a third of the time without them (docs/benchmarks.md, "CLI start-up").
HEAVY_MODULES = ("skyserve_lite.api", "skyserve_lite.spec.parse", "skyserve_lite.state.store", "rich", "yaml",
                 "aiohttp", "boto3", "botocore", "google.cloud")


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["serve", "up", "--help"],
                                  ["serve", "status", "--help"], ["serve", "update", "--help"],
                                  ["controller", "--help"], ["controller", "up", "--help"], ["config", "--help"]],
                         ids=" ".join)
def test_help_imports_none_of_what_the_commands_use(argv: list[str]) -> None:
    code = ("import io, sys, contextlib; from skyserve_lite.cli.main import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()): assert main({argv!r}, standalone_mode=False) == 0\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY_MODULES!r} or m in {HEAVY_MODULES!r} "
            "or m.startswith(('skyserve_lite.spec.', 'skyserve_lite.state.'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# What `serve status` (the command run most, and answered per call on a controller host) leaves to the commands
# that need it: capturing files, blobs, TLS (ssl), forecasting, providers and their SDKs, the load balancer, the
# autoscaling policies (a status reads their target only), YAML (it reads each version's stored service section).
STATUS_UNNEEDED = ("skyserve_lite.files.capture", "skyserve_lite.files.blobs", "skyserve_lite.files.tls",
                   "skyserve_lite.controller.forecast", "skyserve_lite.providers", "skyserve_lite.lb",
                   "skyserve_lite.autoscalers.dispatch", "skyserve_lite.autoscalers.fixed", "skyserve_lite.spec.config",
                   "skyserve_lite.state.secrets", "skyserve_lite.logview", "skyserve_lite.controller.replica_rules",
                   "skyserve_lite.remote.transport", "skyserve_lite.remote.client", "skyserve_lite.spec.yaml_doc",
                   "yaml", "ssl", "aiohttp", "boto3", "google.cloud")


def test_status_imports_none_of_what_other_commands_use(tmp_path: Path) -> None:
    from skyserve_lite.spec.model import SubmittedTask
    from skyserve_lite.spec.parse import parse_task
    from skyserve_lite.state.store import Store

    store = Store.open(tmp_path / "home")
    store.create_service("svc", SubmittedTask(TASK, str(tmp_path / "svc.yaml"), parse_task(TASK)), 30001, 0.0)
    store.close()
    code = ("import io, sys, contextlib; from skyserve_lite.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    assert main(['serve', 'status'], standalone_mode=False) in (0, None)\n"
            f"print(sorted(m for m in sys.modules if m in {STATUS_UNNEEDED!r} or m.startswith("
            f"tuple(n + '.' for n in {STATUS_UNNEEDED!r}))))")
    env = {**os.environ, "SKY_LITE_HOME": str(tmp_path / "home")}
    env.pop("SKY_LITE_CONTROLLER", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == "[]"
    shown = subprocess.run([sys.executable, "-m", "skyserve_lite", "serve", "status"], capture_output=True, text=True,
                           check=True, env=env)
    assert "svc" in shown.stdout  # the status the modules were counted for showed the service


def test_the_update_modes_offered_are_the_rollout_modes() -> None:
    """``--mode`` takes its choices from ``defaults`` (light to import); ``UpdateMode`` is what runs them."""
    from skyserve_lite.defaults import UPDATE_MODES
    from skyserve_lite.plan.rollout import UpdateMode

    assert tuple(mode.value for mode in UpdateMode) == UPDATE_MODES
    assert UpdateMode.ROLLING.value == UPDATE_MODES[0]  # the default


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [("SKY_LITE_LB_HOLD_SECONDS", "soon", "SKY_LITE_LB_HOLD_SECONDS must be a number of seconds, got 'soon'"),
     ("SKY_LITE_DRAIN_SECONDS", "-3", "SKY_LITE_DRAIN_SECONDS must be at least 0")],
)
def test_bad_settings_fail_up_before_anything_is_stored(cli: Cli, home: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    path = tmp_path / "task.yaml"
    path.write_text(TASK)
    exit_code, _, stderr = cli("serve", "up", str(path), "-n", "svc")
    assert exit_code == 2
    assert message in stderr
    assert not (home / "state.db").exists()


class RecordingController(LocalController):
    """This machine's state, with the background controller's start recorded instead of spawned."""

    def __init__(self, home: Path) -> None:
        super().__init__(home, start_daemon=False)
        self.started = 0

    def start_controller(self) -> ControllerStatus:
        self.started += 1
        return ControllerStatus(running=True, pid=4242, services=1)


def test_status_is_a_read_it_warns_when_no_controller_runs_and_starts_none(home: Path, tmp_path: Path) -> None:
    add_service(home, tmp_path, "alpha")
    controller = RecordingController(home)
    exit_code, stdout, stderr = Cli(controller)("serve", "status")
    assert exit_code == 0
    assert "alpha" in stdout
    assert "no controller is running" in stderr and "sky-lite controller start" in stderr
    assert controller.started == 0
    assert not (home / "controller.pid").exists()


def test_status_without_services_does_not_warn_about_the_controller(cli: Cli, home: Path) -> None:
    assert "no controller" not in cli("serve", "status")[2]


def test_controller_start_starts_it_in_one_explicit_step(home: Path, tmp_path: Path) -> None:
    add_service(home, tmp_path, "alpha")
    controller = RecordingController(home)
    exit_code, stdout, _ = Cli(controller)("controller", "start")
    assert exit_code == 0
    assert stdout == "Controller started (pid 4242).\n"
    assert controller.started == 1


def test_status_says_unverified_when_the_running_controller_stopped_completing_passes(
        home: Path, tmp_path: Path) -> None:
    """A full disk makes every pass fail before it is recorded: status must not go on claiming READY."""
    add_service(home, tmp_path, "alpha")
    clock = FakeClock()
    store = Store.open(home)
    store.record_pass(clock.now())
    store.close()
    start = procs.process_start_time(os.getpid())
    (home / "controller.pid").write_text(f"{os.getpid()} {start}\n")  # a controller loop runs
    cli = Cli(LocalController(home, clock, start_daemon=False))
    code, stdout, stderr = cli("serve", "status")
    assert code == 0 and "unverified" not in stdout and "has not completed a pass" not in stderr
    clock.advance(45)
    code, stdout, stderr = cli("serve", "status")
    assert code == 0
    assert "(unverified for 45s)" in stdout
    assert "has not completed a pass for 45s" in stderr
    controller = json.loads(cli("serve", "status", "-o", "json")[1])["controller"]
    assert controller["running"] is True and controller["unverified_for_seconds"] == 45


# --- a damaged state.db: one line, exit 1, in seconds ------------------------------------------------------
def _damaged_content(kind: str, tmp_path: Path) -> bytes:
    if kind == "garbage":
        return bytes(range(256)) * 64
    if kind == "empty-not-sqlite":
        return b"\n" * 4096  # blank, but not the 0 bytes SQLite would take for a new database
    real = tmp_path / "real"
    for number in range(20):
        add_service(real, tmp_path, f"svc-{number}")  # each closes its store: the WAL is in the file after
    content = (real / "state.db").read_bytes()
    return content[:len(content) // 2]


@pytest.mark.parametrize(("kind", "args"), [
    pytest.param("garbage", ["serve", "status"], id="garbage-status"),
    pytest.param("truncated", ["serve", "status"], id="truncated-status"),
    pytest.param("empty-not-sqlite", ["serve", "status"], id="empty-not-sqlite-status"),
    pytest.param("garbage", ["serve", "up", "TASK", "--no-wait"], id="garbage-up"),
    pytest.param("truncated", ["serve", "down", "--all", "-y"], id="truncated-down"),
    pytest.param("empty-not-sqlite", ["serve", "history", "svc-1"], id="empty-not-sqlite-history"),
])
def test_a_damaged_database_is_one_line_exit_1_in_seconds(tmp_path: Path, kind: str, args: list[str]) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "state.db").write_bytes(_damaged_content(kind, tmp_path))
    (tmp_path / "task.yaml").write_text(TASK)
    argv = [str(tmp_path / "task.yaml") if arg == "TASK" else arg for arg in args]
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "skyserve_lite", *argv], capture_output=True, text=True,
                            env={**os.environ, "SKY_LITE_HOME": str(home)}, timeout=60)
    assert time.monotonic() - started < 10
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"Error: the state database {home / 'state.db'} is damaged")
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert "sky-lite serve down --all --force" in result.stderr
    assert result.stdout == ""


# --- a state directory other users can write -----------------------------------------------------------------
def test_a_shared_directory_as_home_is_refused_with_exit_2_and_left_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    exit_code, stdout, stderr = Cli(LocalController(shared, start_daemon=False))("serve", "status")
    assert exit_code == 2
    assert stderr.startswith(f"Error: refusing to use {shared} as the state directory: other users can write")
    assert stdout == ""
    assert shared.stat().st_mode & 0o7777 == 0o1777
    assert list(shared.iterdir()) == []


# --- float options: finite numbers only ------------------------------------------------------------------
# (command, the other arguments it needs, the option)
FLOAT_OPTIONS = [
    (("serve", "up"), ("task.yaml",), "--timeout"),
    (("serve", "simulate"), ("task.yaml", "--trace", "trace.csv"), "--period"),
    (("serve", "down"), ("--all", "-y"), "--timeout"),
    (("serve", "update"), ("svc", "task.yaml", "-y"), "--timeout"),
    (("serve", "rollback"), ("svc", "-y"), "--timeout"),
    (("serve", "wait"), ("svc",), "--timeout"),
    (("controller", "down"), ("-y", "--force"), "--timeout"),
    (("controller", "run"), (), "--interval"),
]


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
@pytest.mark.parametrize(("command", "others", "option"), FLOAT_OPTIONS,
                         ids=[" ".join((*command, option)) for command, _, option in FLOAT_OPTIONS])
def test_float_options_refuse_nan_and_infinities(cli: Cli, home: Path, command: tuple[str, ...],
                                                 others: tuple[str, ...], option: str, value: str) -> None:
    exit_code, stdout, stderr = cli(*command, *others, option, value)
    assert exit_code == 2
    assert f"Invalid value for '{option}': '{value}' is not a finite number." in stderr
    assert stdout == ""
    assert not home.exists()


def test_every_float_option_is_in_the_table_and_uses_the_finite_type() -> None:
    def walk(command: click.Command, path: tuple[str, ...]) -> dict[tuple[tuple[str, ...], str], object]:
        found: dict[tuple[tuple[str, ...], str], object] = {
            (path, max(param.opts, key=len)): param.type for param in command.params
                 if isinstance(param.type, click.types.FloatParamType)}
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                found |= walk(sub, (*path, name))
        return found

    found = walk(main, ())
    assert set(found) == {(command, option) for command, _, option in FLOAT_OPTIONS}
    assert all(isinstance(kind, FiniteFloatRange) for kind in found.values())

