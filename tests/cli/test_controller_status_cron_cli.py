"""`controller status` says whether a cron daemon runs to run the cron lines, as the host answers it over the
protocol (``describe``, here through the in-process transport), and what a host says is also its controller
id (what a controller VM's grants are scoped to)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.host_commands import describe_cron
from skyserve_lite.cli.main import main
from skyserve_lite.controller.cron import is_cron_daemon_running
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.transport import InProcessTransport
from skyserve_lite.state.store import Store
from tests.controller.fake_crontab import install_fake_crontab


@pytest.mark.parametrize(("installed", "running", "said"), [
    (True, True, "installed; the cron daemon runs"),
    (True, False, "installed, but no cron daemon runs: nothing restarts the loop if it stops (start cron; Debian "
                  "and Ubuntu: `sudo systemctl enable --now cron`)"),
    (True, None, "installed (cron daemon: unknown)"),
    (False, False, "not installed; no cron daemon runs"),
    (None, True, "unknown (crontab not readable); the cron daemon runs"),
])
def test_describe_cron(installed: bool | None, running: bool | None, said: str) -> None:
    assert describe_cron(installed, running) == said


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RemoteController:
    install_fake_crontab(tmp_path, monkeypatch)
    home = tmp_path / "host-home"
    Store.open(home).close()
    return RemoteController(InProcessTransport(home))


def test_status_says_whether_the_host_runs_a_cron_daemon(host: RemoteController) -> None:
    running = is_cron_daemon_running()  # the host is this machine
    result = CliRunner().invoke(main, ["controller", "status"], obj=host)
    assert result.exit_code == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("Cron lines:")]
    assert line == f"Cron lines: {describe_cron(False, running)}"
    result = CliRunner().invoke(main, ["controller", "status", "-o", "json"], obj=host)
    document = json.loads(result.stdout)
    assert (document["cron_installed"], document["cron_running"]) == (False, running)


def test_the_host_says_its_controller_id(host: RemoteController, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "host-home")
    try:
        assert host.describe().controller_id == store.controller_id
    finally:
        store.close()
