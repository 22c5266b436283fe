"""A read-only state directory: every command that reads answers as usual, every command that writes fails
with one line naming the directory, and none ends in a traceback.

The home is made read-only for real: each command runs in a mount namespace of its own (``unshare``) where
the directory is bind-mounted over itself read-only. Root ignores permission bits, so a ``chmod`` would not
stop the writes these tests run as root in CI; a read-only mount stops root too (``EROFS``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.spec.parse import load_task_file

# Mounts "$1" read-only over itself in this (private) mount namespace, then runs the rest of the arguments.
READ_ONLY_MOUNT = ('mount --make-rprivate / && mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" '
                   '&& shift && exec "$@"')

TASK_V1 = "service:\n  replicas: 1\nrun: echo one\n"
TASK_V2 = "service:\n  replicas: 1\nrun: echo two\n"
REPLICA_LINE = "2026-12-01T17:30:00.000Z replica 1 says hello\n"
CONTROLLER_LINE = "2026-12-01T17:30:00.000Z controller pass 1\n"


def namespace_prefix() -> list[str]:
    """``unshare`` with a mount namespace; a user namespace too when not root (mounting needs it)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: a read-only mount cannot be made here")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--mount", "sh", "-c", READ_ONLY_MOUNT, "read-only-mount"]


def run_read_only(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKY_LITE_HOME": str(home), "COLUMNS": "200"}
    env.pop("SKY_LITE_CONTROLLER", None)
    return subprocess.run([*namespace_prefix(), str(home), sys.executable, "-m", "skyserve_lite", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a home holding service web (versions 1 and 2, a replica log, a controller log) and
    the task files the commands name."""
    root = tmp_path_factory.mktemp("read-only")
    home = root / "home"
    (root / "v1.yaml").write_text(TASK_V1)
    (root / "v2.yaml").write_text(TASK_V2)
    controller = LocalController(home, FakeClock(1_796_146_200.0), start_daemon=False)
    controller.create_service("web", load_task_file(root / "v1.yaml"))
    controller.submit_update("web", load_task_file(root / "v2.yaml"), UpdateMode.ROLLING)
    replica_log = home / "replicas" / "web" / "1-abc" / "replica.log"
    replica_log.parent.mkdir(parents=True)
    replica_log.write_text(REPLICA_LINE)
    (home / "logs").mkdir(exist_ok=True)
    (home / "logs" / "controller.log").write_text(CONTROLLER_LINE)
    probe = run_read_only(home, root, "--version")
    if probe.returncode != 0:
        pytest.skip(f"no read-only mount could be made here: {probe.stderr.strip()}")
    return root


def test_the_mount_is_read_only_even_to_this_user(workspace: Path) -> None:
    home = workspace / "home"
    result = subprocess.run([*namespace_prefix(), str(home), "touch", str(home / "probe")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "Read-only file system" in result.stderr
    assert not (home / "probe").exists()


@pytest.mark.parametrize(("args", "shown"), [
    pytest.param(["serve", "status"], "web", id="status"),
    pytest.param(["serve", "status", "web"], "version 2 submitted", id="status-name"),
    pytest.param(["serve", "history", "web"], "initial version", id="history"),
    pytest.param(["serve", "update", "web", "v1.yaml", "--dry-run"], "launch 1", id="update-dry-run"),
    pytest.param(["serve", "rollback", "web", "--dry-run"], "launch 1", id="rollback-dry-run"),
    pytest.param(["serve", "logs", "web", "1", "--no-follow"], REPLICA_LINE, id="logs-replica"),
    pytest.param(["serve", "logs", "web", "--controller", "--no-follow"], CONTROLLER_LINE, id="logs-controller"),
    pytest.param(["controller", "status"], "Services:   web", id="controller-status"),
])
def test_reads_answer_from_a_read_only_home(workspace: Path, args: list[str], shown: str) -> None:
    result = run_read_only(workspace / "home", workspace, *args)
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stderr
    assert shown in result.stdout


def test_status_json_from_a_read_only_home(workspace: Path) -> None:
    result = run_read_only(workspace / "home", workspace, "serve", "status", "-o", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert [(s["name"], s["version"]) for s in services] == [("web", 2)]


@pytest.mark.parametrize("args", [
    pytest.param(["serve", "up", "v1.yaml", "-n", "other", "--no-wait"], id="up"),
    pytest.param(["serve", "update", "web", "v1.yaml", "-y", "--no-wait"], id="update"),
    pytest.param(["serve", "rollback", "web", "-y", "--no-wait"], id="rollback"),
    pytest.param(["serve", "down", "web", "-y"], id="down"),
    pytest.param(["controller", "tick"], id="controller-tick"),
    pytest.param(["config", "set", "default_infra", "local"], id="config-set"),
])
def test_writes_to_a_read_only_home_fail_with_one_line_naming_it(workspace: Path, args: list[str]) -> None:
    home = workspace / "home"
    result = run_read_only(home, workspace, *args)

    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if not line.startswith("Warning:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and f"{home} is read-only" in lines[0]
