"""Cron as the controller loop's supervisor: an `@reboot` line and a once-a-minute line running
`sky-lite controller ensure`, between marker comments that name the state directory.

``render_cron_lines``, ``merge_crontab`` and ``remove_from_crontab`` are pure (text in, text out);
``install_cron`` and ``uninstall_cron`` apply them to the user's crontab through the ``crontab`` command, and
``ensure_supervised`` is what the lines run.

Lines in a crontab run only if a cron daemon does: containers and minimal images often have ``crontab`` and
no daemon. ``find_cron_daemon`` tells one from a process listing (pure), ``is_cron_daemon_running`` reads
that listing from ``/proc`` (through ``procs.read_process_table``, the one walker of ``/proc``).
"""

from __future__ import annotations

import enum
import fcntl
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite import procs
from skyserve_lite.controller.daemon import controller_log_path, ensure_controller
from skyserve_lite.controller.pidfile import find_controller
from skyserve_lite.errors import ControllerError, UsageError
from skyserve_lite.state.store import prepare_home

ENSURE_LOCK_FILE = "ensure.lock"
SCRIPT_NAME = "sky-lite"
# The daemons that run users' crontabs: Vixie cron and Debian's `cron`, cronie's, dcron's and BusyBox's
# `crond`, fcron, bcron's scheduler. (anacron runs daily jobs only, not the minute lines.)
CRON_DAEMONS = frozenset({"cron", "crond", "fcron", "bcron-sched"})
MULTICALL_BINARIES = frozenset({"busybox", "toybox"})  # `busybox crond`: the applet is the first argument


class CronChange(enum.Enum):
    """What ``install_cron`` / ``uninstall_cron`` did to the crontab."""

    ADDED = "added"
    REPLACED = "replaced"
    UNCHANGED = "unchanged"  # the same lines were installed already: nothing written
    REMOVED = "removed"
    ABSENT = "absent"  # there was nothing to remove: nothing written


def begin_marker(home: Path) -> str:
    return f"# BEGIN sky-lite controller ensure ({home})"


def end_marker(home: Path) -> str:
    return f"# END sky-lite controller ensure ({home})"


def find_executable() -> Path:
    """The ``sky-lite`` script beside the running interpreter (a virtual environment's bin/), else the
    interpreter itself. Absolute but not resolved: resolving a venv's python symlink would leave the venv."""
    interpreter = Path(sys.executable).absolute()
    script = interpreter.parent / SCRIPT_NAME
    return script if script.is_file() and os.access(script, os.X_OK) else interpreter


def render_cron_lines(executable: Path, home: Path, log: Path) -> list[str]:
    """The marked block for ``home``: BEGIN marker, `@reboot` line, `* * * * *` line, END marker.

    ``executable`` is a ``sky-lite`` script, or else a Python interpreter (run with ``-m skyserve_lite``).
    Cron gives no PATH and no HOME, so every path is absolute and ``SKY_LITE_HOME`` is set on the line.
    Raises ``UsageError`` for a relative path, or one with a newline or ``%`` (cron turns ``%`` into a
    newline, and shell quoting cannot protect it).
    """
    for path in (executable, home, log):
        if not path.is_absolute():
            raise UsageError(f"cron lines need absolute paths, not {path}")
        if "\n" in str(path) or "%" in str(path):
            raise UsageError(f"cron cannot run a path with a newline or '%' in it: {str(path)!r}")
    argv = [str(executable)] if executable.name == SCRIPT_NAME else [str(executable), "-m", "skyserve_lite"]
    command = (f"SKY_LITE_HOME={shlex.quote(str(home))} {shlex.join([*argv, 'controller', 'ensure'])} "
               f">> {shlex.quote(str(log))} 2>&1")
    return [begin_marker(home), f"@reboot {command}", f"* * * * * {command}", end_marker(home)]


def merge_crontab(current: str, lines: Sequence[str]) -> str:
    """``current`` with the block ``lines`` (as rendered, markers first and last) in place of the block of
    the same BEGIN marker, else appended. Everything else is kept byte for byte, except that a last line
    without its newline gets one before an appended block."""
    kept, position = _without_block(current, lines[0], lines[-1])
    block = "".join(line + "\n" for line in lines)
    if position is None:
        if kept and not kept.endswith("\n"):
            kept += "\n"
        return kept + block
    return kept[:position] + block + kept[position:]


def remove_from_crontab(current: str, home: Path) -> str:
    """``current`` without the block of ``home``; everything else byte for byte. No block: unchanged."""
    return _without_block(current, begin_marker(home), end_marker(home))[0]


def _without_block(current: str, begin: str, end: str) -> tuple[str, int | None]:
    """``current`` without every block from ``begin`` to ``end``, and the offset where the first one was.
    A BEGIN without its END raises ``ControllerError``: guessing where the block ends could drop the
    user's own lines."""
    kept: list[str] = []
    position: int | None = None
    inside = False
    offset = 0
    for line in current.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        if not inside and bare == begin:
            inside = True
            position = offset if position is None else position
        elif inside:
            inside = bare != end
        else:
            kept.append(line)
            offset += len(line)
    if inside:
        raise ControllerError(f"the crontab has the line {begin!r} but not {end!r} after it; "
                              "fix it with `crontab -e`")
    return "".join(kept), position


def install_cron(home: Path, executable: Path | None = None, log: Path | None = None,
                 crontab: str = "crontab") -> tuple[CronChange, list[str]]:
    """Put the block of ``home`` in the user's crontab (idempotent: the same lines are not written again);
    return what changed and the lines. Creates ``home`` and its log directory, since a cron line whose
    ``>>`` target cannot be created runs nothing. Raises ``ControllerError`` if ``crontab`` fails."""
    prepare_home(home)
    log = log or controller_log_path(home)
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = render_cron_lines(executable or find_executable(), home, log)
    current = read_crontab(crontab)
    merged = merge_crontab(current, lines)
    if merged == current:
        return CronChange.UNCHANGED, lines
    had_block = remove_from_crontab(current, home) != current
    write_crontab(merged, crontab)
    return (CronChange.REPLACED if had_block else CronChange.ADDED), lines


def uninstall_cron(home: Path, crontab: str = "crontab") -> CronChange:
    """Remove exactly the block of ``home`` from the user's crontab; ``ABSENT`` (nothing written) if none."""
    current = read_crontab(crontab)
    remaining = remove_from_crontab(current, home)
    if remaining == current:
        return CronChange.ABSENT
    write_crontab(remaining, crontab)
    return CronChange.REMOVED


def is_cron_installed(home: Path, crontab: str = "crontab") -> bool | None:
    """Whether the user's crontab holds the block of ``home``; None when the crontab cannot be read."""
    try:
        current = read_crontab(crontab)
    except ControllerError:
        return None
    return begin_marker(home) in current.splitlines()


def read_crontab(crontab: str = "crontab") -> str:
    """``crontab -l``; a user without a crontab (exit 1, "no crontab for USER") has an empty one."""
    result = _run_crontab([crontab, "-l"], None)
    if result.returncode == 0:
        return result.stdout
    if result.returncode == 1 and "no crontab" in result.stderr.lower():
        return ""
    raise ControllerError(f"`{crontab} -l` failed (exit {result.returncode}): {result.stderr.strip()}")


def write_crontab(text: str, crontab: str = "crontab") -> None:
    """Replace the user's crontab with ``text`` (``crontab -`` reading stdin)."""
    result = _run_crontab([crontab, "-"], text)
    if result.returncode != 0:
        raise ControllerError(f"`{crontab} -` failed (exit {result.returncode}): {result.stderr.strip()}")


def _run_crontab(argv: list[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        raise ControllerError(f"`{argv[0]}` was not found on PATH; install cron (on Debian and Ubuntu: "
                              "`apt-get install cron`) to keep the controller running") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ControllerError(f"`{shlex.join(argv)}` could not be run: {exc}") from exc


def ensure_supervised(home: Path, timeout_seconds: float = 15.0) -> int | None:
    """What the cron lines run: start the controller loop of ``home`` if none runs. Returns the pid of the
    loop it started, None if it did nothing.

    Cheap when all is well: a running loop is seen from its pid file, with no lock, store or spawn. Cron's
    `@reboot` and minute lines can fire together, so the start is under ``ensure.lock`` (not the
    controller's lock, which the loop holds for its whole life): an ensure that finds it held returns None
    at once, since the holder is starting the loop. A missing ``home`` raises ``ControllerError`` rather
    than being made again (it was deleted: the cron lines are stale); ``ensure_controller``'s errors pass.
    """
    if find_controller(home) is not None:
        return None
    if not home.is_dir():
        raise ControllerError(f"the state directory {home} does not exist; remove its cron lines with "
                              f"`SKY_LITE_HOME={shlex.quote(str(home))} sky-lite controller cron remove`")
    prepare_home(home)  # refuses a directory others can write, as every command does
    fd = os.open(home / ENSURE_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if find_controller(home) is not None:  # started while we took the lock
            return None
        return ensure_controller(home, timeout_seconds)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ProcessName:
    """What a process listing says of one process: its pid, the kernel's name of it (``/proc/PID/comm``, the
    executable's file name cut to 15 characters) and its arguments."""

    pid: int
    comm: str
    argv: tuple[str, ...] = ()


def find_cron_daemon(processes: Iterable[ProcessName]) -> int | None:
    """The pid of a cron daemon among ``processes`` (by its executable's name, its first argument's file name,
    or a multi-call binary's applet), None when none is one."""
    for process in processes:
        names = {process.comm}
        if process.argv:
            names.add(os.path.basename(process.argv[0]))
        if names & MULTICALL_BINARIES and len(process.argv) > 1:
            names.add(os.path.basename(process.argv[1]))
        if names & CRON_DAEMONS:
            return process.pid
    return None


def list_processes(proc: Path = Path("/proc")) -> list[ProcessName] | None:
    """Every process ``proc`` shows, by pid; None when it cannot be read, or shows no pid 1 (no /proc at all, or one
    mounted with ``hidepid`` that hides other users' processes: then the daemon may run unseen). A process
    that ends while it is read is left out."""
    if not (proc / "1").is_dir():
        return None
    return procs.read_process_table(_read_name, proc)


def _read_name(entry: Path) -> ProcessName | None:
    try:
        comm = (entry / "comm").read_text(errors="replace").strip()
        argv = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None  # ended while it was read
    return ProcessName(int(entry.name), comm, tuple(a.decode(errors="replace") for a in argv if a))


def is_cron_daemon_running(proc: Path = Path("/proc")) -> bool | None:
    """Whether a cron daemon runs here (``find_cron_daemon`` over ``list_processes``); None when this cannot
    be told."""
    processes = list_processes(proc)
    return None if processes is None else find_cron_daemon(processes) is not None
