"""A throwaway OpenSSH server on 127.0.0.1 for tests: its own host key, an authorized key made for the test,
and a PATH whose first folder tests control (a fake `crontab`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def make_key(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sky-lite-test", "-f", str(path)],
                   check=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sshd:
    """One ``sshd -D`` process; ``restart(new_host_key=True)`` brings it back on the same port."""

    folder: Path
    port: int
    client_key: Path
    bin_dir: Path  # first on the sessions' PATH
    session_env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"{os.environ.get('USER') or _user()}@127.0.0.1:{self.port}"

    def start(self) -> None:
        host_key = self.folder / "host_ed25519"
        if not host_key.exists():
            make_key(host_key)
        config = self.folder / "sshd_config"
        path = f"{self.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env = " ".join(f"{name}={value}" for name, value in {"PATH": path, **self.session_env}.items())
        config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
            f"PidFile {self.folder / 'sshd.pid'}", f"AuthorizedKeysFile {self.folder / 'authorized_keys'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PermitRootLogin prohibit-password", f"SetEnv {env}", "LogLevel ERROR", "MaxSessions 50",
            "MaxStartups 50:30:100", "",
        ]))
        (self.folder / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        os.makedirs("/run/sshd", exist_ok=True)
        assert SSHD is not None
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], start_new_session=True,
                                        stderr=open(self.folder / "sshd.log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen: {(self.folder / 'sshd.log').read_text()}")

    def stop(self) -> None:
        """Stop the server and every session it started (a session outlives a listener killed alone)."""
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
    """Every process below ``root`` (sshd's sessions outlive their listener; what they started, detached
    or not, is left alone, as a real restart of sshd leaves it)."""
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


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def start_sshd(folder: Path, session_env: dict[str, str] | None = None) -> Sshd:
    """An sshd whose sessions log in to a fresh home of their own (like a new VM's user: no shell start-up
    files, which on a developer's machine can cost more than the whole request), sharing pip's cache so
    installs need not download again."""
    folder.mkdir(parents=True, exist_ok=True)
    login_home = folder / "login-home"
    login_home.mkdir(exist_ok=True)
    pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    session_env = {"HOME": str(login_home), "PIP_CACHE_DIR": pip_cache, **(session_env or {})}
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    server = Sshd(folder=folder, port=free_port(), client_key=make_key(folder / "client_key"), bin_dir=bin_dir,
                  session_env=dict(session_env or {}))
    server.start()
    return server
