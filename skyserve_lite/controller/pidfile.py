"""The running controller loop of a state directory, from its pid file: read without any lock, so asking
never gets in the way of a loop that is starting (and costs no import of the controller itself)."""

from __future__ import annotations

from pathlib import Path

from skyserve_lite import procs

PID_FILE = "controller.pid"

# What a running loop writes to ``controller.pid``: its pid and the kernel's start time of it, so a pid reused
# by another process after a crash is not taken for the controller. The same record as every pid file of
# sky-lite (a replica's ``pid`` too), read and checked in one place.
ControllerProcess = procs.RecordedProcess


def find_controller(home: Path) -> ControllerProcess | None:
    """The controller loop running for ``home``, or None. Takes no lock, so probing it in a loop never
    gets in the way of a controller that is starting (it reads the pid file and checks that process)."""
    recorded = procs.read_pid_file(home / PID_FILE)
    return recorded if recorded is not None and recorded.is_alive() else None


def is_controller_running(home: Path) -> bool:
    """True while a controller loop runs for ``home`` (a `controller tick` does not count)."""
    return find_controller(home) is not None


def read_controller_pid(home: Path) -> int | None:
    """The pid of the running controller loop, or None."""
    found = find_controller(home)
    return found.pid if found is not None else None
