"""Installing sky-lite on a controller host over SSH: `controller up`, `controller upgrade`, `controller down`.

Each step is a shell command run with ``RemoteShell`` (the system ssh client, pinned host key, the shared
connection) and is idempotent, so running `controller up` again repairs a half-done bootstrap:

1. find the login user's home and check the host's Python (>= 3.10, with ``venv``);
2. copy the wheel of this exact sky-lite (``wheel``) to ``<remote home>/wheels/``;
3. make ``<remote home>/venv`` if missing and install the wheel there (its dependencies from the package
   index the host reaches), then the same wheel again over whatever was installed;
4. write the host settings (where load balancers listen and endpoints point), install the cron lines, and
   start the controller loop (for an upgrade, stop the running loop first: replicas and load balancers are
   processes of their own and keep serving).

Nothing secret crosses but a database password: the host's cloud access is its own (an instance profile, a
service account, its own credential chain); the only file sent is the wheel. With ``--db-url`` the host's
state lives in that PostgreSQL database: the URL reaches the host on ssh's stdin (`sky-lite config set db_url
-`), which keeps its password in the host's libpq password file (0600), never on a command line.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skyserve_lite.controller.host import HostSettings
from skyserve_lite.errors import ControllerError
from skyserve_lite.remote.ssh import SshTarget, ssh_argv
from skyserve_lite.remote.wheel import wheel_name
from skyserve_lite.state.dburl import DatabaseUrl

_PIP = ("-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input")


class RemoteShell:
    """Runs shell command lines on the host as the login user."""

    def __init__(self, target: SshTarget, options: Sequence[str]) -> None:
        self.target = target
        self._options = list(options)

    def run(self, command: str, *, what: str, stdin: bytes | None = None, timeout_seconds: float = 900) -> str:
        """Run ``command``; its stdout. Raises ``ControllerError`` saying ``what`` failed, with stderr's end."""
        argv = ssh_argv(self.target, self._options, command)
        try:
            result = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_seconds, check=False)
        except FileNotFoundError:
            raise ControllerError("`ssh` was not found; install the OpenSSH client") from None
        except subprocess.TimeoutExpired:
            raise ControllerError(f"{what} on {self.target.url} did not finish within {timeout_seconds:g}s") from None
        if result.returncode != 0:
            lines = [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
            tail = " | ".join(lines[-3:]) or "no message"
            raise ControllerError(f"{what} on {self.target.url} failed (exit {result.returncode}): {tail}")
        return result.stdout.decode(errors="replace")

    def close(self) -> None:
        """End the shared connection to the host, if one is open (``ssh -O exit``); never raises."""
        argv = ["ssh", *self._options, "-O", "exit", "--", self.target.destination]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=15, check=False)


@dataclass(frozen=True)
class HostPlan:
    """What to install where on the host."""

    remote_home: str | None  # None: ~/.sky-lite of the login user; relative: under the login user's home
    python: str = "python3"
    extras: tuple[str, ...] = ()  # the package's extras to install ("aws", "postgres")
    settings: HostSettings = field(default_factory=HostSettings)
    database: DatabaseUrl | None = None  # where the host's state lives (None: SQLite in its home, or as set)


def find_remote_home(shell: RemoteShell, remote_home: str | None) -> str:
    """The absolute path of the state directory on the host."""
    login_home = shell.run("cd && pwd", what="finding the login user's home").strip()
    if not login_home.startswith("/"):
        raise ControllerError(f"the login user's home on {shell.target.url} is not an absolute path: {login_home!r}")
    if remote_home is None:
        return f"{login_home}/.sky-lite"
    if remote_home.startswith("~/"):
        return f"{login_home}/{remote_home[2:]}"
    return remote_home if remote_home.startswith("/") else f"{login_home}/{remote_home}"


def install(shell: RemoteShell, plan: HostPlan, home: str, wheel: Path, *, restart: bool,
            say: Callable[[str], None] = lambda _line: None) -> None:
    """Steps 1-4 of the module docstring against ``home`` (absolute). Idempotent."""
    q = shlex.quote
    python, venv = q(plan.python), f"{home}/venv"
    say(f"checking {plan.python} on the host")
    shell.run(f"{python} -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 10) else 3)'",
              what=f"checking for Python >= 3.10 with venv (`{plan.python}`; pass --remote-python)")
    say(f"copying {wheel.name} to {home}/wheels")
    remote_wheel = f"{home}/wheels/{wheel_name()}"
    shell.run(f"umask 077 && mkdir -p {q(home)}/wheels && cat > {q(remote_wheel)}.part && "
              f"mv {q(remote_wheel)}.part {q(remote_wheel)}", what="copying the wheel", stdin=wheel.read_bytes())
    say(f"installing sky-lite into {venv}")
    shell.run(f"test -x {q(venv)}/bin/python || {python} -m venv {q(venv)}", what="making the virtual environment")
    requirement = remote_wheel + (f"[{','.join(plan.extras)}]" if plan.extras else "")
    pip = shlex.join([f"{venv}/bin/python", *_PIP])
    shell.run(f"{pip} {q(requirement)} && {pip} --force-reinstall --no-deps {q(remote_wheel)}",
              what="installing sky-lite and its dependencies")
    run = remote_sky_lite(home)
    profile, account = plan.settings.aws_instance_profile, plan.settings.gcp_service_account
    shell.run(run("controller", "host-settings", "--lb-host", plan.settings.lb_host,
                  "--endpoint-host", plan.settings.endpoint_host,
                  *(("--aws-instance-profile", profile) if profile else ()),
                  *(("--gcp-service-account", account) if account else ())), what="writing the host settings")
    if plan.database is not None:
        say(f"pointing the host's state at {plan.database}")
        # The whole URL travels on ssh's stdin (`config set db_url -`): the host keeps a password in its
        # libpq password file, 0600, and never sees it on a command line.
        shell.run(run("config", "set", "db_url", "-"), what="setting the host's database (--db-url)",
                  stdin=(plan.database.text_with_password() + "\n").encode())
    say("installing the cron lines")
    shell.run(run("controller", "cron", "install"), what="installing the cron lines")
    if restart:
        say("restarting the controller loop")
        shell.run(run("controller", "stop"), what="stopping the controller loop")
    else:
        say("starting the controller loop")
    shell.run(run("controller", "ensure"), what="starting the controller loop")


def remote_sky_lite(home: str) -> Callable[..., str]:
    """A function making the command line that runs ``sky-lite ARGS`` on the host against ``home``."""
    executable = f"{home}/venv/bin/sky-lite"

    def command(*args: str) -> str:
        return f"SKY_LITE_HOME={shlex.quote(home)} {shlex.join([executable, *args])}"
    return command


def hand_over(shell: RemoteShell, home: str) -> None:
    """Take one host out of several on one database: remove its cron lines, stop its loop (which releases
    its leases as it stops, so the other controllers take its services at their next pass instead of after
    the lease TTL) and its load balancers (the host leaves the endpoints). Its replicas are the services'
    and stay. Idempotent."""
    run = remote_sky_lite(home)
    shell.run(run("controller", "cron", "remove"), what="removing the cron lines")
    shell.run(run("controller", "stop", "--load-balancers"), what="stopping the controller loop")


def uninstall(shell: RemoteShell, home: str) -> None:
    """Remove the cron lines and stop the controller loop (the state directory stays, for the record)."""
    run = remote_sky_lite(home)
    shell.run(run("controller", "cron", "remove"), what="removing the cron lines")
    shell.run(run("controller", "stop"), what="stopping the controller loop")
