"""Controller cost at fleet scale: CPU time, store statements and rows written per reconcile pass, peak RSS.

Uses the in-package fake provider, fake prober and fake load balancer runner, so what is measured is the
controller itself: reading the store, planning, and writing what changed. Each size runs in a process of
its own (so its peak RSS is its own), and one command prints the whole table:

    python benchmarks/controller_bench.py                      # every size of docs/benchmarks.md, and growth
    python benchmarks/controller_bench.py --sizes 100x100      # one size: SERVICESxREPLICAS_PER_SERVICE
    python benchmarks/controller_bench.py --engine postgresql  # the store in PostgreSQL (see below)

Passes: *launch* (every replica launched), *readiness* (every replica probed READY; these two are timed
without counting statements: see ``measure``), *steady* (the median of
``--passes`` passes over unchanged state; the clock moves 1 s per pass, so the heartbeat's one row every 5 s
and the replica history's one sample per service and minute are in the figures), and *one change* (the
median of ``--passes`` passes in each of which one replica's probe turns, failing then passing again, so
that the pass writes that one replica: what a busy fleet costs besides its steady passes).

``--engine postgresql`` puts the store in PostgreSQL: a throwaway server on 127.0.0.1 started from Debian's
binaries (tests/postgres.py, with fsync and full-page writes on, commits not waiting for their WAL flush as
SQLite's ``synchronous=NORMAL`` does not), a fresh database per size. Part of the store's work then runs in
the server's process, which the controller's CPU time does not count: the table adds the CPU time of the
server process serving the controller's connection, and each pass's wall time (round trips to the server).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.leases import LeaseHolder
from skyserve_lite.controller.memory import PassCollector
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.store import StatementCounts, Store

TASK = "service:\n  readiness_probe: /health\n  replicas: {replicas}\nrun: python -m http.server $PORT\n"
SIZES = ("10x100", "100x100", "500x100", "1x1000", "1x10000", "100x10", "1000x10")
# (smaller, larger): the growth the table's second part shows; each shape against its own smaller size, and
# the 10,000-replica shapes against 1,000 replicas in 10 services of 100 too.
GROWTH = (("10x100", "100x100"), ("100x100", "500x100"), ("1x1000", "1x10000"), ("100x10", "1000x10"),
          ("10x100", "1x10000"), ("10x100", "1000x10"))


REPO = Path(__file__).resolve().parents[1]
_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def measure(store: Store, func: Callable[[], object], *, count: bool = True) -> dict[str, float]:
    """Time ``func``; with ``count``, under ``Store.counting`` too. SQLite calls the counting's trace callback
    for every statement a trigger runs as well, one Python call per row a pass writes (10,000 in a launch
    pass at 10,000 replicas, ~100 ms of the pass's CPU): the passes that write every replica are timed
    without it, and their reads and writes are not counted."""
    with store.counting() if count else contextlib.nullcontext(StatementCounts()) as counts:
        before = store._db.total_changes
        server = _server_cpu_ms(store)
        wall, start = time.perf_counter(), time.process_time()
        func()
        cpu, wall = (time.process_time() - start) * 1000, (time.perf_counter() - wall) * 1000
        server = _server_cpu_ms(store) - server
    if not count:
        counts.rows_written = store._db.total_changes - before
    return {"cpu_ms": cpu, "wall_ms": wall, "server_cpu_ms": server, **_counts(counts)}


def _server_cpu_ms(store: Store) -> float:
    """CPU time of the PostgreSQL process serving the store's connection (0 on SQLite, which runs in this
    process): user and system ticks from /proc, a 10 ms resolution, so a median over many passes."""
    connection = getattr(store._db, "_connection", None)
    if connection is None:
        return 0.0
    fields = Path(f"/proc/{connection.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_MS


def _counts(counts: StatementCounts) -> dict[str, float]:
    return {"reads": counts.reads, "writes": counts.writes, "rows_written": counts.rows_written}


def run_size(services: int, per_service: int, passes: int, leases: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as home:
        store = Store.open(Path(home))
        clock = FakeClock()
        provider = FakeProvider(name="local")
        prober = FakeProber()
        # As `controller run`: one loop holding every service's lease (``--without-leases``: a bare
        # reconciler, as before leases, to compare).
        holder = LeaseHolder(store, clock, "bench-loop", "bench-host") if leases else None
        reconciler = Reconciler(store, {"local": provider}, prober, FakeLoadBalancerRunner(), clock,
                                ControllerSettings(), leases=holder)
        text = TASK.format(replicas=per_service)
        for index in range(services):
            task = SubmittedTask(text=text, source="/bench.yaml", spec=parse_task(text))
            store.create_service(f"svc-{index}", task, 30001 + index, clock.now())

        collector = PassCollector(clock.now)  # as `controller run` collects garbage between passes

        def one_pass() -> None:
            reconciler.reconcile_once()
            collector.after_pass()

        launch = measure(store, one_pass, count=False)
        clock.advance(1)
        ready = measure(store, one_pass, count=False)
        steady = []
        for _ in range(passes):
            clock.advance(1)
            steady.append(measure(store, one_pass))
        changed = []
        for index in range(passes):  # replica 1 of one service after another fails its probe, then passes
            key = (f"svc-{(index // 2) % services}", 1)
            prober.results[key] = ProbeResult(ok=index % 2 == 1, detail="HTTP 200" if index % 2 else "HTTP 503")
            clock.advance(1)
            changed.append(measure(store, one_pass))
        replicas = len(store.list_replicas())
        store.close()
    median = {key: statistics.median(p[key] for p in steady) for key in steady[0]}
    return {"size": f"{services}x{per_service}", "replicas": replicas, "launch": launch, "ready": ready,
            "steady": median, "change": {key: statistics.median(p[key] for p in changed) for key in changed[0]},
            "steady_max_cpu_ms": max(p["cpu_ms"] for p in steady),
            "steady_rows_written_max": max(p["rows_written"] for p in steady),
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _table(results: list[dict[str, Any]]) -> str:
    server = any(r["launch"]["server_cpu_ms"] or r["ready"]["server_cpu_ms"] for r in results)
    lines = ["| replicas (services x per service) | launch pass CPU | readiness pass CPU | steady pass CPU (median) "
             "| steady reads / writes / rows written (median, max rows) | one change CPU (median) "
             "| launch / steady / one change wall (median) "
             + ("| launch / readiness / steady / one change server CPU " if server else "") + "| peak RSS |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if server else "")]
    for r in results:
        services, per = r["size"].split("x")
        s, c = r["steady"], r["change"]
        server_cell = (f"| {r['launch']['server_cpu_ms']:,.0f} / {r['ready']['server_cpu_ms']:,.0f} / "
                       f"{s['server_cpu_ms']:,.1f} / {c['server_cpu_ms']:,.1f} ms " if server else "")
        lines.append(f"| {r['replicas']:,} ({services} x {per}) | {r['launch']['cpu_ms']:,.0f} ms "
                     f"| {r['ready']['cpu_ms']:,.0f} ms | {s['cpu_ms']:,.1f} ms "
                     f"| {s['reads']:.0f} / {s['writes']:.0f} / {s['rows_written']:.0f} "
                     f"({r['steady_rows_written_max']:.0f}) | {c['cpu_ms']:,.1f} ms "
                     f"| {r['launch']['wall_ms']:,.0f} / {s['wall_ms']:,.1f} / {c['wall_ms']:,.1f} ms "
                     f"{server_cell}| {r['rss_mb']:.0f} MB |")
    by_size = {r["size"]: r for r in results}
    growth = [(small, large) for small, large in GROWTH if small in by_size and large in by_size]
    if growth:
        lines += ["", "| growth (replicas) | launch pass | readiness pass | steady pass | one change |",
                  "| --- | ---: | ---: | ---: | ---: |"]
    for small, large in growth:
        a, b = by_size[small], by_size[large]
        factor = b["replicas"] / a["replicas"]
        ratios = [b[kind]["cpu_ms"] / a[kind]["cpu_ms"] for kind in ("launch", "ready", "steady", "change")]
        lines.append(f"| {small} -> {large} ({factor:g}x) | " + " | ".join(f"{r:.1f}x" for r in ratios) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), metavar="SERVICESxREPLICAS")
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--engine", choices=("sqlite", "postgresql"), default="sqlite",
                        help="Where the store is: SQLite in a temporary home (the default), or PostgreSQL on a "
                        "throwaway server on 127.0.0.1, a fresh database per size.")
    parser.add_argument("--without-leases", action="store_true",
                        help="A reconciler without leases (one controller, nothing fenced), to compare.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object per size instead of a table "
                        "(what each size's own process answers).")
    args = parser.parse_args()
    if args.json:
        for size in args.sizes:
            services, per = (int(n) for n in size.split("x"))
            print(json.dumps(run_size(services, per, args.passes, leases=not args.without_leases)))
        return
    results = []
    server = _start_postgres() if args.engine == "postgresql" else None
    try:
        for size in args.sizes:  # a process per size: each peak RSS is that size's own
            env = {key: value for key, value in os.environ.items() if key != "SKY_LITE_DB_URL"}
            database = server.create_database() if server is not None else None
            if server is not None:
                env["SKY_LITE_DB_URL"] = server.url(database)  # the environment: never a command line
            extra = ["--without-leases"] if args.without_leases else []
            out = subprocess.run([sys.executable, __file__, "--json", "--passes", str(args.passes), "--sizes", size,
                                  *extra],
                                 check=True, capture_output=True, text=True, env=env).stdout
            if server is not None:
                server.drop_database(database)
            results.append(json.loads(out))
            print(f"{size}: done", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
    print(f"engine: {args.engine}")
    print(_table(results))


def _start_postgres() -> Any:
    sys.path.insert(0, str(REPO))
    from tests.postgres import find_postgres_bin, start_postgres

    bin_dir = find_postgres_bin()
    if bin_dir is None:
        sys.exit("--engine postgresql: PostgreSQL (initdb, pg_ctl) is not installed (Debian: apt-get install "
                 "postgresql)")
    return start_postgres(bin_dir, durable=True)


if __name__ == "__main__":
    main()
