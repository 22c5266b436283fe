"""Which controller the CLI talks to: this machine's, or the host recorded by `sky-lite controller up`.

The record is ``controller.json`` in the local state directory (mode 0600): where the host is, how to log
in (user, port, key file: a path, never the key), the host keys pinned at `controller up`, the remote state
directory, and for a VM sky-lite launched, what it launched and the controller id its permissions are scoped
to. ``SKY_LITE_CONTROLLER`` overrides the choice for one command: ``local``, or ``ssh://USER@HOST:PORT``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite.codec import decode, encode
from skyserve_lite.errors import ControllerError, UsageError
from skyserve_lite.remote.ssh import SshTarget, parse_ssh_target

RECORD_FILE = "controller.json"
KNOWN_HOSTS_FILE = "known_hosts"
SELECT_SETTING = "SKY_LITE_CONTROLLER"
DEFAULT_REMOTE_HOME = ".sky-lite"  # relative to the login user's home on the host


@dataclass(frozen=True)
class CloudMachine:
    """A controller VM that `controller up --cloud` launched, and what it created for it."""

    cloud: str
    region: str
    instance_id: str
    resources: tuple[tuple[str, str], ...] = ()  # (kind, id): security group, instance profile, role, key pair
    machine_id: str = ""  # names and tags what was made for it
    address: str | None = None  # the address clients reach it at
    zone: str | None = None  # where it is, when the cloud locates instances by zone (GCP)


@dataclass(frozen=True)
class ControllerRecord:
    """``controller_id`` is the id a controller VM's controller said at its first `controller up`, which its
    identity's permissions are scoped to (``hosting.grant_machine``); a later `controller up` refuses a VM that
    says another. Empty until then, and for an ``--ssh`` host (whose permissions are not sky-lite's)."""

    target: SshTarget
    remote_home: str  # absolute path on the host
    host_keys: tuple[str, ...]  # known_hosts lines pinned at `controller up`
    fingerprint: str  # of the first pinned key, for messages
    machine: CloudMachine | None = None
    controller_id: str = ""

    @property
    def venv(self) -> str:
        return f"{self.remote_home}/venv"

    @property
    def executable(self) -> str:
        return f"{self.venv}/bin/sky-lite"


def record_path(home: Path) -> Path:
    return home / RECORD_FILE


def load_record(home: Path) -> ControllerRecord | None:
    """The recorded controller of ``home``; None when it has none (the controller is local)."""
    path = record_path(home)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ControllerError(f"cannot read {path}: {exc}") from exc
    try:
        return decode(ControllerRecord, document, RECORD_FILE)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise ControllerError(f"{path} is damaged ({exc}); run `sky-lite controller up` again") from exc


def save_pinned_keys(home: Path, record: ControllerRecord) -> None:
    """Write the known_hosts file ssh reads for ``record``'s host (before the first connection to it)."""
    from skyserve_lite.remote.ssh import known_hosts_text

    _write_private(known_hosts_path(home), known_hosts_text(record.target, record.host_keys))


def save_record(home: Path, record: ControllerRecord) -> None:
    """Write the record (and the pinned known_hosts file) atomically, private to the user."""
    save_pinned_keys(home, record)
    _write_private(record_path(home), json.dumps(encode(record), indent=2) + "\n")


def remove_record(home: Path) -> None:
    record_path(home).unlink(missing_ok=True)
    (home / "ssh" / KNOWN_HOSTS_FILE).unlink(missing_ok=True)


def known_hosts_path(home: Path) -> Path:
    return home / "ssh" / KNOWN_HOSTS_FILE


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(text)
    os.replace(temporary, path)


@dataclass(frozen=True)
class Choice:
    """What ``SKY_LITE_CONTROLLER`` and the record say: local, or this host (with its record if any)."""

    record: ControllerRecord | None
    target: SshTarget | None = None  # a host named by SKY_LITE_CONTROLLER that has no record

    @property
    def is_local(self) -> bool:
        return self.record is None and self.target is None


def choose_controller(home: Path, env: Mapping[str, str]) -> Choice:
    """Decide which controller a command talks to. Raises ``UsageError`` naming ``SKY_LITE_CONTROLLER``."""
    setting = env.get(SELECT_SETTING, "").strip()
    if setting == "local":
        return Choice(record=None)
    record = load_record(home)
    if not setting:
        return Choice(record=record)
    if not setting.startswith("ssh://"):
        raise UsageError(f"{SELECT_SETTING}={setting!r}: use `local` or `ssh://USER@HOST:PORT`")
    target = parse_ssh_target(setting, what=SELECT_SETTING)
    if record is not None and (record.target.host, record.target.port) == (target.host, target.port) and (
            target.user in (None, record.target.user)):
        return Choice(record=record)
    return Choice(record=None, target=target)
