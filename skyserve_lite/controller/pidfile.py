"""The running controller loop of a state directory, from its pid file: read without any lock, so asking
never gets in the way of a loop that is starting (and costs no import of the controller itself)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skyserve_lite import procs

PID_FILE = "controller.pid"


@dataclass(frozen=True)
class ControllerProcess:
    """What a running loop writes to ``controller.pid``: its pid and the kernel's start time of it, so a
    pid reused by another process after a crash is not taken for the controller."""

    pid: int
    start_time: int | None

    def to_text(self) -> str:
        return f"{self.pid} {'' if self.start_time is None else self.start_time}".strip() + "\n"

    @classmethod
    def parse(cls, text: str) -> ControllerProcess | None:
        fields = text.split()
        try:
            return cls(int(fields[0]), int(fields[1]) if len(fields) > 1 else None)
        except (IndexError, ValueError):
            return None

    def is_alive(self) -> bool:
        return procs.is_alive(self.pid, self.start_time)


def find_controller(home: Path) -> ControllerProcess | None:
    """The controller loop running for ``home``, or None. Takes no lock, so probing it in a loop never
    gets in the way of a controller that is starting (it reads the pid file and checks that process)."""
    try:
        recorded = ControllerProcess.parse((home / PID_FILE).read_text())
    except OSError:
        return None
    return recorded if recorded is not None and recorded.is_alive() else None


def is_controller_running(home: Path) -> bool:
    """True while a controller loop runs for ``home`` (a `controller tick` does not count)."""
    return find_controller(home) is not None


def read_controller_pid(home: Path) -> int | None:
    """The pid of the running controller loop, or None."""
    found = find_controller(home)
    return found.pid if found is not None else None
