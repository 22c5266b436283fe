"""`sky-lite serve down --all --force`: stop everything a state directory started, without its database.

For a ``state.db`` that is damaged, truncated or gone. Nothing here opens the store: what runs is found from
the provider side, where a damaged file cannot hide it.

==============================  =====================================================================
what                            found by
==============================  =====================================================================
the controller loop             ``controller.pid`` (pid and start time: a reused pid is not taken for it)
load balancers                  their argv: ``python -m skyserve_lite.lb --home HOME --service NAME``
local and emulated replicas,    the ``SKY_LITE_REPLICA_DIR`` tag below HOME (or below the directory
                                ``SKY_LITE_LOCAL_REPLICAS_DIR`` names) in ``/proc/PID/environ``,
with their descendants          and ``pid`` files whose process still is that replica's (its start time;
                                replicas started before processes were tagged)
cloud instances                 the controller tag (``sky-lite:controller``): the id from
                                ``HOME/controller-id``, else from ``state.db`` if it can still be read;
                                with the state in PostgreSQL (``SKY_LITE_DB_URL``, ``db_url``), from
                                the database's ``meta`` if it answers within a few seconds
==============================  =====================================================================

The controller goes first, since it would relaunch what the rest stops; then load balancers, replicas and
cloud instances. Idempotent: a second run finds nothing and says so. It deletes no file: the state
directory stays for the operator to inspect, move away or remove.
"""

from __future__ import annotations

import itertools
import os
import re
import sqlite3
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyserve_lite import procs
from skyserve_lite.clock import SystemClock
from skyserve_lite.controller.guard import guard_provider
from skyserve_lite.controller.pidfile import find_controller
from skyserve_lite.errors import ProviderError, ProviderNotConfiguredError, SkyLiteError
from skyserve_lite.providers.base import Instance, InstanceState, Provider
from skyserve_lite.providers.local import (
    PID_FILE,
    find_recorded_process,
    find_replica_processes,
    find_replicas_dir,
    stop_replica_processes,
)
from skyserve_lite.state.dburl import DatabaseUrl, find_database_url

# Where the store also keeps its controller id, so that it survives a damaged database (see the report).
CONTROLLER_ID_FILE = "controller-id"
_CONTROLLER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# As ProcessLoadBalancerRunner starts a load balancer: ``python -m skyserve_lite.lb --home HOME ...``.
_LB_MODULE = "skyserve_lite.lb"
# A controller stops after its current pass (probes and launches included): give it that long.
_CONTROLLER_GRACE_SECONDS = 10.0
_LB_GRACE_SECONDS = 5.0
# Reading what is left of a damaged state.db must never hang the way the store's 30 s busy timeout does.
_PEEK_TIMEOUT_SECONDS = 0.5
# A PostgreSQL database is asked over the network: 5 s to connect and 5 s per query, so a server that is
# gone costs the command 10 s at most, not libpq's default of waiting forever.
_PEEK_PG_TIMEOUT_SECONDS = 5

# A controller id -> the cloud providers to search for instances with that tag (by cloud name).
CloudProviders = Callable[[str], Mapping[str, Provider]]


@dataclass(frozen=True)
class StoppedProcesses:
    """Processes of one thing this home started, stopped: ``what`` is "the controller", "the load balancer
    of web", "replica 2 of web"."""

    what: str
    pids: tuple[int, ...]


@dataclass(frozen=True)
class ForceDownReport:
    """What `serve down --force` found and stopped. ``errors`` are what it could not do (exit 1); ``notes``
    what it did not try, and why."""

    home: Path
    processes: tuple[StoppedProcesses, ...] = ()
    instances: tuple[tuple[str, Instance], ...] = ()
    notes: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The report as the CLI prints it, one line each."""
        lines = []
        for stopped in self.processes:
            pids = ", ".join(str(pid) for pid in stopped.pids)
            lines.append(f"Stopped {stopped.what} (pid{'s' if len(stopped.pids) > 1 else ''} {pids}).")
        for cloud, instance in self.instances:
            where = f" in {instance.region}" if instance.region else ""
            lines.append(f"Terminated {cloud} instance {instance.instance_id}{where} "
                         f"(replica {instance.replica_id} of {instance.service}).")
        if not self.processes and not self.instances:
            lines.append(f"Nothing that {self.home} started was running.")
        return lines + list(self.notes)


def force_down(home: Path, *, regions: Sequence[str] = (), clouds: CloudProviders | None = None,
               grace_seconds: float = 5.0) -> ForceDownReport:
    """Stop everything ``home`` started (see the module docstring); never opens the store.

    ``regions`` are searched for cloud instances besides the default region and those ``state.db`` still
    names; ``clouds`` builds the cloud providers (default: this home's, as a controller builds them).
    Never raises for what it cannot stop: the report's ``errors`` say. Idempotent."""
    home = Path(os.path.realpath(home))
    stopped: list[StoppedProcesses] = []
    errors: list[str] = []
    controller = find_controller(home)
    if controller is not None:
        process = procs.find_process(controller.pid)
        if process is not None and procs.stop_processes([process], _CONTROLLER_GRACE_SECONDS):
            stopped.append(StoppedProcesses("the controller", (process.pid,)))
    load_balancers = find_load_balancers(home)
    by_service: dict[str, list[int]] = {}  # a load balancer with workers is several processes (lb.workers)
    for process in procs.stop_processes([p for p, _service in load_balancers], _LB_GRACE_SECONDS):
        by_service.setdefault(dict((p.pid, s) for p, s in load_balancers)[process.pid], []).append(process.pid)
    stopped.extend(StoppedProcesses(f"the load balancer of {service}", tuple(sorted(pids)))
                   for service, pids in by_service.items())
    is_ours = find_replica_tag_test(home)
    replicas = stop_replica_processes(is_ours, find_recorded_replica_pids(home),
                                      grace_seconds)
    by_replica: dict[Path, list[int]] = {}
    for process, tag in replicas:
        by_replica.setdefault(tag, []).append(process.pid)
    stopped.extend(StoppedProcesses(describe_replica(home, tag), tuple(sorted(pids)))
                   for tag, pids in sorted(by_replica.items()))
    errors.extend(_find_survivors(home))

    controller_id, stored_regions = peek_store(home)
    if controller_id is None:
        url = _find_database_url(home)
        where = "state.db cannot be read" if url is None else f"the state database {url} cannot be read"
        return ForceDownReport(home, tuple(stopped), (), (
            f"Cloud instances were not searched: the controller id of {home} is unknown (no {CONTROLLER_ID_FILE} "
            f"file, and {where}). They carry the tag sky-lite:controller: look for instances "
            "with that tag key in your cloud account.",), tuple(errors))
    build = clouds or _make_clouds(home)
    instances: list[tuple[str, Instance]] = []
    notes: list[str] = []
    for cloud, provider in sorted(build(controller_id).items()):
        try:
            instances.extend((cloud, i) for i in terminate_tagged(provider, sorted({*regions, *stored_regions})))
        except ProviderNotConfiguredError:
            notes.append(f"{cloud}: not searched: it has no credentials here, so nothing was launched there from here")
        except ProviderError as exc:
            errors.append(f"{cloud}: instances tagged sky-lite:controller={controller_id} could not be "
                          f"stopped: {exc}")
    return ForceDownReport(home, tuple(stopped), tuple(instances), tuple(notes), tuple(errors))


def terminate_tagged(provider: Provider, regions: Collection[str]) -> list[Instance]:
    """Terminate every instance ``provider`` lists (it lists only those with its controller tag) that is
    not terminated yet; returns them. Raises ``ProviderError``."""
    guarded = guard_provider(provider)
    found = [i for i in guarded.list_instances(regions) if i.state is not InstanceState.TERMINATED]
    if found:
        guarded.terminate([i.instance_id for i in found])
    return found


def find_load_balancers(home: Path) -> list[tuple[procs.ProcessInfo, str]]:
    """The load balancer processes of ``home`` with their service, by their argv (a parent's workers too:
    they have the same module and options)."""
    found = []
    for process in procs.list_processes():
        argv = procs.read_cmdline(process.pid)
        if argv is None or _LB_MODULE not in argv:
            continue
        options = dict(itertools.pairwise(argv))
        lb_home, service = options.get("--home"), options.get("--service")
        if lb_home and service and os.path.realpath(lb_home) == str(home):
            found.append((process, service))
    return found


def find_recorded_replica_pids(home: Path) -> list[int]:
    """Pids in the ``pid`` files of ``home``'s replica directories whose process still is that replica's
    (``find_recorded_process``: its start time, or for an older file its argv): a replica started before
    processes were tagged."""
    pids = []
    named = _find_named_replicas_dir(home)
    for pid_file in [*home.glob(f"replicas/*/*/{PID_FILE}"), *home.glob(f"emulated/*/replicas/*/*/{PID_FILE}"),
                     *(named.glob(f"*/*/{PID_FILE}") if named is not None else ())]:
        found = find_recorded_process(pid_file.parent)
        if found is not None:
            pids.append(found.pid)
    return pids


def _find_named_replicas_dir(home: Path) -> Path | None:
    """The local replicas directory ``SKY_LITE_LOCAL_REPLICAS_DIR`` names when it is outside ``home`` (the
    controllers of several homes on one machine sharing a database name one), else None."""
    try:
        named = find_replicas_dir(home, os.environ)
    except SkyLiteError:
        return None  # a relative path: no controller could have started with it
    return None if named.is_relative_to(home) else named


def find_replica_tag_test(home: Path) -> Callable[[Path], bool]:
    """Whether a replica's tag (its directory) is one ``home``'s controller launched: below ``home``, or below
    the local replicas directory it names. That directory may be shared by the controllers of several homes
    on one database: their replicas are that database's services, stopped with the rest (``--all``)."""
    named = _find_named_replicas_dir(home)
    roots = (home,) if named is None else (home, named)
    return lambda tag: any(tag.is_relative_to(root) for root in roots)


def describe_replica(home: Path, tag: Path) -> str:
    """``replica 2 of web`` for ``HOME/replicas/web/2-NONCE``, ``emulated aws instance of replica 2 of web``
    for ``HOME/emulated/aws/replicas/web/2-NONCE``."""
    replica = f"replica {tag.name.split('-', 1)[0]} of {tag.parent.name}"
    if not tag.is_relative_to(home):  # below the SKY_LITE_LOCAL_REPLICAS_DIR the home's controller names
        return replica
    parts = tag.relative_to(home).parts
    if len(parts) == 5 and parts[0] == "emulated":
        return f"emulated {parts[1]} instance of {replica}"
    return replica


def peek_store(home: Path) -> tuple[str | None, tuple[str, ...]]:
    """The controller id of ``home`` and the cloud regions its replicas used, as far as they can be known
    without the store: ``HOME/controller-id``, else whatever ``state.db`` still answers to a read-only
    query that gives up at once (a damaged database answers nothing: (None, ()))."""
    try:
        recorded = (home / CONTROLLER_ID_FILE).read_text().strip()
    except OSError:
        recorded = ""
    controller_id = recorded if _CONTROLLER_ID.fullmatch(recorded) else None
    url = _find_database_url(home)
    if url is not None:
        return _peek_postgresql(url, controller_id)
    regions: tuple[str, ...] = ()
    path = home / "state.db"
    if not path.is_file():
        return controller_id, regions
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, timeout=_PEEK_TIMEOUT_SECONDS)
        try:
            if controller_id is None:
                row = db.execute("SELECT value FROM meta WHERE key = 'controller_id'").fetchone()
                stored = str(row[0]) if row else ""
                controller_id = stored if _CONTROLLER_ID.fullmatch(stored) else None
            regions = tuple(str(r[0]) for r in db.execute(
                "SELECT DISTINCT region FROM replicas WHERE region IS NOT NULL AND cloud != 'local'"))
        finally:
            db.close()
    except sqlite3.Error:
        pass  # damaged: what the file no longer tells, the provider side has to
    return controller_id, regions


def _find_database_url(home: Path) -> DatabaseUrl | None:
    """The PostgreSQL database of ``home``'s state, or None for SQLite in the home (and for a URL that does
    not parse: this command must work whatever the settings say)."""
    try:
        return find_database_url(home, os.environ)
    except SkyLiteError:
        return None


def _peek_postgresql(url: DatabaseUrl, controller_id: str | None) -> tuple[str | None, tuple[str, ...]]:
    """``peek_store`` with the state in PostgreSQL: the store keeps the controller id only in the database's
    ``meta`` (no ``controller-id`` file in the home), so the database is asked, read-only and with short
    timeouts. A database that cannot be reached, or holds no sky-lite schema, answers (controller_id, ())."""
    import psycopg  # an optional dependency, present wherever a store was ever opened on PostgreSQL

    timeout_ms = _PEEK_PG_TIMEOUT_SECONDS * 1000
    arguments: dict[str, Any] = {**url.connect_arguments(), "connect_timeout": str(_PEEK_PG_TIMEOUT_SECONDS)}
    try:
        with psycopg.connect(autocommit=True, options=f"-c default_transaction_read_only=on "
                                                      f"-c statement_timeout={timeout_ms}", **arguments) as db:
            if controller_id is None:
                row = db.execute("SELECT value FROM meta WHERE key = 'controller_id'").fetchone()
                stored = str(row[0]) if row else ""
                controller_id = stored if _CONTROLLER_ID.fullmatch(stored) else None
            regions = tuple(str(r[0]) for r in db.execute(
                "SELECT DISTINCT region FROM replicas WHERE region IS NOT NULL AND cloud != 'local' "
                "ORDER BY region"))
    except psycopg.Error:
        return controller_id, ()  # unreachable, refused, or no schema: the provider side has to tell
    return controller_id, regions


def _find_survivors(home: Path) -> list[str]:
    """What still runs after everything was stopped (another user's process, one stuck in the kernel)."""
    survivors = []
    controller = find_controller(home)
    if controller is not None:
        survivors.append(f"the controller (pid {controller.pid})")
    survivors += [f"the load balancer of {service} (pid {p.pid})" for p, service in find_load_balancers(home)]
    survivors += [f"{describe_replica(home, tag)} (pid {p.pid})"
                  for p, tag in find_replica_processes(find_replica_tag_test(home))]
    return [f"still running after SIGKILL: {survivor}" for survivor in survivors]


def _make_clouds(home: Path) -> CloudProviders:
    def build(controller_id: str) -> Mapping[str, Provider]:
        from skyserve_lite.providers import make_providers

        providers = make_providers(home, SystemClock(), controller_id)
        return {name: provider for name, provider in providers.items() if name != "local"}

    return build
