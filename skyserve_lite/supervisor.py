"""A replica's supervisor: the first process of every local replica, so that stopping it stops all of it.

    python -I .../skyserve_lite/supervisor.py --pid-file DIR/pid --grace 5 -- /usr/bin/bash DIR/wrapper.sh

Terminating a process group misses whatever left the group: a workload child that calls ``setsid``, a
daemon that double-forks. The supervisor closes that gap on Linux:

1. it registers as a **child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)``), so every descendant that
   loses its parent is re-parented to it instead of to init, and stays in its tree;
2. it writes its own pid to ``--pid-file`` (the local provider's ``pid``) before anything else runs;
3. it runs the command (the replica's wrapper) with the signal mask and dispositions a fresh process has,
   and waits;
4. when it is asked to stop (SIGTERM, SIGINT, SIGHUP) or the command exits, it sends SIGTERM once to
   every descendant (walking the process table's parent links from itself), waits up to ``--grace``
   seconds for them, SIGKILLs what is left, and exits: 128 + the signal, or the command's exit status.

It is run by its file path with ``python -I``, not ``-m``: it starts with a replica's bare environment
(no ``PYTHONPATH``), so it puts the package's own parent directory on ``sys.path`` itself, and it
imports only the standard library and ``skyserve_lite.procs``. ``is_supported()`` says whether this
system has what it needs (Linux); elsewhere the local provider runs the wrapper directly.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from collections.abc import Sequence
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

PATH = Path(__file__).resolve()


def is_supported() -> bool:
    """Whether replicas can run under the supervisor here: a child subreaper and ``sigwaitinfo`` (Linux)."""
    return sys.platform.startswith("linux") and hasattr(signal, "sigwaitinfo")


def supervisor_argv(pid_file: Path, grace_seconds: float, command: Sequence[str]) -> list[str]:
    """The argv that runs ``command`` under the supervisor (``command[0]`` must be an absolute path)."""
    return [sys.executable, "-I", str(PATH), "--pid-file", str(pid_file), "--grace", f"{grace_seconds:g}",
            "--", *command]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    # Blocked from the start and taken with sigwaitinfo: a stop asked for at any moment is acted on once.
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    _become_subreaper()
    temporary = args.pid_file.with_name(args.pid_file.name + ".tmp")
    temporary.write_text(f"{os.getpid()}\n")
    os.replace(temporary, args.pid_file)
    try:
        child = os.posix_spawn(args.command[0], args.command, os.environ, setsigmask=set(), setsigdef=_RESET)
    except OSError as exc:
        print(f"sky-lite: cannot start {args.command[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 127
    code = _wait(child)
    stop_descendants(args.grace)
    return code


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
        print("sky-lite: cannot become a child subreaper; processes that leave the replica's process tree "
              "are found by their environment only", file=sys.stderr, flush=True)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="supervisor.py", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pid-file", type=Path, required=True, help="where to write the supervisor's pid")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs="+", help="the command to supervise, after --")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
