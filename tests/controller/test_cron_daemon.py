"""Whether a cron daemon runs to run the cron lines: told from a process listing (a table of names), read
from /proc (a made-up one, and this machine's own with a process that calls itself crond)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from skyserve_lite.controller.cron import ProcessName, find_cron_daemon, is_cron_daemon_running, list_processes

PROC = Path("/proc")


@pytest.mark.parametrize(("comm", "argv", "is_cron"), [
    ("cron", ("/usr/sbin/cron", "-f"), True),  # Debian, Ubuntu
    ("crond", ("/usr/sbin/crond", "-n"), True),  # cronie (Fedora, RHEL), dcron
    ("crond", ("crond", "-f", "-l", "8"), True),  # BusyBox through its crond link (Alpine)
    ("busybox", ("/bin/busybox", "crond", "-f"), True),  # BusyBox called by its own name
    ("toybox", ("toybox", "crond"), True),
    ("fcron", ("/usr/sbin/fcron",), True),
    ("bcron-sched", ("bcron-sched",), True),
    ("sleep", ("crond",), True),  # a process started as crond: its first argument names it
    ("anacron", ("/usr/sbin/anacron", "-d"), False),  # daily jobs only: no minute lines
    ("busybox", ("/bin/busybox", "sh"), False),
    ("crontab", ("crontab", "-e"), False),  # the editor, not the daemon
    ("python3", ("python3", "-m", "crond"), False),
    ("bash", (), False),  # a kernel thread or a zombie: no arguments
])
def test_which_processes_are_cron_daemons(comm: str, argv: tuple[str, ...], is_cron: bool) -> None:
    found = find_cron_daemon([ProcessName(1, "systemd", ("/sbin/init",)), ProcessName(42, comm, argv)])
    assert found == (42 if is_cron else None)


def _fake_proc(root: Path, processes: dict[int, tuple[str, bytes]]) -> Path:
    for pid, (comm, cmdline) in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "cmdline").write_bytes(cmdline)
    (root / "self").mkdir()  # not a pid: skipped
    return root


def test_a_proc_tree_with_a_cron_daemon(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {1: ("init", b"/sbin/init\0"), 311: ("cron", b"/usr/sbin/cron\0-f\0")})
    assert list_processes(proc) == [ProcessName(1, "init", ("/sbin/init",)),
                                    ProcessName(311, "cron", ("/usr/sbin/cron", "-f"))]
    assert is_cron_daemon_running(proc) is True


def test_a_container_without_one(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {1: ("python3", b"python3\0-m\0skyserve_lite\0"), 7: ("sshd", b"sshd: /usr/sbin\0")})
    assert is_cron_daemon_running(proc) is False


def test_without_a_visible_pid_1_nothing_can_be_told(tmp_path: Path) -> None:
    # No /proc at all (macOS), or one mounted with hidepid: a daemon of another user would not show.
    assert is_cron_daemon_running(tmp_path / "missing") is None
    assert is_cron_daemon_running(_fake_proc(tmp_path / "hidden", {4242: ("bash", b"bash\0")})) is None


@pytest.mark.skipif(not (PROC / "1").is_dir(), reason="needs a Linux /proc")
def test_this_machine_proc_shows_a_process_started_as_crond() -> None:
    process = subprocess.Popen(["bash", "-c", "exec -a crond sleep 60"])
    try:
        daemons: set[int] = set()
        for _ in range(100):  # until bash has exec'd
            daemons = {p.pid for p in list_processes(PROC) or [] if find_cron_daemon([p]) is not None}
            if process.pid in daemons:
                break
            time.sleep(0.05)
        assert process.pid in daemons
        assert is_cron_daemon_running() is True
    finally:
        process.kill()
        process.wait()
