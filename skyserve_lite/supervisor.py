"""A replica's supervisor: the first process of every local replica, so that stopping it stops all of it.

    python -I .../skyserve_lite/supervisor.py --pid-file DIR/pid --grace 5 -- /usr/bin/bash DIR/wrapper.sh

Terminating a process group misses whatever left the group: a workload child that calls ``setsid``, a
daemon that double-forks. The supervisor closes that gap on Linux:

1. it registers as a **child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)``), so every descendant that
   loses its parent is re-parented to it instead of to init, and stays in its tree;
2. it writes its own pid and start time to ``--pid-file`` (the local provider's ``pid``; ``procs.RecordedProcess``)
   before anything else runs;
3. it runs the command (the replica's wrapper) with the signal mask and dispositions a fresh process has,
   its stdout and stderr one pipe, and waits;
4. when it is asked to stop (SIGTERM, SIGINT, SIGHUP) or the command exits, it sends SIGTERM once to
   every descendant (walking the process table's parent links from itself), waits up to ``--grace``
   seconds for them, SIGKILLs what is left, and exits: 128 + the signal, or the command's exit status.

**Output.** A thread copies the pipe to the supervisor's own stdout (the replica's ``replica.log``), every
line prefixed with the UTC time its first byte was read, ISO 8601 to the millisecond and one space
(``2026-12-01T17:30:05.123Z hello``; ``format_line_time``). The copy never holds a line back: a line is
written as its bytes arrive (a long line, or binary data without newlines, streams through in 64 KiB
reads), so a partial last line is in the log at once; at the end it gets a newline. A write that fails (a
full disk) loses that output and the copy goes on reading, so the workload never waits on the log; the
pipe holds 1 MiB where the kernel allows, for the moments the disk is slower than the workload. The
supervisor's own messages carry the same prefix. Killed by SIGKILL, the supervisor takes the pipe's
reading end with it: the workload's next write gets SIGPIPE (it is being stopped anyway).

It is run by its file path with ``python -I``, not ``-m``: it starts with a replica's bare environment
(no ``PYTHONPATH``), so it puts the package's own parent directory on ``sys.path`` itself, and it
imports only the standard library and ``skyserve_lite.procs``. ``is_supported()`` says whether this
system has what it needs (Linux); elsewhere the local provider runs the wrapper directly.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

if not __package__:  # run by its path with a bare environment: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from skyserve_lite import procs

# prctl(2): descendants that lose their parent are re-parented to the nearest subreaper above them.
_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
_WAITED = _STOP_SIGNALS | {signal.SIGCHLD}
# Python ignores these at start; ignored dispositions survive exec, so the workload gets them back.
_RESET = (signal.SIGPIPE, signal.SIGXFSZ)
# SIGKILL rounds after the grace: a process may fork while it is being killed.
_KILL_ROUNDS = 50
# The output pipe: read this much at a time; ask the kernel for a 1 MiB buffer (the default 64 KiB is about
# a second of a chatty workload's output, should a write to the log stall; 1 MiB is pipe-max-size's default).
_READ_BYTES = 65536
_PIPE_BYTES = 1 << 20
# Once the last descendant is gone the pipe is at its end and the copy finishes at once; wait at most this
# long for it (a process outside the tree may hold the pipe), well inside the 1 s the local provider allows
# a supervisor beyond its grace.
_COPY_WAIT_SECONDS = 0.5

PATH = Path(__file__).resolve()


def is_supported() -> bool:
    """Whether replicas can run under the supervisor here: a child subreaper and ``sigwaitinfo`` (Linux)."""
    return sys.platform.startswith("linux") and hasattr(signal, "sigwaitinfo")


def supervisor_argv(pid_file: Path, grace_seconds: float, command: Sequence[str]) -> list[str]:
    """The argv that runs ``command`` under the supervisor (``command[0]`` must be an absolute path)."""
    return [sys.executable, "-I", str(PATH), "--pid-file", str(pid_file), "--grace", f"{grace_seconds:g}",
            "--", *command]


def format_line_time(epoch: float) -> bytes:
    """The prefix of a log line written at ``epoch``: ``2026-12-01T17:30:05.123Z `` (UTC, milliseconds,
    one space). ``skyserve_lite.logview`` reads it back for `serve logs --since`."""
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z ".encode()


def stamp_lines(data: bytes, at_line_start: bool, stamp: bytes) -> tuple[bytes, bool]:
    """``data`` with ``stamp`` before each line that starts in it (the first only when ``at_line_start``:
    the data before was a whole line); and whether the data ends a line. Lines are never held back."""
    if not data:
        return b"", at_line_start
    ends_line = data.endswith(b"\n")
    body = data.replace(b"\n", b"\n" + stamp)
    if ends_line:  # the next line has not started yet: its stamp comes with its first byte
        body = body[:-len(stamp)]
    return (stamp + body if at_line_start else body), ends_line


def copy_stamped(source: int, target: int, now: Callable[[], float] = time.time) -> None:
    """Copy what is read from ``source`` to ``target`` until the end of the stream, each line prefixed
    (``stamp_lines``, ``format_line_time``), a partial last line ended with a newline; close ``source``.
    Never raises for a failed write: that output is lost, and reading goes on, so the writers never
    block on a log that cannot be written."""
    at_line_start = True
    try:
        while True:
            data = os.read(source, _READ_BYTES)
            if not data:
                break
            out, at_line_start = stamp_lines(data, at_line_start, format_line_time(now()))
            _write_all(target, out)
        if not at_line_start:
            _write_all(target, b"\n")
    finally:
        os.close(source)


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # a full disk or a removed mount: this output is lost, the next may be written


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    # Blocked from the start and taken with sigwaitinfo: a stop asked for at any moment is acted on once.
    # The copying thread below is started after this and inherits the mask: a stop signal delivered to it
    # instead would end the process at once (SIGTERM's default action) and skip stopping the descendants.
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    _become_subreaper()
    # With its start time: whoever reads the file later tells this process from one that reused its pid.
    procs.write_pid_file(args.pid_file, procs.RecordedProcess.of(os.getpid()))
    reading, writing = os.pipe()  # both close-on-exec: the command gets the writing end as its fds 1 and 2
    _enlarge_pipe(writing)
    copier = threading.Thread(target=copy_stamped, args=(reading, sys.stdout.fileno()), name="log-copy",
                              daemon=True)
    copier.start()
    try:
        child = os.posix_spawn(args.command[0], args.command, os.environ, setsigmask=set(), setsigdef=_RESET,
                               file_actions=[(os.POSIX_SPAWN_DUP2, writing, 1), (os.POSIX_SPAWN_DUP2, writing, 2)])
    except OSError as exc:
        _say(f"cannot start {args.command[0]}: {exc.strerror or exc}")
        return 127
    finally:
        os.close(writing)  # from now on only the descendants hold it: the copy ends when the last one goes
    code = _wait(child)
    stop_descendants(args.grace)
    copier.join(_COPY_WAIT_SECONDS)  # a process outside the tree may still hold the pipe: do not wait for it
    return code


def _enlarge_pipe(fd: int) -> None:
    setting = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux, Python 3.10+
    if setting is not None:
        # Refused above this system's pipe-max-size: the default buffer works, with less slack.
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, setting, _PIPE_BYTES)


def _say(message: str) -> None:
    """A line of the supervisor's own in the replica's log, prefixed as the workload's lines are."""
    _write_all(sys.stderr.fileno(), format_line_time(time.time()) + f"sky-lite: {message}\n".encode())


def _wait(child: int) -> int:
    """Until a stop signal comes or ``child`` exits; its exit status, or 128 + the signal."""
    while True:
        info = signal.sigwaitinfo(_WAITED)
        if info.si_signo != signal.SIGCHLD:
            return 128 + info.si_signo
        status = _reap().get(child)
        if status is not None:
            return os.waitstatus_to_exitcode(status)


def stop_descendants(grace_seconds: float) -> None:
    """SIGTERM every descendant once, wait up to ``grace_seconds`` for them all, then SIGKILL what is left
    (until nothing is). Reaps the children (orphans re-parented here included) as they exit."""
    me = os.getpid()
    signalled: set[procs.ProcessInfo] = set()
    deadline = time.monotonic() + grace_seconds
    while True:
        left = procs.find_descendants(me, procs.list_processes())
        if not left:
            return
        for process in left:  # newcomers too: a descendant forked after the first round
            if process not in signalled and procs.signal_process(process, signal.SIGTERM):
                signalled.add(process)
        if time.monotonic() >= deadline:
            break
        _pause(0.05)
    for _ in range(_KILL_ROUNDS):
        left = procs.find_descendants(me, procs.list_processes())
        if not left:
            return
        for process in left:
            procs.signal_process(process, signal.SIGKILL)
        _pause(0.02)


def _pause(seconds: float) -> None:
    """Sleep up to ``seconds``, waking when a child exits, and reap."""
    signal.sigtimedwait({signal.SIGCHLD}, seconds)
    _reap()


def _reap() -> dict[int, int]:
    """Reap every exited child; their wait statuses by pid."""
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = status


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0
    except (OSError, AttributeError):
        failed = True
    if failed:
        _say("cannot become a child subreaper; processes that leave the replica's process tree are found by "
             "their environment only")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="supervisor.py", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pid-file", type=Path, required=True, help="where to write the supervisor's pid")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs="+", help="the command to supervise, after --")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
