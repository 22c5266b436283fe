"""`controller ensure` and `controller cron install/remove` through the CLI, with a fake crontab on PATH."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.main import main
from skyserve_lite.controller.cron import ENSURE_LOCK_FILE, begin_marker
from skyserve_lite.controller.loop import run_loop
from skyserve_lite.controller.pidfile import find_controller
from skyserve_lite.controller.settings import ControllerSettings
from tests.controller.fake_crontab import install_fake_crontab


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKY_LITE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_cron_install_then_remove(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = install_fake_crontab(tmp_path, monkeypatch)
    table.write_text("0 3 * * * /usr/bin/backup\n")

    code, out, err = cli("controller", "cron", "install")
    assert (code, err) == (0, "")
    assert out.startswith(f"Added the cron lines for {home} to your crontab:\n")
    assert f"  {begin_marker(home)}\n" in out
    installed = table.read_text()
    assert installed.startswith("0 3 * * * /usr/bin/backup\n")
    assert "@reboot " in installed and f"* * * * * SKY_LITE_HOME={home} " in installed
    assert "controller ensure >> " in installed

    code, out, _ = cli("controller", "cron", "install")
    assert code == 0 and out.startswith(f"The cron lines for {home} were installed already:")
    assert table.read_text() == installed

    assert cli("controller", "cron", "remove") == (
        0, f"Removed the cron lines for {home} from your crontab.\n", "")
    assert table.read_text() == "0 3 * * * /usr/bin/backup\n"
    assert cli("controller", "cron", "remove") == (
        0, f"No cron lines for {home} in your crontab; nothing to remove.\n", "")


def test_cron_without_crontab_exits_1(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out, err = cli("controller", "cron", "remove")
    assert (code, out) == (1, "")
    assert err.startswith("Error: `crontab` was not found on PATH; install cron")


def test_ensure_is_silent_while_a_controller_runs(home: Path) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=run_loop, args=(home, ControllerSettings(interval_seconds=0.05), stop))
    thread.start()
    try:
        for _ in range(200):
            if find_controller(home) is not None:
                break
            stop.wait(0.05)
        assert cli("controller", "ensure") == (0, "", "")
        assert not (home / ENSURE_LOCK_FILE).exists()  # all well: not even the lock file is written
    finally:
        stop.set()
        thread.join(timeout=30)


def test_ensure_exits_0_at_once_while_another_ensure_starts_one(home: Path) -> None:
    home.mkdir(mode=0o700)
    fd = os.open(home / ENSURE_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert cli("controller", "ensure") == (0, "", "")
    finally:
        os.close(fd)
    assert find_controller(home) is None


def test_ensure_of_a_deleted_home_exits_1(home: Path) -> None:
    code, out, err = cli("controller", "ensure")
    assert (code, out) == (1, "")
    assert err.startswith(f"Error: the state directory {home} does not exist; remove its cron lines")
