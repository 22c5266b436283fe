"""Reaching a controller host with the system's OpenSSH client: targets, options, pinned host keys.

Everything that ends up on an ssh command line is validated here first (a user or host that starts with
``-`` would be read as an option), and the remote command is one string quoted with ``shlex``. The client
honours the user's ``~/.ssh/config`` (no ``-F``), never asks anything (``BatchMode``), checks the host key
strictly against the keys pinned at `controller up` (a known_hosts file of this state directory only),
and shares one connection between calls (``ControlMaster``/``ControlPersist``), so a warm call costs
one round trip instead of a handshake.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import shlex
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite.errors import ControllerError, HostKeyError, UsageError

_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*")
CONTROL_PERSIST_SECONDS = 600
# ssh appends ".XXXXXXXXXXXXXXXX" to a control socket's path while it makes it; Linux allows 107 bytes.
_SOCKET_PATH_LIMIT = 100
_KEY_TYPES = "ed25519,ecdsa,rsa"


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int = 22
    user: str | None = None
    key_file: Path | None = None

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ssh://{self.user + '@' if self.user else ''}{host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts names this host (``[host]:port`` off port 22)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    @property
    def is_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def parse_ssh_target(text: str, *, key_file: Path | None = None, what: str = "--ssh") -> SshTarget:
    """``USER@HOST[:PORT]``, ``HOST``, ``[IPV6]:PORT`` or ``ssh://USER@HOST:PORT``. Raises ``UsageError``
    naming ``what`` for anything else."""
    rest = text.removeprefix("ssh://")
    user, _, hostport = rest.rpartition("@")
    port_text = ""
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port_text = tail.removeprefix(":") if tail.startswith(":") else ("" if not tail else "x")
    elif hostport.count(":") == 1:
        host, _, port_text = hostport.partition(":")
    else:
        host = hostport
    if user and not _USER.fullmatch(user):
        raise UsageError(f"{what}: {user!r} is not a valid user name")
    if not _is_host(host):
        raise UsageError(f"{what}: {host!r} is not a host name or IP address (expected USER@HOST[:PORT])")
    port = 22
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(f"{what}: {port_text!r} is not a port number (1-65535)")
        port = int(port_text)
    return SshTarget(host=host, port=port, user=user or None, key_file=key_file)


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOSTNAME.fullmatch(host)) and len(host) <= 253


def control_dir(home: Path) -> Path:
    """Where the control sockets of ``home``'s connections live: under the state directory when its path
    is short enough for a socket, else a private folder in /tmp (checked to be ours and private)."""
    preferred = home / "ssh"
    if len(str(preferred)) + len("/cm-") + 40 <= _SOCKET_PATH_LIMIT - 17:
        folder = preferred
    else:
        folder = Path("/tmp") / f"sky-lite-ssh-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = folder.lstat()
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise ControllerError(f"refusing to keep ssh control sockets in {folder}: it is not a private directory "
                              "of yours")
    return folder


def ssh_options(target: SshTarget, known_hosts: Path | None, control: Path | None) -> list[str]:
    """Options for every ssh run against ``target``. ``known_hosts`` is the pinned file (None: the user's
    own known_hosts, still strictly checked); ``control`` the folder of control sockets (None: no
    connection sharing)."""
    options = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=15",
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-p", str(target.port)]
    if known_hosts is not None:
        options += ["-o", f"UserKnownHostsFile={_config_path(known_hosts)}", "-o", "GlobalKnownHostsFile=/dev/null"]
    if control is not None:
        options += ["-o", "ControlMaster=auto", "-o", f"ControlPath={_config_path(control)}/cm-%C",
                    "-o", f"ControlPersist={CONTROL_PERSIST_SECONDS}"]
    if target.key_file is not None:
        options += ["-i", str(target.key_file), "-o", "IdentitiesOnly=yes"]
    return options


def ssh_argv(target: SshTarget, options: Sequence[str], remote_command: str) -> list[str]:
    return ["ssh", *options, "--", target.destination, remote_command]


def _config_path(path: Path) -> str:
    text = str(path)
    if any(c in text for c in '"\n'):
        raise UsageError(f"ssh cannot be given a path with a quote or newline in it: {text!r}")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def remote_env_command(env: dict[str, str], argv: Sequence[str]) -> str:
    """One shell command line for the remote login shell: ``NAME=value ... exec argv``, all quoted."""
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return f"{assignments} exec {shlex.join(argv)}".strip()


# --- host keys -------------------------------------------------------------------------------------
def fingerprint(known_hosts_line: str) -> str:
    """``SHA256:...`` of the key on a known_hosts line (``HOST TYPE BASE64``), as ``ssh-keygen -l`` shows."""
    parts = known_hosts_line.split()
    if len(parts) < 3:
        raise ValueError(f"not a known_hosts line: {known_hosts_line!r}")
    digest = hashlib.sha256(base64.b64decode(parts[2])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def scan_host_keys(target: SshTarget, timeout_seconds: float = 15.0) -> list[str]:
    """The host's public keys as known_hosts lines (``ssh-keyscan``), sorted. Raises ``ControllerError``
    when none come back (the host or its sshd is not reachable)."""
    argv = ["ssh-keyscan", "-T", str(int(timeout_seconds)), "-t", _KEY_TYPES, "-p", str(target.port), "--",
            target.host]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_seconds + 5, check=False)
    except FileNotFoundError:
        raise ControllerError("`ssh-keyscan` was not found; install the OpenSSH client") from None
    except subprocess.TimeoutExpired:
        result = None
    lines = sorted(line.strip() for line in (result.stdout if result else "").splitlines()
                   if line.strip() and not line.startswith("#"))
    if not lines:
        raise ControllerError(f"no SSH host key from {target.host} port {target.port}: is sshd running there and "
                              "reachable from here?")
    return lines


def pin_host_keys(scanned: Sequence[str], pinned: Sequence[str], expected: str | None, target: SshTarget) -> list[str]:
    """The keys to pin for ``target``, decided from what the host presents now (``scanned``), what was pinned
    before (``pinned``) and the fingerprint the user gave (``expected``). Pure.

    First contact trusts what the host presents unless ``expected`` is given, which one of its keys must
    match. Afterwards the host must still present a pinned key, unless ``expected`` names its new key (the
    host was rebuilt and the user checked the new key). Raises ``HostKeyError`` otherwise.
    """
    presented = {fingerprint(line): line for line in scanned}
    if expected is not None:
        if expected not in presented:
            raise HostKeyError(f"{target.url} presents {', '.join(sorted(presented))}, not the expected "
                               f"{expected}; refusing it")
        return sorted(scanned)
    if pinned:
        known = {fingerprint(line) for line in pinned}
        if not known & presented.keys():
            raise HostKeyError(f"the SSH host key of {target.url} changed: pinned {', '.join(sorted(known))}, now "
                               f"{', '.join(sorted(presented))}. If the host was rebuilt, check its new key and "
                               "run `sky-lite controller up` again with --host-key-fingerprint NEW")
        return sorted(scanned)
    return sorted(scanned)


def known_hosts_text(target: SshTarget, lines: Sequence[str]) -> str:
    """A known_hosts file naming ``target`` the way ssh looks it up (keyscan already does for ports)."""
    out = []
    for line in lines:
        _, key_type, key = line.split()[:3]
        out.append(f"{target.known_hosts_name} {key_type} {key}\n")
    return "".join(out)
