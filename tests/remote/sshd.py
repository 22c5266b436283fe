"""A throwaway OpenSSH server on 127.0.0.1 for tests (the package's emulated-host sshd): its own host key,
an authorized key made for the test, sessions logging in to a fresh home, and a PATH whose first folder
tests control (a fake `crontab`). ``address`` puts it on another loopback address (127.0.0.2, 127.0.0.3
...): several "hosts" on this machine, each with an address of its own."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite import procs
from skyserve_lite.providers.emulated_host import find_sshd, make_key, spawn_sshd, write_sshd_config

SSHD = find_sshd()

__all__ = ["SSHD", "Sshd", "make_key", "start_sshd"]


@dataclass
class Sshd:
    """One ``sshd -D`` process; ``restart(new_host_key=True)`` brings it back on the same port."""

    folder: Path
    port: int
    client_key: Path
    bin_dir: Path  # first on the sessions' PATH
    session_env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    address: str = "127.0.0.1"

    @property
    def target(self) -> str:
        return f"{pwd.getpwuid(os.getuid()).pw_name}@{self.address}:{self.port}"

    def start(self) -> None:
        (self.folder / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        path = f"{self.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env = {"PATH": path, **self.session_env}
        if self.address == "127.0.0.1":
            self.process = spawn_sshd(self.folder, self.port, env)
            return
        make_key(self.folder / "host_ed25519")
        config = write_sshd_config(self.folder, self.port, env)
        config.write_text(config.read_text().replace("ListenAddress 127.0.0.1", f"ListenAddress {self.address}"))
        assert SSHD is not None
        if os.getuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)  # its privilege separation directory
        self.process = procs.spawn_detached([SSHD, "-D", "-e", "-f", str(config)], cwd=self.folder, env=os.environ,
                                            log_path=self.folder / "sshd.log")
        deadline = time.monotonic() + 10
        while self.process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((self.address, self.port), timeout=0.5):
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not come up on {self.address}:{self.port}: "
                           f"{(self.folder / 'sshd.log').read_text()[-500:]}")

    def stop(self) -> None:
        """Stop the server and its sessions (a session outlives a listener killed alone); what the sessions
        started, detached, is left alone, as a real restart of sshd leaves it."""
        if self.process is None:
            return
        sessions = [pid for pid in _descendants(self.process.pid) if _name(pid) == "sshd"]
        for pid in [self.process.pid, *sessions]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process = None

    def restart(self, *, new_host_key: bool = False) -> None:
        self.stop()
        if new_host_key:
            for name in ("host_ed25519", "host_ed25519.pub"):
                (self.folder / name).unlink()
        self.start()


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def start_sshd(folder: Path, session_env: dict[str, str] | None = None, address: str = "127.0.0.1") -> Sshd:
    """An sshd whose sessions log in to a fresh home of their own (like a new VM's user: no shell start-up
    files, which on a developer's machine can cost more than the whole request), sharing pip's cache so
    installs need not download again."""
    folder.mkdir(parents=True, exist_ok=True)
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    login_home = folder / "login-home"
    login_home.mkdir(exist_ok=True)
    pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    env = {"HOME": str(login_home), "PIP_CACHE_DIR": pip_cache, **(session_env or {})}
    server = Sshd(folder=folder, port=procs.find_free_port(address), client_key=make_key(folder / "client_key"),
                  bin_dir=bin_dir, session_env=env, address=address)
    server.start()
    return server
