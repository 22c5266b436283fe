"""Building the controller a command talks to, from the choice ``config`` makes."""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from skyserve_lite import api
from skyserve_lite.remote.config import (
    DEFAULT_REMOTE_HOME,
    Choice,
    ControllerRecord,
    choose_controller,
    known_hosts_path,
)
from skyserve_lite.remote.ssh import SshTarget, control_dir, ssh_argv, ssh_options

if TYPE_CHECKING:
    from skyserve_lite.remote.bootstrap import RemoteShell
    from skyserve_lite.remote.client import RemoteController
    from skyserve_lite.remote.transport import CommandTransport


def open_controller(home: Path, env: Mapping[str, str]) -> api.Controller:
    """This machine's controller, or a ``RemoteController`` of the recorded (or named) host; with several
    hosts recorded on one database, of the first, moving to the next when one does not answer."""
    choice = choose_controller(home, env)
    if choice.is_local:
        return api.LocalController(home)
    from skyserve_lite.remote.client import RemoteController  # not for a local controller: ~20 ms of start-up

    fallbacks = [ssh_transport(home, Choice(record=other)) for other in choice.others]
    return RemoteController(ssh_transport(home, choice), host_key_hint=_host_key_hint(choice),
                            submission_secret=submission_secret(home), say=_say, fallbacks=fallbacks)


def open_remote(home: Path, record: ControllerRecord, others: Sequence[ControllerRecord] = ()) -> RemoteController:
    """The ``RemoteController`` of the recorded host, moving to ``others`` in order when one does not answer."""
    from skyserve_lite.remote.client import RemoteController

    choice = Choice(record=record)
    return RemoteController(ssh_transport(home, choice), host_key_hint=_host_key_hint(choice),
                            submission_secret=submission_secret(home), say=_say,
                            fallbacks=[ssh_transport(home, Choice(record=other)) for other in others])


SUBMISSION_SECRET_FILE = "submission.key"


def submission_secret(home: Path) -> bytes | None:
    """The key of this state directory's submission digests (``client``): 32 random bytes made on first use
    in ``ssh/submission.key`` (mode 0600), so the same command run again from here sends the same
    idempotency key while no digest of a secret value can be guessed at on the host. None when it cannot be
    read or made (a read-only home, a file being written this instant): each submission then gets a random
    key, retried within one run but not recognized in the next."""
    path = home / "ssh" / SUBMISSION_SECRET_FILE
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            text = path.read_text().strip()
        else:
            text = secrets.token_hex(32)
            with os.fdopen(fd, "w") as stream:
                stream.write(text + "\n")
        secret = bytes.fromhex(text)
    except (OSError, ValueError):
        return None
    return secret if len(secret) == 32 else None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ssh_transport(home: Path, choice: Choice) -> CommandTransport:
    """``ssh ... HOST 'SKY_LITE_HOME=... exec <venv>/bin/sky-lite controller rpc'`` for the chosen host."""
    from skyserve_lite.remote.transport import CommandTransport  # not for a local controller

    if choice.record is not None:
        target: SshTarget = choice.record.target
        options = ssh_options(target, known_hosts_path(home), control_dir(home))
        command = (f"SKY_LITE_HOME={shlex.quote(choice.record.remote_home)} exec "
                   f"{shlex.quote(choice.record.executable)} controller rpc")
    else:
        assert choice.target is not None
        target = choice.target
        options = ssh_options(target, None, control_dir(home))  # the user's own known_hosts, strictly
        command = (f'SKY_LITE_HOME="$HOME"/{DEFAULT_REMOTE_HOME} exec "$HOME"/{DEFAULT_REMOTE_HOME}/venv/bin/sky-lite '
                   "controller rpc")
    return CommandTransport(ssh_argv(target, options, command), where=target.url)


def record_shell(home: Path, record: ControllerRecord) -> RemoteShell:
    from skyserve_lite.remote.bootstrap import RemoteShell

    return RemoteShell(record.target, ssh_options(record.target, known_hosts_path(home), control_dir(home)))


def _host_key_hint(choice: Choice) -> str:
    if choice.record is None:
        return "Check the host's key in your ~/.ssh/known_hosts."
    return (f"Pinned: {choice.record.fingerprint}. If the host was rebuilt, check its new key and run "
            "`sky-lite controller up` again with --host-key-fingerprint NEW.")
