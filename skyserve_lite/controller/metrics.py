"""The Prometheus endpoint of a controller host: its load balancers' counts and the state's replicas and
autoscaler targets, on a loopback address, never on a service's public port.

``SKY_LITE_METRICS_ADDR`` (``HOST:PORT``, default ``127.0.0.1:30000``; ``off`` for none) is where the
controller loop serves ``GET /metrics`` in prometheus-client's text format, from a thread prometheus-client
starts in ``MetricsExporter.start`` (never in a constructor). Nothing is computed between scrapes except
the pass-duration histogram: each scrape reads

* the snapshot files the host's load balancers publish about once a second (``lb.metrics_file``, written
  by ``lb.metrics``), skipping a file whose process is gone (its counts went with it; a restarted load
  balancer counts from 0, which rate() reads as a reset), a load balancer's workers each with its own
  series (a ``worker`` label), so that a worker started again resets only its own;
* the state, opened read-only for the scrape: replicas by service, version and status, and each
  service's autoscaler targets (raw: what the policy computed; chosen: within the bounds, with the
  hysteresis), as `serve status` shows them.

The families, all prefixed ``skylite_``, are listed in docs/architecture.md ("Metrics") with a scrape
config. The pure part (``compute_*``) turns values into metric families and is tested on its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from skyserve_lite import procs
from skyserve_lite.errors import UsageError
from skyserve_lite.lb.metrics_file import LATENCY_BUCKETS, LbSnapshot, metrics_dir, read_snapshots

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from skyserve_lite.autoscalers.base import AutoscalerState
    from skyserve_lite.state.models import AutoscalerObservation, ReplicaStatus

log = logging.getLogger(__name__)

METRICS_ADDR_VARIABLE: Final = "SKY_LITE_METRICS_ADDR"
# Loopback only by default: the counts name replicas' addresses, which are nobody else's business. 30000 is
# just below the endpoints' range (30001-30999), so one range of ports is all a host's firewall names.
DEFAULT_METRICS_ADDR: Final = "127.0.0.1:30000"
# A reconcile pass takes milliseconds when nothing changes and seconds when it launches or probes many
# replicas: buckets from 5 ms to 30 s.
PASS_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class MetricsAddress:
    host: str
    port: int


def parse_metrics_addr(environ: Mapping[str, str]) -> MetricsAddress | None:
    """The address ``SKY_LITE_METRICS_ADDR`` names (the default when unset; None for ``off``). Raises
    ``UsageError`` naming the variable for anything else than ``HOST:PORT`` or ``off``."""
    value = environ.get(METRICS_ADDR_VARIABLE, DEFAULT_METRICS_ADDR).strip()
    if value.lower() == "off":
        return None
    host, _, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{METRICS_ADDR_VARIABLE}={value!r}: expected HOST:PORT (e.g. {DEFAULT_METRICS_ADDR}) or off")
    return MetricsAddress(host, int(port))


def compute_lb_families(snapshots: Sequence[LbSnapshot]) -> list[Metric]:
    """The load balancers' families from their snapshots. Pure. A replica label is the replica's url; ``""``
    (with version ``""``) for answers the load balancer made itself (401, 429, 503, the 502 after failed
    attempts). When a load balancer runs as several workers (``lb.workers``), every family has a ``worker``
    label too (``"0"``, ``"1"`` ...; ``""`` for a one-process load balancer beside them): each worker counts
    on its own, so that one started again resets only its own series, which rate() reads right."""
    extra = ("worker",) if any(snapshot.worker is not None for snapshot in snapshots) else ()
    requests = CounterMetricFamily(
        "skylite_lb_requests", "Responses by service, version, replica and status class (replica \"\": the "
        "load balancer's own answers).", labels=("service", "version", "replica", "code", *extra))
    failures = CounterMetricFamily(
        "skylite_lb_attempt_failures", "Attempts to a replica that got no response, by reason (connect, reset, "
        "timeout, invalid, aborted: the client left first).",
        labels=("service", "version", "replica", "reason", *extra))
    latency = HistogramMetricFamily(
        "skylite_lb_request_duration_seconds", "Time from sending a request to a replica to the end of its "
        "response.", labels=("service", "version", "replica", *extra))
    in_flight = GaugeMetricFamily("skylite_lb_in_flight_requests", "Requests in flight to each replica.",
                                  labels=("service", "replica", *extra))
    waiting = GaugeMetricFamily("skylite_lb_waiting_requests", "Requests held for a READY replica.",
                                labels=("service", *extra))
    retries = CounterMetricFamily("skylite_lb_retries", "Requests sent again to another replica after a failed "
                                  "attempt.", labels=("service", *extra))
    ejections = CounterMetricFamily("skylite_lb_ejections", "Replicas taken out of the rotation for failing in a "
                                    "row.", labels=("service", *extra))
    ejected = GaugeMetricFamily("skylite_lb_ejected_replicas", "Replicas out of the rotation now.",
                                labels=("service", *extra))
    up = GaugeMetricFamily("skylite_lb_up", "1 for each load balancer (each worker of one) whose counts this "
                           "scrape read.", labels=("service", *extra))
    for snapshot in snapshots:
        service = snapshot.service
        worker = (_label(snapshot.worker),) if extra else ()
        for version, replica, code, count in snapshot.requests:
            requests.add_metric((service, _label(version), replica or "", code, *worker), count)
        for version, replica, reason, count in snapshot.failures:
            failures.add_metric((service, _label(version), replica or "", reason, *worker), count)
        for row in snapshot.latency:
            cumulative, buckets = 0, []
            for bound, count in zip((*(str(b) for b in LATENCY_BUCKETS), "+Inf"), row.buckets, strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            latency.add_metric((service, _label(row.version), row.replica, *worker), buckets, row.total_seconds)
        for replica, count in snapshot.in_flight:
            in_flight.add_metric((service, replica, *worker), count)
        waiting.add_metric((service, *worker), snapshot.waiting)
        retries.add_metric((service, *worker), snapshot.retries)
        ejections.add_metric((service, *worker), snapshot.ejections)
        ejected.add_metric((service, *worker), snapshot.ejected)
        up.add_metric((service, *worker), 1)
    return [requests, failures, latency, in_flight, waiting, retries, ejections, ejected, up]


def compute_state_families(replica_counts: Mapping[tuple[str, int, ReplicaStatus], int],
                           autoscalers: Mapping[str, tuple[AutoscalerState, AutoscalerObservation]]) -> list[Metric]:
    """Replicas by service, version and status (``Store.count_replicas_by_status``), and the autoscaler's raw
    and chosen targets. Pure."""
    counted = GaugeMetricFamily("skylite_replicas", "Replicas by service, version and status.",
                                labels=("service", "version", "status"))
    rows = sorted((service, version, status.value, count)
                  for (service, version, status), count in replica_counts.items())
    for service, version, status, count in rows:
        counted.add_metric((service, str(version), status), count)
    raw = GaugeMetricFamily("skylite_autoscaler_raw_target_replicas", "What the autoscaling policy computed from "
                            "the load, before bounds and hysteresis.", labels=("service",))
    chosen = GaugeMetricFamily("skylite_autoscaler_target_replicas", "The target the controller steers to "
                               "(within the bounds, after the hysteresis).", labels=("service",))
    for service, (state, observation) in sorted(autoscalers.items()):
        raw.add_metric((service,), observation.raw_target)
        chosen.add_metric((service,), state.target)
    return [counted, raw, chosen]


def render_text(families: Sequence[Metric]) -> str:
    """``families`` in Prometheus' text format, as the endpoint serves them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry).decode()


class _Fixed(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _label(number: int | None) -> str:
    return "" if number is None else str(number)


def find_live_snapshots(snapshots: Iterable[LbSnapshot], is_alive: Callable[[int], bool]) -> list[LbSnapshot]:
    """The snapshots whose process still runs (a dead load balancer's counts are gone with it)."""
    return [snapshot for snapshot in snapshots if is_alive(snapshot.pid)]


class StateReader(Protocol):
    """What a scrape reads of the state (``Store``, opened read-only)."""

    def count_replicas_by_status(self) -> Mapping[tuple[str, int, ReplicaStatus], int]: ...

    def list_autoscaler_states(self) -> Mapping[str, tuple[AutoscalerState, AutoscalerObservation]]: ...

    def close(self) -> None: ...


class HostCollector(Collector):
    """A prometheus-client collector reading the host's load balancer snapshots and the state at each scrape.

    ``open_store`` opens the state for reading (each scrape runs on a thread of its own, and a store
    connection belongs to the thread that opened it); a state that cannot be read is logged and its
    families left out, the load balancers' still served. Replicas are counted by the database (one
    ``GROUP BY``), not decoded: 1,000 replicas scraped every 15 s would otherwise be 1,000 rows made into
    records for a handful of numbers."""

    def __init__(self, home: Path, open_store: Callable[[], StateReader],
                 is_alive: Callable[[int], bool] = procs.is_alive) -> None:
        self._home = home
        self._open_store = open_store
        self._is_alive = is_alive

    def collect(self) -> Iterator[Metric]:
        paths = sorted(metrics_dir(self._home).glob("*.json"))
        yield from compute_lb_families(find_live_snapshots(read_snapshots(paths), self._is_alive))
        try:
            store = self._open_store()
            try:
                counts, autoscalers = store.count_replicas_by_status(), store.list_autoscaler_states()
            finally:
                store.close()
        except Exception:  # a scrape must answer: the load balancers' families stand on their own
            log.exception("metrics: reading the state of %s failed", self._home)
            return
        yield from compute_state_families(counts, autoscalers)


class MetricsExporter:
    """The controller's Prometheus endpoint. The constructor only stores; ``start`` listens (a thread of
    prometheus-client's), ``observe_pass`` records one reconcile pass, ``close`` stops listening."""

    def __init__(self, home: Path, address: MetricsAddress, open_store: Callable[[], StateReader]) -> None:
        self.address = address
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(HostCollector(home, open_store))
        self._passes = Histogram("skylite_controller_pass_duration_seconds", "Duration of each reconcile pass.",
                                 buckets=PASS_BUCKETS, registry=self.registry)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen on the address. Raises ``OSError`` when it cannot be bound."""
        self._server, self._thread = start_http_server(self.address.port, self.address.host, self.registry)
        log.info("metrics for Prometheus at http://%s:%d/metrics", self.address.host, self.port)

    @property
    def port(self) -> int:
        """The port listened on (the one bound, for port 0)."""
        return self._server.server_address[1] if self._server is not None else self.address.port

    def observe_pass(self, seconds: float) -> None:
        self._passes.observe(seconds)

    def close(self) -> None:
        """Stop listening. Idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def start_metrics(home: Path, environ: Mapping[str, str] | None = None) -> MetricsExporter | None:
    """The controller loop's exporter, listening, as ``SKY_LITE_METRICS_ADDR`` says; None when it is
    ``off``, invalid or its address cannot be bound (logged: the controller runs on without metrics)."""
    from skyserve_lite.state.store import Store

    try:
        address = parse_metrics_addr(os.environ if environ is None else environ)
    except UsageError as exc:
        log.error("no metrics endpoint: %s", exc)
        return None
    if address is None:
        return None
    exporter = MetricsExporter(home, address, lambda: Store.open_read_only(home))
    try:
        exporter.start()
    except OSError as exc:
        log.warning("no metrics endpoint: cannot listen on %s:%d (%s); set %s to another address or off",
                    address.host, address.port, exc.strerror or exc, METRICS_ADDR_VARIABLE)
        return None
    return exporter
