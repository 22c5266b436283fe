"""End-to-end helpers: the real `sky-lite` in subprocesses, a private home each, HTTP on 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .answering import answering_run as answering_run  # passed on: the e2e tests import it from here

REPO = Path(__file__).resolve().parents[2]


class SkyLite:
    def __init__(self, home: Path) -> None:
        self.home = home
        # Where commands run: relative paths in a task resolve against it (as SkyPilot resolves them).
        self.cwd = REPO
        self.env = dict(os.environ, SKY_LITE_HOME=str(home), SKY_LITE_CONTROLLER_INTERVAL_SECONDS="0.5",
                        SKY_LITE_DRAIN_SECONDS="1.5",
                        PYTHONUNBUFFERED="1")

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "skyserve_lite", *args], env=self.env, cwd=self.cwd,
                                capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"sky-lite {' '.join(args)} exited {result.returncode}:\n"
                                 f"stdout: {result.stdout}\nstderr: {result.stderr}")
        return result

    def status(self, *names: str) -> dict[str, Any]:
        return dict(json.loads(self.run("serve", "status", *names, "-o", "json").stdout))

    def processes(self) -> list[int]:
        """Pids of live processes whose environment names this home: everything sky-lite started for it."""
        marker = f"SKY_LITE_HOME={self.home}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in environ.split(b"\0") and state not in ("Z", "X"):
                found.append(int(entry.name))
        return found

    def cleanup(self) -> None:
        """Take everything down; whatever still runs afterwards (a failed or timed-out down) is killed."""
        try:
            if self.home.exists() and self.status()["services"]:
                self.run("serve", "down", "--all", "-y", check=False, timeout=60)
        except (subprocess.TimeoutExpired, AssertionError, ValueError):
            pass
        finally:
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_until(predicate: Any, timeout: float = 30.0, message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        time.sleep(0.2)


@pytest.fixture
def sky(tmp_path: Path) -> Iterator[SkyLite]:
    instance = SkyLite(tmp_path / "home")
    yield instance
    instance.cleanup()
