"""`sky-lite controller up / status / upgrade / down`: where the controller runs, and moving it to a host."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from skyserve_lite import __version__
from skyserve_lite.cli.common import errors, get_controller, home_dir, stderr
from skyserve_lite.cli.params import FiniteFloatRange

if TYPE_CHECKING:
    from skyserve_lite.controller.fleet import ControllerView
    from skyserve_lite.remote.client import RemoteController
    from skyserve_lite.remote.config import ControllerRecord


@click.command("up")
@click.option("--ssh", "ssh_target", default=None, metavar="USER@HOST[:PORT]",
              help="An existing Linux host with python3 >= 3.10 and OpenSSH to run the controller on.")
@click.option("--cloud", type=click.Choice(["aws", "gcp"]), default=None,
              help="Launch a controller VM on this cloud instead (tagged as this state directory's).")
@click.option("-i", "key_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="With --ssh: the private key to log in with (default: ssh's own choice, ~/.ssh/config "
              "included).")
@click.option("--remote-home", default=None, metavar="DIR",
              help="The state directory on the host (default: ~/.sky-lite of the login user).")
@click.option("--remote-python", default="python3", show_default=True,
              help="The Python on the host that makes the controller's virtual environment.")
@click.option("--extra", "extras", multiple=True, type=click.Choice(["aws"]),
              help="Also install the dependencies of this cloud on the host (repeatable; --cloud adds its own).")
@click.option("--host-key-fingerprint", default=None, metavar="SHA256:...",
              help="The host key to expect (from the host's console). Default: with --cloud, the keys the cloud "
              "reports; with --ssh, the key the host presents the first time. Only keys the host then proves on "
              "a login are pinned.")
@click.option("--region", default=None, help="With --cloud: the region (default: the cloud's configured one).")
@click.option("--zone", default=None, help="With --cloud: the zone (default: the cloud's choice).")
@click.option("--instance-type", default=None,
              help="With --cloud: the VM type (default: t3.small on aws, e2-small on gcp).")
@click.option("--image-id", default=None,
              help="With --cloud: the image (an AMI on aws, required the first time; default Debian 12 on gcp).")
@click.option("--ssh-user", default="ubuntu", show_default=True, help="With --cloud: the image's login user.")
@click.option("--allow-cidr", default=None, metavar="CIDR",
              help="With --cloud: who may reach the load balancers (default: 0.0.0.0/0, every address; the "
              "security group's only other rule is SSH).")
@click.option("--ssh-cidr", default=None, metavar="CIDR",
              help="With --cloud, required: who may reach sshd, e.g. your address/32 (an --allow-cidr given is "
              "taken when this is not; 0.0.0.0/0 only when written out).")
@click.option("--db-url", "db_url", default=None, metavar="postgresql://USER[:PASSWORD]@HOST[:PORT]/DB",
              help="Keep the host's state in this PostgreSQL database; with a host recorded already, add this "
              "one beside it (every host on one database). - reads the URL from standard input. The password "
              "goes to the host's libpq password file, never to a command line.")
def controller_up(ssh_target: str | None, cloud: str | None, key_file: Path | None, remote_home: str | None,
                  remote_python: str, extras: tuple[str, ...], host_key_fingerprint: str | None,
                  region: str | None, zone: str | None, instance_type: str | None, image_id: str | None,
                  ssh_user: str, allow_cidr: str | None, ssh_cidr: str | None, db_url: str | None) -> None:
    """Install this sky-lite on a host (--ssh) or on a VM launched for it (--cloud) and make it this
    machine's controller; with --db-url, one more controller host on the same database. Running it again
    repairs a half-done install."""
    from skyserve_lite.errors import StateConflictError, UsageError
    from skyserve_lite.remote import config, hosting, ssh
    from skyserve_lite.remote.connect import open_remote
    from skyserve_lite.state.dburl import parse_database_url

    with errors():
        database = None
        if db_url is not None:
            text = sys.stdin.readline().strip() if db_url == "-" else db_url
            database = parse_database_url(text, "--db-url")
            if db_url != "-" and database.password is not None:
                click.echo("Note: a password on the command line can be seen by other users of this machine and in "
                           "your shell's history; `--db-url -` reads the URL from standard input.", err=True)
        if (ssh_target is None) == (cloud is None):
            raise UsageError("pass --ssh USER@HOST or --cloud CLOUD (one of them)")
        cloud_only = {"--region": region, "--zone": zone, "--instance-type": instance_type, "--image-id": image_id,
                      "--ssh-cidr": ssh_cidr, "--allow-cidr": allow_cidr}
        if ssh_target is not None and any(v is not None for v in cloud_only.values()):
            raise UsageError(f"{next(k for k, v in cloud_only.items() if v is not None)} goes with --cloud")
        if cloud is not None and key_file is not None:
            raise UsageError("-i goes with --ssh (a VM launched with --cloud gets a key made for it)")
        _check_remote_text("--remote-home", remote_home)
        _check_remote_text("--remote-python", remote_python)
        for option, cidr in (("--allow-cidr", allow_cidr), ("--ssh-cidr", ssh_cidr)):
            _check_cidr(option, cidr)
        ssh_block = None if cloud is None else choose_ssh_cidr(ssh_cidr, allow_cidr)
        home = home_dir()
        adding = database is not None and config.load_record(home) is not None
        if not adding and _has_local_services(home):
            raise StateConflictError(f"this machine's own controller ({home}) holds services; take them down "
                                     "with `sky-lite serve down --all` before moving the controller to a host")
        target = (ssh.parse_ssh_target(ssh_target, key_file=key_file.resolve() if key_file else None)
                  if ssh_target is not None else None)
        if ssh_block is not None and _is_everyone(ssh_block):
            click.echo(f"Warning: --ssh-cidr {ssh_block} opens SSH (port 22) of the controller VM to every "
                       "address; give your own block (e.g. 203.0.113.7/32) to narrow it.", err=True)
        request = hosting.UpRequest(
            target=target, remote_home=remote_home, remote_python=remote_python, extras=extras,
            host_key_fingerprint=host_key_fingerprint, database=database,
            cloud=None if cloud is None else hosting.CloudRequest(
                cloud=cloud, region=region, zone=zone, instance_type=instance_type, image_id=image_id,
                ssh_user=ssh_user, allow_cidr=allow_cidr or hosting.DEFAULT_ALLOW_CIDR, ssh_cidr=ssh_block))
        record = hosting.bring_up(home, request, say=lambda line: click.echo(f"  {line}", err=True))
        info = open_remote(home, record).describe()
        where = record.target.url + (f" ({record.machine.cloud} {record.machine.instance_id})" if record.machine
                                     else "")
        hosts = config.load_records(home)
        if len(hosts) > 1:
            _warn_if_elsewhere(home, hosts[0], info.controller_id)
            click.echo(f"A controller runs on {where} too (sky-lite {info.sky_lite}, state in {database}); host "
                       f"key {record.fingerprint} pinned. Commands try {', '.join(h.target.url for h in hosts)} in "
                       "that order.")
        else:
            click.echo(f"The controller runs on {where} (sky-lite {info.sky_lite}, state in "
                       f"{database or record.remote_home}); host key {record.fingerprint} pinned. Every "
                       "`sky-lite serve` command now talks to it.")
        if info.cron_running is False:
            click.echo(f"Warning: no cron daemon runs on {record.target.url}: the cron lines are installed but "
                       "nothing runs them, so nothing restarts the controller loop if it stops or the host "
                       "reboots. Start cron there (Debian and Ubuntu: `sudo systemctl enable --now cron`).",
                       err=True)


def _warn_if_elsewhere(home: Path, first: ControllerRecord, controller_id: str | None) -> None:
    """Warn when the first recorded host keeps its state in another database than the host just added (its
    store's controller id differs): the two would not share their services. Silent when it cannot tell."""
    from skyserve_lite.errors import SkyLiteError
    from skyserve_lite.remote.connect import open_remote

    try:
        theirs = open_remote(home, first).describe().controller_id
    except SkyLiteError:
        return
    if theirs and controller_id and theirs != controller_id:
        click.echo(f"Warning: {first.target.url} keeps its state in another database (controller id {theirs}, this "
                   f"host's {controller_id}): the hosts do not share services. Give it the same database with "
                   f"`sky-lite controller up --ssh {first.target.url} --db-url -`.", err=True)


def choose_ssh_cidr(ssh_cidr: str | None, allow_cidr: str | None) -> str:
    """Who may reach a controller VM's sshd: ``--ssh-cidr``, else an ``--allow-cidr`` that was given. Never a
    default: with neither, a ``UsageError`` naming ``--ssh-cidr``."""
    from skyserve_lite.errors import UsageError

    chosen = ssh_cidr or allow_cidr
    if chosen is None:
        raise UsageError("--ssh-cidr: say who may reach the controller VM's sshd, e.g. --ssh-cidr 203.0.113.7/32 "
                         "(your address); --ssh-cidr 0.0.0.0/0 opens it to every address")
    return chosen


def _is_everyone(cidr: str) -> bool:
    import ipaddress

    return ipaddress.ip_network(cidr, strict=True).prefixlen == 0


def _check_cidr(option: str, value: str | None) -> None:
    import ipaddress

    from skyserve_lite.errors import UsageError

    if value is None:
        return
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise UsageError(f"{option}: {value!r} is not a CIDR block ({exc})") from None
    if network.version != 4:
        raise UsageError(f"{option}: {value!r} is IPv6; give an IPv4 block such as 203.0.113.0/24")


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
    """Where the controller runs, its sky-lite version, its loop, its cron lines and its services; and every
    controller sharing its database (id, host, services owned, last renewal, live or not)."""
    import json

    from skyserve_lite.api import LocalController
    from skyserve_lite.clock import format_timestamp
    from skyserve_lite.controller.fleet import list_controller_views
    from skyserve_lite.errors import ControllerVersionError, UsageError
    from skyserve_lite.remote.client import RemoteController
    from skyserve_lite.remote.server import describe_host

    with errors():
        controller = get_controller()
        if isinstance(controller, RemoteController):
            info = controller.describe()  # versionless: answers a host of any version
            where = controller.transport.where
            try:
                views = controller.list_controllers()
            except (ControllerVersionError, UsageError):
                views = None  # a host of another version: `controller upgrade` first
        elif isinstance(controller, LocalController):
            info = describe_host(controller)
            where = "this machine"
            views = list_controller_views(controller.home)
        else:
            raise UsageError("`controller status` needs this machine's or a host's controller")
        controllers = None if views is None else [
            {"id": view.loop_id, "host": view.host, "services": list(view.services),
             "last_renewal": format_timestamp(view.renewed_at), "live": view.live} for view in views]
        document = {"where": where, "home": info.home, "sky_lite": info.sky_lite, "client_sky_lite": __version__,
                    "build": info.build, "running": info.running, "pid": info.pid,
                    "last_pass_at": format_timestamp(info.last_pass_at), "cron_installed": info.cron_installed,
                    "cron_running": info.cron_running, "services": list(info.services),
                    "controllers": controllers}
        if output == "json":
            click.echo(json.dumps(document, indent=2))
            return
        age = "" if info.last_pass_at is None else f" ({time.time() - info.last_pass_at:.0f}s ago)"
        cron = describe_cron(info.cron_installed, info.cron_running)
        lines = [f"Controller: {where} (state in {info.home})",
                 f"sky-lite:   {info.sky_lite}" + ("" if info.sky_lite == __version__ else
                                                  f" (this client: {__version__}; run `sky-lite controller upgrade`)"),
                 f"Loop:       {'running, pid ' + str(info.pid) if info.running else 'not running'}",
                 f"Last pass:  {format_timestamp(info.last_pass_at) or 'none yet'}{age}",
                 f"Cron lines: {cron}",
                 f"Services:   {', '.join(info.services) if info.services else 'none'}"]
        if views is None:
            lines.append("Controllers: unknown (the host runs another sky-lite; `sky-lite controller upgrade`)")
        else:
            lines += ["", *render_controllers(views, time.time())]
        click.echo("\n".join(lines))


def render_controllers(views: Sequence[ControllerView], now: float) -> list[str]:
    """The `Controllers sharing the database` table of `controller status`."""
    if not views:
        return ["Controllers sharing the database: none has run a pass yet"]
    rows = [("ID", "HOST", "SERVICES", "LAST RENEWAL", "LIVE")]
    rows += [(view.loop_id, view.host, ",".join(view.services) or "-", f"{max(0.0, now - view.renewed_at):.0f}s ago",
              "yes" if view.live else "no") for view in views]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return [f"Controllers sharing the database ({sum(view.live for view in views)} live):", *table]


def describe_cron(installed: bool | None, running: bool | None) -> str:
    """The `Cron lines:` of `controller status`: whether the lines are in the crontab, and whether a cron
    daemon runs them (None: the host cannot tell, having no /proc, or is older and does not say)."""
    lines = {True: "installed", False: "not installed", None: "unknown (crontab not readable)"}[installed]
    if running is None:
        return f"{lines} (cron daemon: unknown)"
    if running:
        return f"{lines}; the cron daemon runs"
    if installed:
        return ("installed, but no cron daemon runs: nothing restarts the loop if it stops (start cron; Debian "
                "and Ubuntu: `sudo systemctl enable --now cron`)")
    return f"{lines}; no cron daemon runs"


@click.command("upgrade")
@click.option("--remote-python", default="python3", show_default=True,
              help="The Python on the host that makes the virtual environment, if it has to be made again.")
def controller_upgrade(remote_python: str) -> None:
    """Install this sky-lite on the controller host and restart its loop (replicas and load balancers keep
    serving)."""
    from skyserve_lite.errors import UsageError
    from skyserve_lite.remote import bootstrap, config, hosting
    from skyserve_lite.remote.connect import open_remote, record_shell

    with errors():
        _check_remote_text("--remote-python", remote_python)
        home = home_dir()
        record = config.load_record(home)
        if record is None or not record.remote_home:
            raise UsageError("no controller host is recorded; the controller runs on this machine (set one up "
                             "with `sky-lite controller up --ssh USER@HOST`)")
        extras = (record.machine.cloud,) if record.machine is not None else ()
        plan = bootstrap.HostPlan(remote_home=record.remote_home, python=remote_python, extras=extras,
                                  settings=hosting.host_settings_of(record))
        hosting.install_wheel(record_shell(home, record), plan, record.remote_home, restart=True,
                              say=lambda line: click.echo(f"  {line}", err=True))
        info = open_remote(home, record).describe()
        click.echo(f"The controller on {record.target.url} runs sky-lite {info.sky_lite} now.")


@click.command("down")
@click.argument("host", required=False, metavar="[HOST|ID]")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Take every service down first; with HOST among several, forget it "
              "even if it cannot be reached.")
@click.option("--timeout", type=FiniteFloatRange(min=0), default=600.0, show_default=True,
              help="With --force: seconds to wait for the services to go; with HOST, for the other controllers "
              "to take its services.")
def controller_down(host: str | None, yes: bool, force: bool, timeout: float) -> None:
    """Stop the controller and remove its cron lines (refused while it holds services, unless --force). With
    several hosts on one database, HOST (or a controller id of `controller status`) names the one to stop:
    it hands its services over to the others first."""
    from skyserve_lite.controller.cron import uninstall_cron
    from skyserve_lite.controller.daemon import stop_controller
    from skyserve_lite.errors import ControllerError, SkyLiteError, StateConflictError, UsageError
    from skyserve_lite.remote import bootstrap, config, hosting
    from skyserve_lite.remote.connect import record_shell

    with errors():
        home = home_dir()
        records = config.load_records(home)
        if host is not None or len(records) > 1:
            if host is None:
                raise UsageError("HOST: several controller hosts are recorded ("
                                 f"{', '.join(r.target.url for r in records)}); name the one to stop")
            chosen = _find_host_record(home, records, host)
            if len(records) > 1:
                hand_over_host(home, chosen, records, yes=yes, timeout=timeout, force=force)
                return
        choice = config.choose_controller(home, os.environ)
        if choice.target is not None:
            raise UsageError(f"{config.SELECT_SETTING} names a host that `controller up` did not record; "
                             "`controller down` acts on the recorded host or on this machine")
        record = choice.record
        controller = get_controller()
        where = record.target.url if record is not None else "this machine"

        def say(line: str) -> None:
            click.echo(f"  {line}", err=True)

        names: list[str] = []
        reachable = True
        if record is None or record.remote_home:  # a VM whose bootstrap never finished holds nothing
            try:
                names = [view.service.name for view in controller.get_status()]
            except ControllerError as exc:
                if not (force and record is not None and record.machine is not None):
                    raise
                say(f"the controller VM does not answer ({exc}); terminating it anyway")
                reachable = False
        if names and not force:
            raise StateConflictError(f"the controller on {where} holds {', '.join(names)}; take them down with "
                                     "`sky-lite serve down --all`, or pass --force")
        if not yes:
            what = f" and take down {', '.join(names)}" if names else ""
            vm = f" and terminate its VM {record.machine.instance_id}" if record and record.machine else ""
            click.confirm(f"Stop the controller on {where}{what}{vm}?", abort=True)
        if names:
            controller.request_down(names)
            with stderr().status(f"Taking down {', '.join(names)}..."):
                controller.finish_down(names, timeout)
        if record is not None:
            shell = record_shell(home, record)
            if record.remote_home and reachable:
                bootstrap.uninstall(shell, record.remote_home)
            shell.close()
            config.remove_record(home)
            if record.machine is not None:
                try:
                    hosting.take_down_machine(home, record.machine, say=say)
                except SkyLiteError:
                    config.save_record(home, record)  # not gone yet: keep what `controller down` needs to retry
                    raise
                click.echo(f"The controller VM {record.machine.instance_id} and everything made for it are gone. "
                           "Commands use this machine's controller again.")
                return
            click.echo(f"The controller on {where} is stopped and its cron lines are removed (its state stays in "
                       f"{record.remote_home} there). Commands use this machine's controller again.")
            return
        uninstall_cron(home)
        stop_controller(home)
        click.echo(f"The controller of {home} is stopped and its cron lines are removed.")


def _find_host_record(home: Path, records: Sequence[ControllerRecord], name: str) -> ControllerRecord:
    """The recorded host ``name`` designates (``config.find_record``), or the host of the controller whose id
    it is (asked of the recorded hosts). Raises ``UsageError`` naming HOST."""
    from skyserve_lite.errors import UsageError
    from skyserve_lite.remote import config

    found = config.find_record(records, name)
    if found is None and records:
        views = _open_hosts(home, records).list_controllers()
        hosts = {view.host for view in views if view.loop_id == name}
        found = next((record for record in records if record.target.host in hosts), None)
    if found is None:
        recorded = ", ".join(record.target.url for record in records) or "none"
        raise UsageError(f"HOST: {name!r} is neither a recorded controller host (recorded: {recorded}) nor the id "
                         "of one of their controllers (`sky-lite controller status` lists them)")
    return found


def _open_hosts(home: Path, records: Sequence[ControllerRecord]) -> RemoteController:
    """A client of ``records``' hosts: the first, moving to the next when one does not answer."""
    from skyserve_lite.remote.connect import open_remote

    first, *others = records
    return open_remote(home, first, others)


def hand_over_host(home: Path, record: ControllerRecord, records: Sequence[ControllerRecord], *, yes: bool,
                   timeout: float, force: bool = False, sleep: Callable[[float], None] = time.sleep) -> None:
    """`controller down HOST` with other hosts on the database: refused unless a controller of another host
    is live to take the services; then the host's loop stops, releasing its leases
    (``bootstrap.hand_over``), the record forgets it, and the command waits up to ``timeout`` for live
    controllers of the other hosts to hold every service it held. A host that cannot be reached is
    forgotten only with ``force`` (its leases then lapse after the TTL); else ``ControllerError`` and
    nothing changes."""
    from skyserve_lite.errors import ControllerError, StateConflictError
    from skyserve_lite.remote import bootstrap, config, hosting
    from skyserve_lite.remote.connect import record_shell

    where = record.target.url
    others = [kept for kept in records if not config.is_same_host(kept.target, record.target)]
    remote = _open_hosts(home, others)
    views = remote.list_controllers()
    held = sorted({name for view in views if view.host == record.target.host for name in view.services})
    takers = [view for view in views if view.live and view.host != record.target.host]
    if held and not takers:
        raise StateConflictError(f"no controller of another host is live to take {', '.join(held)} over from {where}; "
                                 "start one first (`sky-lite controller status` lists them)")
    if not yes:
        what = f", handing {', '.join(held)} over to {', '.join(sorted({v.host for v in takers}))}" if held else ""
        click.confirm(f"Stop the controller on {where}{what}?", abort=True)
    shell = record_shell(home, record)
    try:
        bootstrap.hand_over(shell, record.remote_home)
    except ControllerError as exc:
        if not force:
            raise ControllerError(f"{exc}; nothing changed (pass --force to forget the host: its services then "
                                  "move to the others after the lease TTL)") from exc
        click.echo(f"The host does not answer ({exc}); forgetting it: its services move to the other controllers "
                   "once its leases lapse (the lease TTL).", err=True)
    finally:
        shell.close()
    config.remove_host(home, record)
    if record.machine is not None:  # a VM `controller up --cloud` launched: nothing of it is left behind
        hosting.take_down_machine(home, record.machine, say=lambda line: click.echo(f"  {line}", err=True))
    deadline = time.monotonic() + timeout
    while held:
        views = remote.list_controllers()
        owners = {name: view for view in views if view.live and view.host != record.target.host
                  for name in view.services}
        if all(name in owners for name in held):
            moved = ", ".join(f"{name} -> {owners[name].host}" for name in held)
            click.echo(f"The controller on {where} is stopped; its services were handed over ({moved}).")
            return
        if time.monotonic() >= deadline:
            click.echo(f"The controller on {where} is stopped and released its services; the other controllers "
                       f"had not taken them all within {timeout:g}s (`sky-lite controller status`).", err=True)
            return
        sleep(1.0)
    click.echo(f"The controller on {where} is stopped (it held no service); commands use "
               f"{', '.join(kept.target.url for kept in others)}.")


COMMANDS = (controller_up, controller_status, controller_upgrade, controller_down)
