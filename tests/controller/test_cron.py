"""The cron block: rendered lines, merged into and removed from a crontab, and run as cron runs them."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyserve_lite.controller.cron import (
    ENSURE_LOCK_FILE,
    CronChange,
    begin_marker,
    end_marker,
    ensure_supervised,
    install_cron,
    merge_crontab,
    remove_from_crontab,
    render_cron_lines,
    uninstall_cron,
)
from skyserve_lite.controller.daemon import controller_log_path, stop_controller
from skyserve_lite.controller.pidfile import find_controller
from skyserve_lite.errors import ControllerError, UsageError
from tests.controller.fake_crontab import install_fake_crontab

A = Path("/home/me/.sky-lite")
B = Path("/home/me/.sky-lite/b")  # its marker starts like A's: the match must be the whole line
SKY_LITE = Path("/opt/sky lite/bin/sky-lite")


def block(home: Path, tag: str = "") -> str:
    return "".join(line + "\n" for line in lines_of(home, tag))


def lines_of(home: Path, tag: str = "") -> list[str]:
    return render_cron_lines(SKY_LITE, home, home / "logs" / f"controller{tag}.log")


OTHER = "MAILTO=me\n# my backups\n0 3 * * * /usr/bin/backup --all\n"


def test_rendered_lines_quote_every_path_and_set_the_home() -> None:
    home = Path("/srv/my home")
    lines = render_cron_lines(SKY_LITE, home, home / "logs" / "controller.log")
    command = ("SKY_LITE_HOME='/srv/my home' '/opt/sky lite/bin/sky-lite' controller ensure "
               ">> '/srv/my home/logs/controller.log' 2>&1")
    assert lines == [begin_marker(home), f"@reboot {command}", f"* * * * * {command}", end_marker(home)]
    assert lines[0] == "# BEGIN sky-lite controller ensure (/srv/my home)"
    assert lines[-1] == "# END sky-lite controller ensure (/srv/my home)"


def test_an_interpreter_runs_the_package_as_a_module() -> None:
    lines = render_cron_lines(Path("/venv/bin/python3"), A, A / "c.log")
    assert "/venv/bin/python3 -m skyserve_lite controller ensure" in lines[1]


@pytest.mark.parametrize("executable, home", [
    (Path("sky-lite"), A),
    (SKY_LITE, Path("/tmp/100%")),
    (SKY_LITE, Path("/tmp/a\nb")),
])
def test_paths_cron_cannot_run_are_refused(executable: Path, home: Path) -> None:
    with pytest.raises(UsageError):
        render_cron_lines(executable, home, Path("/tmp/c.log"))


@pytest.mark.parametrize("current, expected", [
    pytest.param("", block(A), id="empty crontab"),
    pytest.param(OTHER, OTHER + block(A), id="other entries kept"),
    pytest.param(OTHER + block(A, "-old") + "5 * * * * /bin/true\n", OTHER + block(A) + "5 * * * * /bin/true\n",
                 id="existing block replaced in place"),
    pytest.param(block(B) + OTHER, block(B) + OTHER + block(A), id="another home's block independent"),
    pytest.param("0 3 * * * /usr/bin/backup", "0 3 * * * /usr/bin/backup\n" + block(A),
                 id="no trailing newline"),
    pytest.param(OTHER + block(A), OTHER + block(A), id="same block: unchanged"),
])
def test_merge(current: str, expected: str) -> None:
    assert merge_crontab(current, lines_of(A)) == expected


@pytest.mark.parametrize("current, expected", [
    pytest.param("", "", id="empty crontab"),
    pytest.param(OTHER, OTHER, id="no block: unchanged"),
    pytest.param(OTHER + block(A) + "5 * * * * /bin/true", OTHER + "5 * * * * /bin/true",
                 id="the rest unchanged, no trailing newline kept"),
    pytest.param(block(B) + block(A) + OTHER, block(B) + OTHER, id="another home's block kept"),
    pytest.param(block(A), "", id="only the block"),
])
def test_remove(current: str, expected: str) -> None:
    assert remove_from_crontab(current, A) == expected


def test_a_begin_without_its_end_is_refused_rather_than_guessed() -> None:
    with pytest.raises(ControllerError, match="crontab -e"):
        remove_from_crontab(OTHER + begin_marker(A) + "\n" + OTHER, A)


@pytest.fixture
def fake_crontab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_crontab(tmp_path, monkeypatch)


def test_install_and_uninstall_through_crontab(tmp_path: Path, fake_crontab: Path) -> None:
    home = tmp_path / "home"
    change, lines = install_cron(home, executable=SKY_LITE)
    assert change is CronChange.ADDED
    assert fake_crontab.read_text() == "".join(line + "\n" for line in lines)
    assert (home / "logs").is_dir()  # the lines' `>>` target can be created
    assert install_cron(home, executable=SKY_LITE)[0] is CronChange.UNCHANGED
    assert install_cron(home, executable=Path("/other/sky-lite"))[0] is CronChange.REPLACED

    fake_crontab.write_text(OTHER + fake_crontab.read_text())
    assert uninstall_cron(home) is CronChange.REMOVED
    assert fake_crontab.read_text() == OTHER
    assert uninstall_cron(home) is CronChange.ABSENT
    assert fake_crontab.read_text() == OTHER


def test_a_missing_crontab_command_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # holds no crontab
    with pytest.raises(ControllerError, match="`crontab` was not found on PATH; install cron"):
        uninstall_cron(tmp_path / "home")


def test_ensure_does_nothing_while_another_ensure_holds_its_lock(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    fd = os.open(home / ENSURE_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert ensure_supervised(home, timeout_seconds=1) is None
    finally:
        os.close(fd)
    assert find_controller(home) is None
    assert not (home / "logs").exists()  # nothing was spawned


def test_ensure_refuses_a_deleted_home(tmp_path: Path) -> None:
    with pytest.raises(ControllerError, match="does not exist; remove its cron lines"):
        ensure_supervised(tmp_path / "gone")
    assert not (tmp_path / "gone").exists()


def test_the_minute_line_starts_the_controller_in_crons_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True, mode=0o700)  # as `controller cron install` leaves it
    log = controller_log_path(home)
    script = Path(sys.executable).parent / "sky-lite"
    minute_line = render_cron_lines(script, home, log)[2]
    assert minute_line.startswith("* * * * * ")
    command = minute_line.removeprefix("* * * * * ")
    try:
        for _ in range(2):  # the second run finds it running and does nothing
            subprocess.run(["env", "-i", "/bin/sh", "-c", command], check=True, timeout=60)
        running = find_controller(home)
        assert running is not None
        assert log.read_text().count("controller ensure: started the controller") == 1
    finally:
        stop_controller(home)
    assert find_controller(home) is None
