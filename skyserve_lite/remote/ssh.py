"""Reaching a controller host with the system's OpenSSH client: targets, options, pinned host keys.

Everything that ends up on an ssh command line is validated here first (a user or host that starts with
``-`` would be read as an option), and the remote command is one string quoted with ``shlex``. The client
honours the user's ``~/.ssh/config`` (no ``-F``), never asks anything (``BatchMode``), checks the host key
strictly against the keys pinned at `controller up` (a known_hosts file of this state directory only, which
holds only keys the host proved on an authenticated connection: ``prove_host_keys``),
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
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite.errors import ControllerError, HostKeyError, UsageError
from skyserve_lite.netaddr import url_host

_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*")
CONTROL_PERSIST_SECONDS = 600
# ssh appends ".XXXXXXXXXXXXXXXX" to a control socket's path while it makes it; Linux allows 107 bytes.
_SOCKET_PATH_LIMIT = 100
_KEY_TYPES = "ed25519,ecdsa,rsa"
# What ssh prints when the host presents no trusted key (a changed key, or only keys of other types).
HOST_KEY_SIGNS = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED")


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
        host = url_host(self.host)
        return f"ssh://{self.user + '@' if self.user else ''}{host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts names this host (``[host]:port`` off port 22)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"  # brackets for any host

    @property
    def is_loopback(self) -> bool:
        """Whether the host is this machine: a loopback address (``is_loopback_address``) or ``localhost``."""
        return is_loopback_address(self.host) or self.host == "localhost"


def is_loopback_address(host: str, *, ipv6: bool = True) -> bool:
    """Whether ``host`` is a loopback IP address written as one: in 127.0.0.0/8, or ``::1`` unless ``ipv6`` is
    False. A name is not one, ``localhost`` included (what it resolves to is the resolver's business). Pure."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback and (ipv6 or address.version == 4)


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
        # UpdateHostKeys=no: the pinned file changes only at `controller up`, through ``prove_host_keys``.
        options += ["-o", f"UserKnownHostsFile={_config_path(known_hosts)}", "-o", "GlobalKnownHostsFile=/dev/null",
                    "-o", "UpdateHostKeys=no"]
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
# The key types a pin may hold, as OpenSSH names them on a known_hosts line.
HOST_KEY_TYPES = frozenset({"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                            "ssh-rsa"})


def fingerprint(known_hosts_line: str) -> str:
    """``SHA256:...`` of the key on a known_hosts line (``HOST TYPE BASE64``), as ``ssh-keygen -l`` shows."""
    parts = known_hosts_line.split()
    if len(parts) < 3:
        raise ValueError(f"not a known_hosts line: {known_hosts_line!r}")
    digest = hashlib.sha256(base64.b64decode(parts[2])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse_public_key(key_type: str, blob: str) -> str | None:
    """``TYPE BASE64`` when ``blob`` is a public key of ``key_type`` (its wire form names that type, as every
    OpenSSH key blob starts with its type); None for anything else, so text a cloud relays from a console
    or an agent can never smuggle a line or an option into a known_hosts file. Pure."""
    if key_type not in HOST_KEY_TYPES or not blob.isascii():
        return None
    try:
        raw = base64.b64decode(blob, validate=True)
    except ValueError:
        return None
    name = key_type.encode()
    if raw[:4] != len(name).to_bytes(4, "big") or raw[4:4 + len(name)] != name or len(raw) < 4 + len(name) + 4:
        return None
    return f"{key_type} {blob}"


def host_lines(target: SshTarget, keys: Sequence[str]) -> list[str]:
    """Known_hosts lines naming ``target`` for ``keys`` (``TYPE BASE64``, or known_hosts lines of any host
    name), sorted and without repeats. Raises ``ValueError`` for a line that holds no valid key."""
    out = set()
    for line in keys:
        parts = line.split()
        found = None
        for at in range(min(2, len(parts) - 1)):  # "TYPE BASE64 [comment]" or "HOST TYPE BASE64 [comment]"
            found = parse_public_key(parts[at], parts[at + 1])
            if found is not None:
                break
        if found is None:
            raise ValueError(f"not a public host key: {line[:80]!r}")
        out.add(f"{target.known_hosts_name} {found}")
    return sorted(out)


@dataclass(frozen=True)
class HostKeyPlan:
    """Which host keys the first strict connection of `controller up` trusts; what the host then proves
    on that connection is what gets pinned (``prove_host_keys``).

    ``trust`` is known_hosts lines; ``scan_for`` a fingerprint to pick out of ``ssh-keyscan``'s answer
    (the one key the user checked; every other scanned key is ignored); ``first_use``: nothing to check
    against, so ssh accepts the key of the one connection it makes (``StrictHostKeyChecking=accept-new``).
    ``source`` says where the trust comes from, for messages."""

    trust: tuple[str, ...] = ()
    scan_for: str | None = None
    first_use: bool = False
    source: str = ""


def plan_host_keys(target: SshTarget, *, pinned: Sequence[str], cloud: Sequence[str] | None,
                   expected: str | None) -> HostKeyPlan:
    """Decide where the trust in ``target``'s host key comes from. Pure.

    ``cloud``: the keys the cloud's API reports for a VM `controller up --cloud` launched (None for an
    ``--ssh`` host; empty when the cloud shows none). In order: the cloud's keys (an authenticated channel
    that is not the network path to the host), checked against ``expected`` when given; else the key the
    user named with ``expected``, picked out of a scan; else the pinned keys of an earlier `controller up`;
    else, for an ``--ssh`` host only, first use. Raises ``HostKeyError`` when the cloud's keys do not hold
    ``expected``, or a cloud VM has no key to trust at all.
    """
    if cloud:
        trust = tuple(host_lines(target, cloud))
        shown = sorted({fingerprint(line) for line in trust})
        if expected is not None and expected not in shown:
            raise HostKeyError(f"the cloud reports the host keys {', '.join(shown)} for {target.url}, not the "
                               f"expected {expected}; refusing it")
        return HostKeyPlan(trust=trust, source="the keys the cloud reports")
    if expected is not None:
        return HostKeyPlan(scan_for=expected, source=f"the key you named ({expected})")
    if pinned:
        return HostKeyPlan(trust=tuple(host_lines(target, pinned)), source="the pinned keys")
    if cloud is not None:
        raise HostKeyError(f"the cloud has not reported the SSH host keys of {target.url} (its console output or "
                           "guest attributes hold none yet), and a key scan is not trusted for a VM sky-lite "
                           "launched. Read the key from the cloud's console and run `sky-lite controller up` "
                           "again with --host-key-fingerprint SHA256:...")
    return HostKeyPlan(first_use=True, source="the key it presented a moment before")


def pick_expected(scanned: Sequence[str], expected: str, target: SshTarget) -> list[str]:
    """The one scanned known_hosts line whose key is ``expected``: whatever else a scan returned came over
    a connection nothing authenticated, so none of it is trusted. Raises ``HostKeyError``. Pure."""
    presented = {fingerprint(line): line for line in scanned}
    if expected not in presented:
        raise HostKeyError(f"{target.url} presents {', '.join(sorted(presented)) or 'no key'}, not the expected "
                           f"{expected}; refusing it")
    return host_lines(target, [presented[expected]])


def prove_host_keys(target: SshTarget, plan: HostKeyPlan, trusted: Sequence[str], folder: Path,
                    timeout_seconds: float = 60.0) -> list[str]:
    """Log in to ``target`` trusting only ``trusted`` (known_hosts lines; nothing on ``plan.first_use``),
    and return the keys the host proves on that authenticated connection, as known_hosts lines.

    OpenSSH does the proving (``UpdateHostKeys=yes``): after authenticating the host with a trusted key,
    sshd sends all its host keys (``hostkeys-00@openssh.com``), and ssh adds to the known_hosts file only
    those the host then signs for with this connection's session id (``hostkeys-prove-00@openssh.com``),
    and drops trusted keys the host no longer has. A man in the middle can add nothing: it cannot sign for
    the session of a connection the trusted key authenticated. The file is a scratch copy under
    ``folder``; the pinned file changes only when the caller writes the result. Raises ``HostKeyError``
    when the host presents no trusted key, ``ControllerError`` when the login fails otherwise.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="host-keys-", dir=folder) as scratch:
        known = Path(scratch) / "known_hosts"
        fd = os.open(known, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(known_hosts_text(target, trusted))
        # The first value of an option wins: these go before ssh_options', and ~/.ssh/config cannot undo them.
        proving = ["-o", "UpdateHostKeys=yes", "-o", "HashKnownHosts=no", "-o", "CheckHostIP=no",
                   "-o", "ControlMaster=no", "-o", "ControlPath=none"]
        if plan.first_use:
            # accept-new records the key of this connection only (ssh learns no more on a connection whose
            # key nobody trusted before); the strict connection below then learns what that key vouches for.
            _login(target, ["-o", "StrictHostKeyChecking=accept-new", *proving, *ssh_options(target, known, None)],
                   plan, timeout_seconds)
        _login(target, [*proving, *ssh_options(target, known, None)], plan, timeout_seconds)
        lines = [line for line in known.read_text().splitlines() if line.strip() and not line.startswith("#")]
    proven = host_lines(target, lines)
    if not proven:
        raise HostKeyError(f"{target.url} proved no host key")
    return proven


def _login(target: SshTarget, options: Sequence[str], plan: HostKeyPlan, timeout_seconds: float) -> None:
    try:
        result = subprocess.run(ssh_argv(target, options, "true"), capture_output=True, text=True,
                                timeout=timeout_seconds, stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise ControllerError("`ssh` was not found; install the OpenSSH client") from None
    except subprocess.TimeoutExpired:
        raise ControllerError(f"logging in to {target.url} took longer than {timeout_seconds:g}s") from None
    if result.returncode == 0:
        return
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    if any(sign in line for line in lines for sign in HOST_KEY_SIGNS):
        raise HostKeyError(f"the SSH host key of {target.url} changed: the host presents none of {plan.source}, "
                           "so nothing was pinned. If the host was rebuilt, check its new key (on its console) and "
                           "run `sky-lite controller up` again with --host-key-fingerprint NEW")
    raise ControllerError(f"cannot log in to {target.url} (exit {result.returncode}): "
                          f"{lines[-1] if lines else 'no message'}")



def scan_host_keys(target: SshTarget, timeout_seconds: float = 15.0) -> list[str]:
    """The host's public keys as known_hosts lines (``ssh-keyscan``), sorted. Trusted for nothing but
    ``pick_expected`` (the key the user checked) and telling that sshd answers. Raises ``ControllerError``
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


def known_hosts_text(target: SshTarget, lines: Sequence[str]) -> str:
    """A known_hosts file naming ``target`` the way ssh looks it up (keyscan already does for ports)."""
    out = []
    for line in lines:
        _, key_type, key = line.split()[:3]
        out.append(f"{target.known_hosts_name} {key_type} {key}\n")
    return "".join(out)
