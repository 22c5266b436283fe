"""Process helpers shared by the local provider, its replica supervisor, the load balancer runner, the
controller daemon and `serve down --force`.

Linux first: liveness reads ``/proc/PID/stat`` so that a zombie counts as dead and a reused pid is told
apart from the process we started (by its start time). Elsewhere it falls back to ``kill(pid, 0)``, and
the process table (``list_processes``, ``read_environ``, ``read_cmdline``) is empty: what is found only
through it (escaped descendants, processes tagged by an earlier controller) is not found there. Every walk of
``/proc`` goes through ``read_process_table``, whatever it reads of each process (``controller.cron`` reads
names).

Imports nothing but the standard library: the replica supervisor runs with a replica's bare environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from skyserve_lite.netaddr import family_of

PROC = Path("/proc")
_Read = TypeVar("_Read")


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks, or None if it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return _fallback_alive(pid)
    fields = _stat_fields(stat)
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _stat_fields(stat: str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name, from the state (field 3) on."""
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    return stat[stat.rindex(")") + 2:].split()


def _fallback_alive(pid: int) -> int | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return 0
    return 0


def is_alive(pid: int, start_time: int | None = None) -> bool:
    """True if ``pid`` runs and (when given) is the process that started at ``start_time``."""
    current = process_start_time(pid)
    if current is None:
        return False
    return start_time is None or current == start_time


@dataclass(frozen=True)
class RecordedProcess:
    """A process as a pid file records it (``controller.pid``, a replica's ``pid``): its pid and the kernel's
    start time of it, ``PID START`` on one line, so that a pid that another process took after this one
    ended is not taken for it. ``start_time`` is None in a file written without one (by an older sky-lite,
    or where there is no ``/proc``): then only the pid can be checked."""

    pid: int
    start_time: int | None

    @classmethod
    def of(cls, pid: int) -> RecordedProcess:
        """``pid`` as it runs now, to be recorded (by the process itself, as its first act)."""
        return cls(pid, process_start_time(pid))

    def to_text(self) -> str:
        return f"{self.pid} {'' if self.start_time is None else self.start_time}".strip() + "\n"

    @classmethod
    def parse(cls, text: str) -> RecordedProcess | None:
        fields = text.split()
        try:
            return cls(int(fields[0]), int(fields[1]) if len(fields) > 1 else None)
        except (IndexError, ValueError):
            return None

    def is_alive(self) -> bool:
        """Whether the recorded process still runs: that pid, started at that time (when recorded)."""
        return is_alive(self.pid, self.start_time)


def read_pid_file(path: Path) -> RecordedProcess | None:
    """What ``path`` records, alive or not; None when there is no such file or it holds no pid (a reader
    never sees a half-written one: ``write_pid_file`` renames it into place)."""
    try:
        return RecordedProcess.parse(path.read_text())
    except (OSError, UnicodeDecodeError):
        return None


def write_pid_file(path: Path, process: RecordedProcess) -> None:
    """Write ``process`` to ``path`` atomically (through ``NAME.tmp`` beside it)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(process.to_text())
    os.replace(temporary, path)


def spawn_detached(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path
                   ) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its own process group), output appended to ``log_path``.

    The caller keeps the ``Popen`` to reap the child when it exits; the process outlives the caller.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)  # a log an older version created 0644
    with open(fd, "ab") as log:
        return subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )


def terminate_groups(pgids: Sequence[int], grace_seconds: float = 5.0) -> None:
    """SIGTERM each process group, wait up to ``grace_seconds`` for all, then SIGKILL what is left.

    Idempotent: groups that are gone already are skipped.
    """
    pending = [pgid for pgid in pgids if _signal_group(pgid, signal.SIGTERM)]
    deadline = time.monotonic() + grace_seconds
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [pgid for pgid in pending if _group_alive(pgid)]
    for pgid in pending:
        _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, signum: signal.Signals) -> bool:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process of the group remains."""
    processes = read_process_table(_read_process)
    if processes is None:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return any(process.pgid == pgid for process in processes)


@dataclass(frozen=True)
class ProcessInfo:
    """One live process as the process table shows it; ``start_time`` tells it apart from a later process
    that reuses its pid."""

    pid: int
    ppid: int
    pgid: int
    start_time: int


def read_process_table(read: Callable[[Path], _Read | None], proc: Path = PROC) -> list[_Read] | None:
    """``read`` of each process directory of ``proc`` (``proc/PID``), by pid, leaving out the processes it
    gives None for (one that ended while it was read, or that the reader skips); None when ``proc`` cannot be
    listed (no ``/proc``: not Linux)."""
    try:
        entries = sorted((entry for entry in proc.iterdir() if entry.name.isdigit()), key=lambda e: int(e.name))
    except OSError:
        return None
    found = []
    for entry in entries:
        item = read(entry)
        if item is not None:
            found.append(item)
    return found


def list_processes(proc: Path = PROC) -> list[ProcessInfo]:
    """Every live process of this machine (zombies excluded), by pid, from ``proc``; empty without it."""
    return read_process_table(_read_process, proc) or []


def find_process(pid: int) -> ProcessInfo | None:
    """``pid`` as the process table shows it, or None when it is gone, a zombie, or there is no ``/proc``."""
    return _read_process(Path(f"/proc/{pid}"))


def _read_process(entry: Path) -> ProcessInfo | None:
    try:
        fields = _stat_fields((entry / "stat").read_text())
    except (OSError, ValueError):
        return None  # exited meanwhile
    if fields[0] in ("Z", "X"):
        return None
    return ProcessInfo(pid=int(entry.name), ppid=int(fields[1]), pgid=int(fields[2]), start_time=int(fields[19]))


def read_environ(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` was started with (``/proc/PID/environ``); None when it cannot be read: gone,
    another user's, or no ``/proc``."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    environ = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            environ[name.decode(errors="replace")] = value.decode(errors="replace")
    return environ


def read_cmdline(pid: int) -> list[str] | None:
    """The argv of ``pid``; None when it cannot be read (gone, a kernel thread, no ``/proc``)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1]] if raw else None


def find_descendants(pid: int, processes: Collection[ProcessInfo]) -> list[ProcessInfo]:
    """Every process below ``pid`` in the parent tree of ``processes`` (children, theirs, and so on)."""
    children: dict[int, list[ProcessInfo]] = {}
    for process in processes:
        children.setdefault(process.ppid, []).append(process)
    found: list[ProcessInfo] = []
    seen = {pid}
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), ()):
            if child.pid not in seen:
                seen.add(child.pid)
                found.append(child)
                pending.append(child.pid)
    return found


def signal_process(process: ProcessInfo, signum: signal.Signals) -> bool:
    """Send ``signum`` to ``process`` if that very process still runs (not a later one with its pid); True
    if it was sent. Through a pidfd where the kernel has them, so the pid cannot be reused between the
    check and the kill."""
    try:
        fd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd here: check, then kill (a tiny window for a reused pid)
        return is_alive(process.pid, process.start_time) and _kill(process.pid, signum)
    try:
        if not is_alive(process.pid, process.start_time):
            return False
        signal.pidfd_send_signal(fd, signum)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _kill(pid: int, signum: signal.Signals) -> bool:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_processes(processes: Sequence[ProcessInfo], grace_seconds: float) -> list[ProcessInfo]:
    """SIGTERM each process, wait up to ``grace_seconds`` for all of them, then SIGKILL what is left.

    Returns the processes that were still running to be signalled. Idempotent: processes that are gone
    (or whose pid now belongs to another process) are skipped. Waits at most a moment after the SIGKILL.
    """
    signalled = [p for p in processes if signal_process(p, signal.SIGTERM)]
    deadline = time.monotonic() + grace_seconds
    pending = signalled
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [p for p in pending if is_alive(p.pid, p.start_time)]
    kill_processes(pending)
    return signalled


def kill_processes(processes: Sequence[ProcessInfo], wait_seconds: float = 2.0) -> None:
    """SIGKILL each process that still runs and wait up to ``wait_seconds`` for them to be gone."""
    pending = [p for p in processes if signal_process(p, signal.SIGKILL)]
    deadline = time.monotonic() + wait_seconds
    while pending and time.monotonic() < deadline:
        time.sleep(0.02)
        pending = [p for p in pending if is_alive(p.pid, p.start_time)]


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (another process may still take it before us)."""
    with socket.socket(family_of(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` (an IPv4 or IPv6 address) right now."""
    with socket.socket(family_of(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
