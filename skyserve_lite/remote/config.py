"""Which controller the CLI talks to: this machine's, or the hosts recorded by `sky-lite controller up`.

The record is ``controller.json`` in the local state directory (mode 0600): where the host is, how to log
in (user, port, key file: a path, never the key), the host keys pinned at `controller up`, the remote state
directory, and for a VM sky-lite launched, what it launched and the controller id its permissions are scoped
to. ``SKY_LITE_CONTROLLER`` overrides the choice for one command: ``local``, or ``ssh://USER@HOST:PORT``.

Several hosts sharing one PostgreSQL database (`controller up --ssh HOST2 --db-url ...`) are recorded in
order, ``{"hosts": [record, ...]}`` (one host: the record alone, as before); the first is the one
`controller upgrade` and a host-less `controller down` act on, and the CLI tries them in that order
(``connect.open_controller``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
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
    """The first recorded controller host of ``home``; None when it has none (the controller is local)."""
    records = load_records(home)
    return records[0] if records else None


def load_records(home: Path) -> tuple[ControllerRecord, ...]:
    """Every recorded controller host of ``home``, in order; empty when the controller is local."""
    path = record_path(home)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as exc:
        raise ControllerError(f"cannot read {path}: {exc}") from exc
    try:
        if isinstance(document, dict) and set(document) == {"hosts"} and isinstance(document["hosts"], list):
            return tuple(decode(ControllerRecord, item, RECORD_FILE) for item in document["hosts"])
        return (decode(ControllerRecord, document, RECORD_FILE),)
    except ValueError as exc:
        raise ControllerError(f"{path} is damaged ({exc}); run `sky-lite controller up` again") from exc


def is_same_host(a: SshTarget, b: SshTarget) -> bool:
    return (a.host, a.port) == (b.host, b.port)


def plan_records(records: Sequence[ControllerRecord], record: ControllerRecord, *, add: bool = False
                 ) -> tuple[ControllerRecord, ...]:
    """``records`` with ``record`` saved: in place of the one of its host, else (``add``) after the others,
    else in place of the first (a controller VM whose address changed is still the first host)."""
    for index, kept in enumerate(records):
        if is_same_host(kept.target, record.target):
            return (*records[:index], record, *records[index + 1:])
    if add or not records:
        return (*records, record)
    return (record, *records[1:])


def save_pinned_keys(home: Path, record: ControllerRecord, *, add: bool = False) -> None:
    """Write the known_hosts file ssh reads, with ``record``'s host keys (before the first connection to it)
    beside those of the other recorded hosts."""
    _write_known_hosts(home, plan_records(load_records(home), record, add=add))


def _write_known_hosts(home: Path, records: Sequence[ControllerRecord]) -> None:
    from skyserve_lite.remote.ssh import known_hosts_text

    _write_private(known_hosts_path(home), "".join(known_hosts_text(r.target, r.host_keys) for r in records))


def save_record(home: Path, record: ControllerRecord, *, add: bool = False) -> None:
    """Write the record (and the pinned known_hosts file) atomically, private to the user: in place of the
    one of its host, else after the others (``add``: a host added to the same database), else in place of
    the first."""
    _save_records(home, plan_records(load_records(home), record, add=add))


def _save_records(home: Path, records: Sequence[ControllerRecord]) -> None:
    _write_known_hosts(home, records)
    document: object = encode(records[0]) if len(records) == 1 else {"hosts": [encode(r) for r in records]}
    _write_private(record_path(home), json.dumps(document, indent=2) + "\n")


def remove_record(home: Path) -> None:
    """Forget every recorded host: commands use this machine's controller again."""
    record_path(home).unlink(missing_ok=True)
    (home / "ssh" / KNOWN_HOSTS_FILE).unlink(missing_ok=True)


def remove_host(home: Path, record: ControllerRecord) -> None:
    """Forget the host of ``record`` (the others stay recorded); every host when it was the last."""
    left = tuple(kept for kept in load_records(home) if not is_same_host(kept.target, record.target))
    if left:
        _save_records(home, left)
    else:
        remove_record(home)


def find_record(records: Sequence[ControllerRecord], name: str) -> ControllerRecord | None:
    """The recorded host ``name`` designates: ``HOST``, ``HOST:PORT``, ``USER@HOST[:PORT]`` or its url."""
    text = name.removeprefix("ssh://")
    user, _, rest = text.rpartition("@")
    host, _, port = rest.partition(":") if not rest.startswith("[") else (rest, "", "")
    for record in records:
        target = record.target
        if host == target.host and (not port or port == str(target.port)) and (not user or user == target.user):
            return record
    return None


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
    # The other hosts recorded on the same database, tried in order when ``record``'s does not answer.
    others: tuple[ControllerRecord, ...] = ()

    @property
    def is_local(self) -> bool:
        return self.record is None and self.target is None


def choose_controller(home: Path, env: Mapping[str, str]) -> Choice:
    """Decide which controller a command talks to. Raises ``UsageError`` naming ``SKY_LITE_CONTROLLER``."""
    setting = env.get(SELECT_SETTING, "").strip()
    if setting == "local":
        return Choice(record=None)
    records = load_records(home)
    record = records[0] if records else None
    if not setting:
        return Choice(record=record, others=records[1:])
    if not setting.startswith("ssh://"):
        raise UsageError(f"{SELECT_SETTING}={setting!r}: use `local` or `ssh://USER@HOST:PORT`")
    target = parse_ssh_target(setting, what=SELECT_SETTING)
    for kept in records:
        if is_same_host(kept.target, target) and target.user in (None, kept.target.user):
            return Choice(record=kept)
    return Choice(record=None, target=target)
