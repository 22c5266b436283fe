"""Process entry of one service's load balancer.

    python -m skyserve_lite.lb --home PATH --service NAME --port N [--host 127.0.0.1]

Reads the service's READY replicas and policy from the state store under ``--home``, writes the per-second
request counts and the load reports back to it, and serves until SIGTERM/SIGINT or until the service is
deleted from the store. At start it raises its soft limit on open files to the hard limit. Its
settings are the ``SKY_LITE_LB_*`` variables (``lb.settings``): how long a request is held for a READY
replica, how many client connections it serves (in all and per client address), the deadlines for a
request head, an idle connection and a replica's answer, and when a failing replica is ejected.

When the service's current version has `service.tls`, it serves HTTPS with that version's key and
certificate, written to ``$SKY_LITE_HOME/lb/<service>/tls`` (0700, files 0600) and removed on exit; an
update that changes them is served from the next connection on (``lb.tls``).

When the current version has `service.auth` or `service.rate_limits`, every request is decided by the
guard (``lb.guard``) before a replica is chosen: 429 with Retry-After, 401 with WWW-Authenticate. The keys
are read from the secret store of the home at start (when they cannot be, the process exits 1 naming the
key, never a value: the controller starts it again, and an endpoint must not open without its keys) and
again whenever the current version changes; a later failure keeps the keys it has.

It answers ``GET /.sky-lite/identity`` itself, before the guard (``endpoint_identity``: the service, the state's
controller id, its pid), and once it listens records the address it bound with its pid in the store
(``Store.record_lb_endpoint``; the row goes when it stops). Its counts for Prometheus (``lb.metrics``) are
written about once a second to ``$SKY_LITE_HOME/metrics/lb/<service>.json``, which the controller's metrics
endpoint reads at each scrape.

Exit status: 0 on a normal stop, 1 when the port cannot be bound, the store cannot be opened, or the
current version's key and certificate or API keys cannot be loaded, 2 for an invalid setting.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import importlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyserve_lite.clock import SystemClock
from skyserve_lite.errors import SkyLiteError, StateConflictError
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.files.manifest import Manifest
from skyserve_lite.lb.auth_keys import StoreGuardSource
from skyserve_lite.lb.buckets import SharedBuckets, compute_salt, compute_table_slots, make_shared_table
from skyserve_lite.lb.current_version import CurrentVersionValue
from skyserve_lite.lb.guard import DEFAULT_MAX_BUCKETS, Guard
from skyserve_lite.lb.listener import raise_open_file_limit
from skyserve_lite.lb.metrics import LbMetrics, metrics_path
from skyserve_lite.lb.pooled_upstream import PooledUpstream
from skyserve_lite.lb.proxy import LbReport, LbView, LoadBalancer
from skyserve_lite.lb.server import is_compiled, serve, serve_taking
from skyserve_lite.lb.settings import ConnectionLimits, LbSettings, compute_worker_count
from skyserve_lite.lb.tls import REFRESH_SECONDS, TlsError, TlsReloader, tls_dir
from skyserve_lite.lb.version_counts import VersionCounter
from skyserve_lite.lb.workers import (
    STOPPED_STATUS,
    HandoffReceiver,
    WorkerProcess,
    can_hand_off,
    compute_share,
    run_parent,
)
from skyserve_lite.netaddr import host_port
from skyserve_lite.state.models import LbEndpoint

if TYPE_CHECKING:
    from skyserve_lite.spec.model import RateLimit
    from skyserve_lite.state.models import VersionRecord
    from skyserve_lite.state.store import Store

log = logging.getLogger("skyserve_lite.lb")


class StoreTargetSource:
    """``TargetSource`` backed by the state store."""

    def __init__(self, store: Store, service: str) -> None:
        self._store = store
        self._service = service

    def read(self) -> LbView | None:
        """The store's view; None (stop serving) once the service is gone, or the state directory is: a
        load balancer must not outlive the state that describes it."""
        if not self._store.is_current():
            return None
        return self._store.get_lb_view(self._service)


class StoreTlsSource:
    """``TlsSource`` backed by the state store: the current version's ``TaskFiles.tls``, read again only when
    the service's current version changes (``CurrentVersionValue``: one row read otherwise)."""

    def __init__(self, store: Store, service: str) -> None:
        self._current = CurrentVersionValue(store, service, _find_tls)

    def read(self) -> Manifest | None:
        # A service gone keeps the last answer: the target source stops the load balancer.
        value = self._current.read()
        return value if value is not None else self._current.last


def _find_tls(record: VersionRecord) -> Manifest | None:
    """The version's TLS key and certificate; raises ``TlsError`` for a version whose ``service.tls`` has no
    snapshot (the reloader keeps the certificate it has)."""
    files = record.files
    tls = files.tls if files else None
    if tls is None and record.spec.service.tls is not None:
        raise TlsError(f"version {record.version} has service.tls but its snapshot holds no key and certificate; "
                       "submit it again with `sky-lite serve update`")
    return tls


class StoreMetricsSink:
    """``MetricsSink`` backed by the state store. ``lb`` names this load balancer among the service's (one
    per controller host): its load report is kept apart from theirs and the readers sum them; request
    counts are added up as they are written."""

    def __init__(self, store: Store, service: str, lb: str = "") -> None:
        self._store = store
        self._service = service
        self._lb = lb

    def record_request_counts(self, counts: Mapping[int, int]) -> None:
        self._store.record_request_counts(self._service, counts)

    def record_load(self, report: LbReport) -> None:
        self._store.record_lb_report(self._service, report, self._lb)


def lb_identity(host: str, port: int, worker: int | None = None) -> str:
    """This load balancer among its service's: the machine and the address it listens on
    (``web-1/0.0.0.0:30001``; on one machine, controllers bind different loopback addresses), and the
    worker for one of several processes (``web-1/0.0.0.0:30001#2``): each reports its own load."""
    return f"{socket.gethostname()}/{host_port(host, port)}" + (f"#{worker}" if worker is not None else "")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m skyserve_lite.lb", description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True, help="sky-lite home directory holding the state store")
    parser.add_argument("--service", required=True, help="the service to balance")
    parser.add_argument("--port", required=True, type=int, help="port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    # A worker of a parent with SKY_LITE_LB_WORKERS > 1 (``lb.workers``): started by the parent, never by hand.
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--control-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--buckets-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint-pid", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    worker_args = (args.worker, args.workers, args.control_fd, args.buckets_fd, args.endpoint_pid)
    if any(value is not None for value in worker_args) and any(value is None for value in worker_args):
        parser.error("--worker, --workers, --control-fd, --buckets-fd and --endpoint-pid go together")
    return args


@dataclass(frozen=True)
class WorkerRole:
    """What a worker process is told by its parent (``lb.workers``): which of how many it is, its end of the
    control socket, the shared buckets' table and the parent's pid (the endpoint's, for the identity path)."""

    index: int
    count: int
    control_fd: int
    buckets_fd: int
    endpoint_pid: int

    def args(self) -> list[str]:
        return ["--worker", str(self.index), "--workers", str(self.count), "--control-fd", str(self.control_fd),
                "--buckets-fd", str(self.buckets_fd), "--endpoint-pid", str(self.endpoint_pid)]


def _run_until_complete(coro: Coroutine[Any, Any, int]) -> int:
    """Run ``coro`` on uvloop when it is installed (optional, not a dependency), else on asyncio's loop."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.run(coro)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return asyncio.run(coro)


def _prepare_process() -> asyncio.Event:
    """The running loop's store thread and signals: the event SIGTERM and SIGINT set.

    Every store call (open, reads, writes, close) runs on one thread: an SQLite connection belongs to the
    thread that opened it, and asyncio.to_thread would otherwise pick any thread of the pool."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lb-store"))
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def _run(
    home: Path, service: str, host: str, port: int, settings: LbSettings, limits: ConnectionLimits,
    role: WorkerRole | None = None,
) -> int:
    """Serve as the one load-balancer process, or as a worker of a parent (``role``)."""
    from skyserve_lite.state.store import Store  # the store is needed by the process only, not by the server

    stop = _prepare_process()
    store = await asyncio.to_thread(lambda: Store.open(home, create=False))
    worker = role.index if role is not None else None
    tls = TlsReloader(service, StoreTlsSource(store, service), blob_store_of(home), tls_dir(home, service, worker))
    shared: list[SharedBuckets] = []
    try:
        guard_source = StoreGuardSource.of_home(store, service, home)
        try:
            # Before listening, and fatal: an endpoint with service.auth must never answer without its keys.
            guard = Guard(await asyncio.to_thread(guard_source.read),
                          buckets=None if role is None else functools.partial(_shared_buckets, role, shared))
        except StateConflictError as exc:  # names the key and the version, never a value
            print(f"sky-lite load balancer for service {service}: cannot read its API keys: {exc}", file=sys.stderr)
            return 1
        versions = VersionCounter(SystemClock())  # for the canary judge (``lb.version_counts``)
        metrics = LbMetrics(service, worker)  # for the controller host's Prometheus endpoint (``lb.metrics``)
        lb = LoadBalancer(
            service,
            StoreTargetSource(store, service),
            StoreMetricsSink(store, service, lb_identity(host, port, worker)),
            SystemClock(),
            hold_seconds=settings.hold_seconds,
            upstream=upstream_factory(settings),
            eject_after_failures=settings.eject_after_failures,
            eject_seconds=settings.eject_seconds,
            guard=guard,
            guard_source=guard_source,
            outcomes=(versions, metrics),
            identity={"service": service, "controller_id": await asyncio.to_thread(lambda: store.controller_id),
                      "pid": role.endpoint_pid if role is not None else os.getpid()},
        )
        log.info("starting load balancer for service %s on %s:%d (home %s)", service, host, port, home)
        try:
            # Before listening: the first connection already gets HTTPS when the service asks for it.
            await tls.start()
        except TlsError as exc:
            print(f"sky-lite load balancer for service {service}: cannot serve HTTPS: {exc}", file=sys.stderr)
            return 1
        reloading = asyncio.create_task(tls.run(), name=f"lb-tls-{service}")
        write_counts = functools.partial(store.record_version_counts, service)
        counting = asyncio.create_task(versions.flush_every(write_counts), name=f"lb-version-counts-{service}")
        publishing = asyncio.create_task(metrics.publish_every(lb, metrics_path(home, service, worker), time.time),
                                         name=f"lb-metrics-{service}")
        try:
            if role is not None:
                receiver = HandoffReceiver(socket.socket(fileno=role.control_fd), stop.set)
                try:
                    await serve_taking(lb, stop, receiver.attach,
                                       replace(limits, max_connections=compute_share(limits.max_connections,
                                                                                     role.count)),
                                       ssl_context=lambda: tls.context)
                finally:
                    receiver.close()
            else:
                await serve(lb, host, port, stop, limits, ssl_context=lambda: tls.context,
                            on_listening=functools.partial(_record_endpoint, store, service))
        except OSError as exc:  # serve raises OSError only when the port cannot be bound
            print(
                f"sky-lite load balancer for service {service}: cannot listen on {host}:{port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
        finally:
            reloading.cancel()
            counting.cancel()
            publishing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publishing
            metrics_path(home, service, worker).unlink(missing_ok=True)  # its counts end with the process
            with contextlib.suppress(asyncio.CancelledError):
                await reloading
            with contextlib.suppress(asyncio.CancelledError):
                await counting
            try:
                await versions.flush(write_counts, everything=True)
            except Exception:  # the last flush; nothing is left to retry it
                log.exception("load balancer for service %s: final flush of version counts failed", service)
    finally:
        if role is None:  # a worker's parent owns the record
            with contextlib.suppress(Exception):  # a record left behind names a dead pid, which readers can tell
                await asyncio.to_thread(store.delete_lb_endpoint, service, socket.gethostname(), os.getpid())
        for table in shared:
            table.close()
        await asyncio.to_thread(tls.discard)  # the key's copy lives only as long as the load balancer
        await asyncio.to_thread(store.close)
    log.info("load balancer for service %s stopped", service)
    # A worker tells its parent why it ended: 0 only when the service is gone (the parent then ends too).
    return STOPPED_STATUS if role is not None and stop.is_set() else 0


def _shared_buckets(role: WorkerRole, opened: list[SharedBuckets], limits: tuple[RateLimit, ...]) -> SharedBuckets:
    """The workers' shared table (``lb.buckets``) for ``limits``: keyed by them, so that new limits start from
    fresh buckets in every worker, as a single process's do. Mapped once (``opened`` holds the mapping)."""
    salt = compute_salt(limits)
    if not opened:
        opened.append(SharedBuckets(role.buckets_fd, salt))
        return opened[0]
    return opened[0].with_salt(salt)


class TlsFlag:
    """Whether the service's current version has ``service.tls``, for a parent's refusals (``run_parent``):
    read from the store every ``REFRESH_SECONDS`` as the workers read their certificates."""

    def __init__(self, current: CurrentVersionValue[bool]) -> None:
        self._current = current
        self._on = False

    def read(self) -> bool:
        return self._on

    async def refresh(self) -> None:
        """Read the current version again; a store that cannot be read keeps the last answer (logged)."""
        try:
            on = await asyncio.to_thread(self._current.read)
            self._on = bool(on) if on is not None else self._on
        except Exception:  # the top of this step: the parent serves on with what it knew
            log.exception("reading whether the service is served over TLS failed")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            await self.refresh()


async def _run_parent(
    home: Path, service: str, host: str, port: int, limits: ConnectionLimits, count: int
) -> int:
    """Own the port and hand its connections to ``count`` workers (``lb.workers.run_parent``), each this
    module in worker mode; records the endpoint once they serve. Returns the exit status: 0 stopped, 1 the
    port cannot be bound, or a worker's status when one could not start (e.g. 1: the API keys cannot be
    read)."""
    from skyserve_lite.state.store import Store

    stop = _prepare_process()
    store = await asyncio.to_thread(lambda: Store.open(home, create=False))
    buckets_fd = make_shared_table(compute_table_slots(DEFAULT_MAX_BUCKETS))

    async def spawn(index: int, control: socket.socket) -> WorkerProcess:
        role = WorkerRole(index, count, control.fileno(), buckets_fd, os.getpid())
        command = [sys.executable, "-m", "skyserve_lite.lb", "--home", str(home), "--service", service,
                   "--host", host, "--port", str(port), *role.args()]
        return await asyncio.create_subprocess_exec(*command, pass_fds=(control.fileno(), buckets_fd))

    tls = TlsFlag(CurrentVersionValue(store, service, lambda record: record.spec.service.tls is not None))
    await tls.refresh()  # before the first connection
    watching = asyncio.create_task(tls.run(), name=f"lb-tls-flag-{service}")
    try:
        return await run_parent(service, host, port, limits, count, spawn, stop,
                                on_serving=functools.partial(_record_endpoint, store, service), over_tls=tls.read)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        os.close(buckets_fd)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(store.delete_lb_endpoint, service, socket.gethostname(), os.getpid())
        await asyncio.to_thread(store.close)


async def _record_endpoint(store: Store, service: str, addresses: list[tuple[str, int]]) -> None:
    """Record in the store the address this process bound, with its pid (``Store.record_lb_endpoint``);
    a store that cannot take it is logged: the endpoint serves anyway, and its identity path says who it is."""
    host, port = addresses[0][:2]
    endpoint = LbEndpoint(service, socket.gethostname(), host_port(host, port), os.getpid(), time.time())
    try:
        await asyncio.to_thread(store.record_lb_endpoint, endpoint)
    except Exception:  # the top of this step: serving matters more than the record
        log.exception("load balancer for service %s: recording its address %s:%d failed", service, host, port)


def upstream_factory(settings: LbSettings) -> functools.partial[PooledUpstream]:
    """The upstream client the load balancer creates at start, with the settings' response timeout."""
    return functools.partial(PooledUpstream, response_timeout=settings.upstream_timeout_seconds)


def start_limits(settings: LbSettings) -> ConnectionLimits:
    """Raise the open-file limit and log it; the connection limits to serve with."""
    before, limit = raise_open_file_limit()
    limits = settings.connection_limits(limit)
    raised = f"raised from {before} to {limit}" if limit != before else f"{limit}"
    log.info(
        "open-file limit %s; at most %d client connections, %d per client address",
        raised,
        limits.max_connections,
        limits.per_client,
    )
    return limits


def _cpu_count() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the load balancer; returns the exit status (0 stopped normally, 1 could not start, 2 bad setting)."""
    args = _parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = LbSettings.from_env(os.environ)
        limits = start_limits(settings)
        home = Path(args.home)
        if args.worker is not None:
            role = WorkerRole(args.worker, args.workers, args.control_fd, args.buckets_fd, args.endpoint_pid)
            return _run_until_complete(_run(home, args.service, args.host, args.port, settings, limits, role))
        count = compute_worker_count(settings.workers, _cpu_count(), can_hand_off(), is_compiled())
        if count > 1:
            return _run_until_complete(_run_parent(home, args.service, args.host, args.port, limits, count))
        return _run_until_complete(_run(home, args.service, args.host, args.port, settings, limits))
    except SkyLiteError as exc:  # e.g. the store cannot be opened
        print(f"sky-lite load balancer for service {args.service}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
