"""`sky-lite serve status` at fleet scale: wall time of the whole command (a fresh process, as a user runs
it) over 100 services of 100 READY replicas each, as a table on a pipe and as `-o json`.

The store of a temporary ``$SKY_LITE_HOME`` is filled directly (no controller runs: the command warns about
that on stderr, which is discarded), so what is measured is start-up, the status read and the rendering.

    python benchmarks/status_bench.py [--services 100] [--replicas-per-service 100] [--runs 5] [--sky-lite PATH]

``--sky-lite``: the command to run (default: the `sky-lite` next to this Python, else `python -m skyserve_lite`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from cli_startup_bench import default_command  # this directory's

from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceStatus
from skyserve_lite.state.store import Store

# Each service its own text (a name and an env of its own), as a real fleet's: nothing is parsed once for all.
TASK = """\
name: {name}
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 60
  replicas: {replicas}
resources:
  ports: 8080
envs:
  SERVICE: {name}
run: python -m http.server $PORT
"""


def fill_store(home: Path, services: int, replicas_per_service: int) -> int:
    """``services`` services of ``replicas_per_service`` READY local replicas each; the replicas stored."""
    now = time.time()
    store = Store.open(home)
    try:
        for index in range(services):
            name = f"svc-{index:03d}"
            text = TASK.format(name=name, replicas=replicas_per_service)
            task = SubmittedTask(text=text, source="/bench/svc.yaml", spec=parse_task(text))
            store.create_service(name, task, 30001 + index, now - 3600)
            template = ReplicaRecord(service=name, replica_id=0, version=1, status=ReplicaStatus.READY,
                                     cloud="local", launched_at=now - 3000, status_since=now - 2900,
                                     launch_token="bench", first_ready_at=now - 2900)
            added = store.add_replicas(name, replicas_per_service, template)
            # Each its own port and pid, as the local provider records them.
            store.put_replicas([
                dataclasses.replace(r, url=f"http://127.0.0.1:{20000 + index * 100 + r.replica_id}",
                                    instance_id=f"pid-{100000 + index * 100 + r.replica_id}")
                for r in added])
            store.set_service_status(name, ServiceStatus.READY, None)
        return len(store.list_replicas())
    finally:
        store.close()


def median_ms(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, int]:
    """The median wall time of ``runs`` runs of ``argv`` (after one warm-up run), and its stdout's size."""
    size = 0
    times = []
    for attempt in range(runs + 1):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
        elapsed = (time.perf_counter() - start) * 1000
        size = len(done.stdout)
        if attempt:  # the first run warms the page cache and the .pyc files
            times.append(elapsed)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--replicas-per-service", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sky-lite", dest="command", default=None, help="The command to run.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as home:
        replicas = fill_store(Path(home), args.services, args.replicas_per_service)
        env = {**os.environ, "SKY_LITE_HOME": home}
        env.pop("SKY_LITE_CONTROLLER", None)  # this machine's store, never a recorded host
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: the warm-up run writes the .pyc files
        command = [*([args.command] if args.command else default_command()), "serve", "status"]
        print(f"{' '.join(command)} over {replicas} replicas in {args.services} services, median of {args.runs} "
              "runs:")
        for label, extra in (("table (piped)", []), ("-o json", ["-o", "json"]), ("one service", ["svc-000"])):
            ms, size = median_ms([*command, *extra], env, args.runs)
            print(f"  {label:<14} {ms:7.0f} ms wall  ({size / 1024:.0f} KiB of output)")


if __name__ == "__main__":
    main()
