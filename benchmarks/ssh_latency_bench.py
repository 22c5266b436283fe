"""Latency of `serve status` and `serve update --dry-run` through a controller host over SSH, cold (a new
connection for each command) and warm (the shared ControlMaster connection), against the same state read
by this machine's own controller (the host's state directory read directly). The host's controller loop
runs, so each `controller rpc` relays its call to the loop (``remote.relay``).

Everything runs on 127.0.0.1: a throwaway sshd (the tests' helper), `sky-lite controller up --ssh` into a
private state directory, one stored service with two versions. Each figure is the wall time of a whole
`sky-lite` process, as a user sees it.

    python benchmarks/ssh_latency_bench.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.remote.sshd import start_sshd  # noqa: E402  (the tests' throwaway sshd)

TASK = """\
name: bench
service:
  readiness_probe: /
  replicas: {replicas}
run: python3 -m http.server $PORT
"""


def sky(home: Path, *args: str, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "skyserve_lite", *args], check=True, capture_output=True, cwd=REPO,
                   env=dict(os.environ, SKY_LITE_HOME=str(home), **(env or {})), stdin=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(label: str, runs: int, run: object, before: object = None) -> float:
    times = []
    for _ in range(runs):
        if callable(before):
            before()
        times.append(run() if callable(run) else 0.0)
    median = statistics.median(times)
    print(f"{label:<44} median {median * 1000:7.1f} ms   p90 {sorted(times)[int(0.9 * (runs - 1))] * 1000:7.1f} ms")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sky-ssh-bench-") as folder:
        root = Path(folder)
        sshd = start_sshd(root / "sshd")
        (sshd.bin_dir / "crontab").write_text("#!/bin/sh\n[ \"$1\" = -l ] && exit 0; cat > /dev/null\n")
        (sshd.bin_dir / "crontab").chmod(0o755)
        local, remote = root / "client", root / "host"
        try:
            python = str(getattr(sys, "_base_executable", sys.executable))
            subprocess.run([sys.executable, "-m", "skyserve_lite", "controller", "up", "--ssh", sshd.target, "-i",
                            str(sshd.client_key), "--remote-home", str(remote), "--remote-python", python],
                           check=True, capture_output=True, env=dict(os.environ, SKY_LITE_HOME=str(local)))
            task, update = root / "task.yaml", root / "update.yaml"
            task.write_text(TASK.format(replicas=2))
            update.write_text(TASK.format(replicas=3))
            sky(local, "serve", "up", str(task), "--no-wait")

            def cold() -> None:
                subprocess.run([sys.executable, "-c", "import sys; from skyserve_lite.remote.config import "
                                "load_record; from skyserve_lite.remote.connect import record_shell; from pathlib "
                                "import Path; h = Path(sys.argv[1]); record_shell(h, load_record(h)).close()",
                                str(local)], check=True)

            print(f"sky-lite over ssh on 127.0.0.1, {args.runs} runs each (whole CLI processes)")
            for label, command in (("serve status", ("serve", "status")),
                                   ("serve update --dry-run", ("serve", "update", "bench", str(update),
                                                               "--dry-run"))):
                base = measure(f"{label}: local controller", args.runs, lambda c=command: sky(remote, *c))
                measure(f"{label}: ssh, cold (new connection)", args.runs, lambda c=command: sky(local, *c), cold)
                warm = measure(f"{label}: ssh, warm (shared connection)", args.runs,
                               lambda c=command: sky(local, *c))
                print(f"{'':<44} warm - local = {(warm - base) * 1000:+.1f} ms")
        finally:
            subprocess.run([sys.executable, "-m", "skyserve_lite", "controller", "down", "-y", "--force"],
                           capture_output=True, env=dict(os.environ, SKY_LITE_HOME=str(local)))
            subprocess.run([sys.executable, "-m", "skyserve_lite", "serve", "down", "--all", "--force", "-y"],
                           capture_output=True, env=dict(os.environ, SKY_LITE_HOME=str(remote)))
            sshd.stop()


if __name__ == "__main__":
    main()
