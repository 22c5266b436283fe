"""Failover with real processes: three controllers on one PostgreSQL database, three services of the local
provider, one controller killed with SIGKILL per trial at a random point (between a launch's intent and its
outcome, mid rolling update, mid scale-down: each as often as the others, in a random order, at a random
moment within it, the service's owner killed). Prints each trial (takeover and convergence times after the
kill; duplicate, leaked and left-over replicas), a summary, and the machine.

    python benchmarks/failover_bench.py --trials 20 [--seed 26] [--point launch] [--lease-ttl 4]

Starts its own PostgreSQL server on 127.0.0.1 (tests/postgres.py; initdb and pg_ctl must be installed) and
removes it at the end. The fleet, the points and the checks are tests/e2e/failover_harness.py's, which
tests/e2e/test_failover_processes.py runs at one trial. The killed controller is started again after each
trial (a new loop id), so every trial begins with three. Exit status 1 when a trial found a duplicate, a
leak, a service that did not converge or a process left after `serve down`.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--point", choices=("launch", "rolling", "scale-down"),
                        help="every trial at this point (default: each point as often as the others)")
    parser.add_argument("--lease-ttl", type=float, default=4.0, help="SKY_LITE_LEASE_TTL_SECONDS (renewal: 1 s)")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.lease_ttl <= 1.0:
        parser.error("--lease-ttl must be more than the 1 s renewal")
    sys.path.insert(0, str(REPO))
    from tests.e2e.failover_harness import POINTS, FleetSettings, TrialResult, running_fleet, summarize
    from tests.postgres import find_postgres_bin, start_postgres

    bin_dir = find_postgres_bin()
    if bin_dir is None:
        sys.exit("PostgreSQL (initdb, pg_ctl) is not installed (Debian: apt-get install postgresql)")
    server = start_postgres(bin_dir)
    results: list[TrialResult] = []
    started = time.monotonic()
    try:
        url = server.url(server.create_database())
        rng = random.Random(args.seed)
        settings = FleetSettings(lease_ttl_seconds=args.lease_ttl)
        with tempfile.TemporaryDirectory(prefix="failover-bench-") as root, \
                running_fleet(Path(root), url, settings, log=print) as fleet:
            # Every point as often as the others (20 trials: 7, 7, 6), in a random order.
            points = [args.point or POINTS[n % len(POINTS)] for n in range(args.trials)]
            rng.shuffle(points)
            for trial, point in enumerate(points, start=1):
                result = fleet.run_trial(trial, rng, point)
                results.append(result)
                print(result.describe(), flush=True)
    finally:
        server.stop()
    print()
    for line in summarize(results):
        print(line)
    print(f"lease TTL {args.lease_ttl:g} s, renewal 1 s, pass every 0.5 s, drain 1.5 s; seed {args.seed}; "
          f"{time.monotonic() - started:.0f} s in all")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
