"""Waiting for rollouts with real processes: `serve update --wait` succeeding and failing, `serve down
--replica-id`, and the live views in a real terminal (a pty 80 columns wide) where Ctrl-C is the terminal's
own interrupt character, not a signal sent by hand."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from pathlib import Path

import pytest

from .conftest import REPO, SkyLite, answering_run, http_get, wait_until

pytestmark = pytest.mark.e2e

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def task(tmp_path: Path, body: str, *, setup: str = "", replicas: int = 2, name: str = "task.yaml",
         initial_delay: int = 30) -> Path:
    path = tmp_path / name
    setup_section = f"setup: {setup}\n" if setup else ""
    path.write_text(f"name: web\nservice:\n  readiness_probe:\n    path: /\n"
                    f"    initial_delay_seconds: {initial_delay}\n  replicas: {replicas}\n{setup_section}"
                    f"{answering_run(body)}")
    return path


class Terminal:
    """`sky-lite ARGS` on a pseudo-terminal of ``columns`` x 24, as a person at a shell runs it."""

    def __init__(self, sky: SkyLite, *args: str, columns: int = 80) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal is its controlling terminal and stdin/stdout/stderr
            os.chdir(REPO)
            os.execve(sys.executable, [sys.executable, "-m", "skyserve_lite", *args], sky.env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        self.output = b""

    def read_until(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text):
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} on the terminal; it shows:\n{self.text[-3000:]}")
            if not self._read(0.2):
                break
        return self.text

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the child exited and closed its end
                return False
            if not chunk:
                return False
            self.output += chunk
        return True

    def drawn_lines(self) -> list[str]:
        """Every line as drawn: a live view's redraw moves the cursor up and erases lines, so lines end at
        a newline, a carriage return or an erase, and what is left of the escape codes is stripped."""
        pieces = re.split(rb"\r\n|\r|\n|\x1b\[\d*[AK]", self.output)
        return [ANSI.sub(b"", piece).decode(errors="replace") for piece in pieces]

    @property
    def text(self) -> str:
        return ANSI.sub(b"", self.output).decode(errors="replace")

    def press_ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")  # the line discipline turns it into SIGINT for the foreground group

    def exit_code(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.05):
                    pass
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                raise AssertionError(f"still running after {timeout}s:\n{self.text[-3000:]}")
            self._read(0.1)


def test_update_wait_succeeds_then_fails_naming_the_replica(sky: SkyLite, tmp_path: Path) -> None:
    sky.run("serve", "up", str(task(tmp_path, '"one"')), "--timeout", "90")
    done = sky.run("serve", "update", "web", str(task(tmp_path, '"two"', name="two.yaml")), "-y", "--timeout", "90")
    assert re.search(r"^web: version 2 rolled out, 2/2 READY in \d+s$", done.stdout, re.M), done.stdout
    endpoint = sky.run("serve", "status", "web", "--endpoint").stdout.strip()
    assert http_get(endpoint + "/") == (200, "two")  # no old replica serves once the wait returned
    # A version whose workload never listens on $PORT: the wait ends at its timeout naming the replica.
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: web\nservice:\n  readiness_probe: /\n  replicas: 2\nrun: exec sleep 600\n")
    failed = sky.run("serve", "update", "web", str(broken), "-y", "--timeout", "6", check=False)
    assert failed.returncode == 1
    assert "Error: web: version 3 is not rolled out after 6s (0/2 READY); waiting for replica" in failed.stderr
    assert "must listen on $PORT" in failed.stderr
    assert http_get(endpoint + "/") == (200, "two")  # version 2 keeps serving meanwhile


def test_down_replica_id_replaces_one_replica(sky: SkyLite, tmp_path: Path) -> None:
    sky.run("serve", "up", str(task(tmp_path, '"one"')), "--timeout", "90")
    before = {r["replica_id"] for r in sky.status("web")["services"][0]["replicas"]}
    out = sky.run("serve", "down", "web", "--replica-id", "1", "-y", "--timeout", "60").stdout
    assert out == "Replica 1 of web terminated.\n"
    replicas = wait_until(lambda: [r for r in sky.status("web")["services"][0]["replicas"]
                                   if r["status"] == "READY" and r["replica_id"] not in before] or None, 60,
                          "a replacement READY")
    assert len(replicas) == 1
    assert 1 not in {r["replica_id"] for r in sky.status("web")["services"][0]["replicas"]}


def test_the_live_views_in_an_80_column_terminal_and_ctrl_c(sky: SkyLite, tmp_path: Path) -> None:
    slow = task(tmp_path, '"one"', setup="sleep 30", replicas=1, initial_delay=120)
    up = Terminal(sky, "serve", "up", str(slow))
    shown = up.read_until(r"running setup \(\d+s\)")
    assert "web" in shown and "STARTING" in shown
    widest = max(up.drawn_lines(), key=len)
    assert len(widest) <= 80, f"the live table is wider than the terminal: {widest!r}"
    assert "http://127.0.0.1:" in shown  # the endpoint whole, not cut to fit
    up.press_ctrl_c()
    assert up.exit_code() == 130
    assert "Stopped waiting; the controller keeps starting web" in up.text
    assert "Aborted" not in up.text and "Traceback" not in up.text
    # The service carried on; wait for it, then follow an update's rollout the same way.
    sky.run("serve", "wait", "web", "--timeout", "90")
    update = Terminal(sky, "serve", "update", "web", str(task(tmp_path, '"two"', setup="sleep 30", replicas=1,
                                                               name="two.yaml", initial_delay=120)), "-y")
    shown = update.read_until(r"rolling out version 2")
    update.read_until(r"waiting for replica \d+ to become READY, now STARTING: running setup")
    update.press_ctrl_c()
    assert update.exit_code() == 130
    assert "Stopped waiting; the controller keeps rolling out version 2 of web (`sky-lite serve wait web` " \
           "follows it again)" in update.text.replace("\n", " ").replace("  ", " ")
    assert sky.status("web")["services"][0]["version"] == 2
