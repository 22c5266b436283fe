"""Process helpers shared by the local provider, the load balancer runner and the controller daemon.

Linux first: liveness reads ``/proc/PID/stat`` so that a zombie counts as dead and a reused pid is told
apart from the process we started (by its start time). Elsewhere it falls back to ``kill(pid, 0)``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks, or None if it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return _fallback_alive(pid)
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


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


def spawn_detached(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path
                   ) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its own process group), output appended to ``log_path``.

    The caller keeps the ``Popen`` to reap the child when it exits; the process outlives the caller.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
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
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (another process may still take it before us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
