"""`sky-lite controller up / status / upgrade / down`: where the controller runs, and moving it to a host."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import click

from skyserve_lite import __version__
from skyserve_lite.cli.common import errors, get_controller, home_dir, stderr
from skyserve_lite.cli.params import FiniteFloatRange


@click.command("up")
@click.option("--ssh", "ssh_target", required=True, metavar="USER@HOST[:PORT]",
              help="An existing Linux host with python3 >= 3.10 and OpenSSH to run the controller on.")
@click.option("-i", "key_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The private key to log in with (default: ssh's own choice, ~/.ssh/config included).")
@click.option("--remote-home", default=None, metavar="DIR",
              help="The state directory on the host (default: ~/.sky-lite of the login user).")
@click.option("--remote-python", default="python3", show_default=True,
              help="The Python on the host that makes the controller's virtual environment.")
@click.option("--extra", "extras", multiple=True, type=click.Choice(["aws"]),
              help="Also install the dependencies of this cloud on the host (repeatable).")
@click.option("--host-key-fingerprint", default=None, metavar="SHA256:...",
              help="The host key to expect (from the host's console); default: trust the key the host presents "
              "the first time and pin it.")
def controller_up(ssh_target: str, key_file: Path | None, remote_home: str | None, remote_python: str,
                  extras: tuple[str, ...], host_key_fingerprint: str | None) -> None:
    """Install this sky-lite on a host and make it this machine's controller. Running it again repairs a
    half-done install."""
    from skyserve_lite.controller.host import HostSettings
    from skyserve_lite.errors import StateConflictError
    from skyserve_lite.remote import bootstrap, config, ssh
    from skyserve_lite.remote.connect import open_remote, record_shell
    from skyserve_lite.remote.wheel import build_wheel

    with errors():
        home = home_dir()
        target = ssh.parse_ssh_target(ssh_target, key_file=key_file.resolve() if key_file else None)
        _check_remote_text("--remote-home", remote_home)
        _check_remote_text("--remote-python", remote_python)
        previous = config.load_record(home)
        same_host = previous is not None and (previous.target.host, previous.target.port) == (target.host, target.port)
        if previous is not None and not same_host:
            raise StateConflictError(f"this machine's controller is recorded at {previous.target.url}; take it "
                                     "down first with `sky-lite controller down`")
        if previous is None and _has_local_services(home):
            raise StateConflictError(f"this machine's own controller ({home}) holds services; take them down "
                                     "with `sky-lite serve down --all` before moving the controller to a host")
        pinned = previous.host_keys if previous is not None else ()
        keys = ssh.pin_host_keys(ssh.scan_host_keys(target), pinned, host_key_fingerprint, target)
        record = config.ControllerRecord(target=target, remote_home=previous.remote_home if previous else "",
                                         host_keys=tuple(keys), fingerprint=ssh.fingerprint(keys[0]),
                                         machine=previous.machine if previous else None)
        config.save_pinned_keys(home, record)
        shell = record_shell(home, record)
        if remote_home is None and previous is not None:
            remote_home = previous.remote_home
        home_there = bootstrap.find_remote_home(shell, remote_home)
        settings = HostSettings(lb_host="127.0.0.1" if target.is_loopback else "0.0.0.0", endpoint_host=target.host)
        plan = bootstrap.HostPlan(remote_home=home_there, python=remote_python, extras=extras, settings=settings)
        with tempfile.TemporaryDirectory(prefix="sky-lite-wheel-") as folder:
            wheel = build_wheel(Path(folder))
            bootstrap.install(shell, plan, home_there, wheel, restart=False,
                              say=lambda line: click.echo(f"  {line}", err=True))
        record = config.ControllerRecord(target=target, remote_home=home_there, host_keys=tuple(keys),
                                         fingerprint=ssh.fingerprint(keys[0]), machine=record.machine)
        config.save_record(home, record)
        info = open_remote(home, record).describe()
        click.echo(f"The controller runs on {target.url} (sky-lite {info.sky_lite}, state in {home_there}); "
                   f"host key {record.fingerprint} pinned. Every `sky-lite serve` command now talks to it.")


def _check_remote_text(option: str, value: str | None) -> None:
    from skyserve_lite.errors import UsageError

    if value is not None and (not value or any(c in value for c in "\n\r\0") or value.startswith("-")):
        raise UsageError(f"{option}: {value!r} is not a usable path")


def _has_local_services(home: Path) -> bool:
    from skyserve_lite.state.store import Store

    if not (home / "state.db").exists():
        return False
    store = Store.open(home)
    try:
        return bool(store.list_services())
    finally:
        store.close()


@click.command("status")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format; json prints only JSON on stdout.")
def controller_status(output: str) -> None:
    """Where the controller runs, its sky-lite version, its loop, its cron lines and its services."""
    from skyserve_lite.api import LocalController
    from skyserve_lite.clock import format_timestamp
    from skyserve_lite.errors import UsageError
    from skyserve_lite.remote.client import RemoteController
    from skyserve_lite.remote.server import describe_host

    with errors():
        controller = get_controller()
        if isinstance(controller, RemoteController):
            info = controller.describe()  # versionless: answers a host of any version
            where = controller.transport.where
        elif isinstance(controller, LocalController):
            info = describe_host(controller)
            where = "this machine"
        else:
            raise UsageError("`controller status` needs this machine's or a host's controller")
        document = {"where": where, "home": info.home, "sky_lite": info.sky_lite, "client_sky_lite": __version__,
                    "build": info.build, "running": info.running, "pid": info.pid,
                    "last_pass_at": format_timestamp(info.last_pass_at), "cron_installed": info.cron_installed,
                    "services": list(info.services)}
        if output == "json":
            click.echo(json.dumps(document, indent=2))
            return
        age = "" if info.last_pass_at is None else f" ({time.time() - info.last_pass_at:.0f}s ago)"
        cron = {True: "installed", False: "not installed", None: "unknown (crontab not readable)"}[info.cron_installed]
        lines = [f"Controller: {where} (state in {info.home})",
                 f"sky-lite:   {info.sky_lite}" + ("" if info.sky_lite == __version__ else
                                                  f" (this client: {__version__}; run `sky-lite controller upgrade`)"),
                 f"Loop:       {'running, pid ' + str(info.pid) if info.running else 'not running'}",
                 f"Last pass:  {format_timestamp(info.last_pass_at) or 'none yet'}{age}",
                 f"Cron lines: {cron}",
                 f"Services:   {', '.join(info.services) if info.services else 'none'}"]
        click.echo("\n".join(lines))


@click.command("upgrade")
def controller_upgrade() -> None:
    """Install this sky-lite on the controller host and restart its loop (replicas and load balancers keep
    serving)."""
    from skyserve_lite.errors import UsageError
    from skyserve_lite.remote import bootstrap, config
    from skyserve_lite.remote.connect import open_remote, record_shell
    from skyserve_lite.remote.wheel import build_wheel

    with errors():
        home = home_dir()
        record = config.load_record(home)
        if record is None:
            raise UsageError("no controller host is recorded; the controller runs on this machine (set one up "
                             "with `sky-lite controller up --ssh USER@HOST`)")
        shell = record_shell(home, record)
        from skyserve_lite.controller.host import HostSettings

        target = record.target
        settings = HostSettings(lb_host="127.0.0.1" if target.is_loopback else "0.0.0.0", endpoint_host=target.host)
        plan = bootstrap.HostPlan(remote_home=record.remote_home, settings=settings,
                                  python=os.environ.get("SKY_LITE_REMOTE_PYTHON", "python3"))
        with tempfile.TemporaryDirectory(prefix="sky-lite-wheel-") as folder:
            bootstrap.install(shell, plan, record.remote_home, build_wheel(Path(folder)), restart=True,
                              say=lambda line: click.echo(f"  {line}", err=True))
        info = open_remote(home, record).describe()
        click.echo(f"The controller on {target.url} runs sky-lite {info.sky_lite} now.")


@click.command("down")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Take every service down first.")
@click.option("--timeout", type=FiniteFloatRange(min=0), default=600.0, show_default=True,
              help="With --force: seconds to wait for the services to go.")
def controller_down(yes: bool, force: bool, timeout: float) -> None:
    """Stop the controller and remove its cron lines (refused while it holds services, unless --force)."""
    from skyserve_lite.controller.cron import uninstall_cron
    from skyserve_lite.controller.daemon import stop_controller
    from skyserve_lite.errors import StateConflictError
    from skyserve_lite.remote import bootstrap, config
    from skyserve_lite.remote.connect import record_shell

    with errors():
        home = home_dir()
        controller = get_controller()
        record = config.load_record(home)
        names = [view.service.name for view in controller.get_status()]
        where = record.target.url if record is not None else "this machine"
        if names and not force:
            raise StateConflictError(f"the controller on {where} holds {', '.join(names)}; take them down with "
                                     "`sky-lite serve down --all`, or pass --force")
        if not yes:
            what = f" and take down {', '.join(names)}" if names else ""
            click.confirm(f"Stop the controller on {where}{what}?", abort=True)
        if names:
            controller.request_down(names)
            with stderr().status(f"Taking down {', '.join(names)}..."):
                controller.finish_down(names, timeout)
        if record is not None:
            shell = record_shell(home, record)
            bootstrap.uninstall(shell, record.remote_home)
            shell.close()
            config.remove_record(home)
            click.echo(f"The controller on {where} is stopped and its cron lines are removed (its state stays in "
                       f"{record.remote_home} there). Commands use this machine's controller again.")
            return
        uninstall_cron(home)
        stop_controller(home)
        click.echo(f"The controller of {home} is stopped and its cron lines are removed.")


COMMANDS = (controller_up, controller_status, controller_upgrade, controller_down)
