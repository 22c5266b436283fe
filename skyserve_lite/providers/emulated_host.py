"""Emulated SSH hosts: what a controller VM "is" when the cloud API is an emulator (moto).

With ``SKY_LITE_EMULATE_INSTANCES=1``, `controller up --cloud` cannot reach the instance the emulator says
runs, so, like replica emulation (``emulation``), it boots it here: an OpenSSH server on a free 127.0.0.1
port with a host key of its own, accepting exactly the key the VM was launched with. Its sessions log in
to a home of their own under the emulated host's folder (a fresh VM's user: no start-up files of yours)
with this machine's PATH, so the whole bootstrap and every call then run over SSH for real.

The same functions start the throwaway sshd of the tests (``spawn_sshd``). Needs OpenSSH's ``sshd``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite import procs
from skyserve_lite.errors import ControllerError

HOSTS_FOLDER = "emulated-hosts"
# What a real VM has without being told (its cloud identity and project, from the metadata server), and what
# points it at the same emulator: an emulated host's sessions get those of them set here, so the controller
# there launches its replicas on the emulated cloud too.
CLOUD_SETTINGS = ("SKY_LITE_EMULATE_INSTANCES", "SKY_LITE_GCP_ENDPOINT", "SKY_LITE_GCP_PROJECT",
                  "GOOGLE_APPLICATION_CREDENTIALS")


def find_sshd() -> str | None:
    return shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
                                         if os.access(p, os.X_OK)), None)


def make_key(path: Path) -> Path:
    """An ed25519 key pair at ``path`` and ``path.pub`` (made once)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sky-lite", "-f", str(path)],
                       check=True, capture_output=True)
    return path


def write_sshd_config(folder: Path, port: int, session_env: Mapping[str, str]) -> Path:
    """An sshd_config for one user (the one running it) on 127.0.0.1:``port``, keys only, with
    ``session_env`` set in every session. Values must not hold spaces or quotes."""
    for name, value in session_env.items():
        if any(c.isspace() or c in "\"'" for c in f"{name}{value}"):
            raise ControllerError(f"cannot pass {name}={value!r} to an emulated host's sessions")
    env = " ".join(f"{name}={value}" for name, value in session_env.items())
    config = folder / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host_ed25519'}",
        f"PidFile {folder / 'sshd.pid'}", f"AuthorizedKeysFile {folder / 'authorized_keys'}",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        "PermitRootLogin prohibit-password", *([f"SetEnv {env}"] if env else []), "LogLevel ERROR",
        "MaxSessions 50", "MaxStartups 50:30:100", "",
    ]))
    return config


def spawn_sshd(folder: Path, port: int, session_env: Mapping[str, str], timeout_seconds: float = 10
               ) -> subprocess.Popen[bytes]:
    """Start ``sshd -D`` for ``folder`` (its host key made if missing, ``authorized_keys`` already there)
    in a session of its own; return once it accepts connections. Raises ``ControllerError``."""
    sshd = find_sshd()
    if sshd is None:
        raise ControllerError("emulating a controller VM needs OpenSSH's sshd (apt-get install openssh-server)")
    make_key(folder / "host_ed25519")
    config = write_sshd_config(folder, port, session_env)
    if os.getuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # its privilege separation directory
    process = procs.spawn_detached([sshd, "-D", "-e", "-f", str(config)], cwd=folder, env=os.environ,
                                   log_path=folder / "sshd.log")
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise ControllerError(f"sshd did not come up on 127.0.0.1:{port}: {(folder / 'sshd.log').read_text()[-500:]}")


@dataclass(frozen=True)
class EmulatedHost:
    instance_id: str
    port: int
    pid: int


class EmulatedHosts:
    """The emulated controller VMs of a state directory, one folder each under ``emulated-hosts/``."""

    def __init__(self, home: Path) -> None:
        self.root = home / HOSTS_FOLDER

    def boot(self, instance_id: str, public_key: str) -> EmulatedHost:
        """The running emulated host of ``instance_id``, started if needed. Idempotent."""
        found = self.find(instance_id)
        if found is not None:
            return found
        folder = self.root / instance_id
        login_home = folder / "login-home"
        login_home.mkdir(parents=True, exist_ok=True, mode=0o700)
        (folder / "authorized_keys").write_text(public_key.strip() + "\n")
        port = procs.find_free_port()
        pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
        cloud = {name: os.environ[name] for name in CLOUD_SETTINGS if os.environ.get(name)}
        process = spawn_sshd(folder, port, {"HOME": str(login_home), "PIP_CACHE_DIR": pip_cache,
                                            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **cloud})
        (folder / "port").write_text(f"{port} {process.pid} {procs.process_start_time(process.pid) or ''}\n")
        return EmulatedHost(instance_id, port, process.pid)

    def find(self, instance_id: str) -> EmulatedHost | None:
        try:
            fields = (self.root / instance_id / "port").read_text().split()
            port, pid = int(fields[0]), int(fields[1])
            start = int(fields[2]) if len(fields) > 2 else None
        except (OSError, ValueError, IndexError):
            return None
        return EmulatedHost(instance_id, port, pid) if procs.is_alive(pid, start) else None

    def stop(self, instance_id: str) -> bool:
        """Stop the emulated host's sshd and its sessions' processes (what the VM ran); True if it ran."""
        found = self.find(instance_id)
        if found is not None:
            procs.terminate_groups([found.pid], grace_seconds=5)
        shutil.rmtree(self.root / instance_id, ignore_errors=True)
        return found is not None
