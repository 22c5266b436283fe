"""Start-up of the command: wall time of `sky-lite --help` and of `sky-lite serve status` on an empty state
directory, each a fresh process as a user runs it; the median of N runs (after one warm-up run).

    python benchmarks/cli_startup_bench.py [--runs 21] [--sky-lite PATH]

``--sky-lite``: the command to run (default: the `sky-lite` next to this Python, else `python -m
skyserve_lite`). `serve status` on a home with no store finds none and prints one line without loading the
store; nothing is started or written.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def default_command() -> list[str]:
    beside = Path(sys.executable).with_name("sky-lite")
    found = str(beside) if beside.exists() else shutil.which("sky-lite")
    return [found] if found else [sys.executable, "-m", "skyserve_lite"]


def median_ms(argv: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for attempt in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if attempt:  # the first run warms the page cache and writes the .pyc files
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--sky-lite", dest="command", default=None, help="The command to run.")
    args = parser.parse_args()
    command = [args.command] if args.command else default_command()

    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "SKY_LITE_HOME": home}
        env.pop("SKY_LITE_CONTROLLER", None)  # this machine's (empty) store, never a recorded host
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: the warm-up run writes the .pyc files
        print(f"{' '.join(command)}, median of {args.runs} runs:")
        for label, extra in (("--help", ["--help"]), ("serve --help", ["serve", "--help"]),
                             ("serve status (no service)", ["serve", "status"])):
            print(f"  {label:<26} {median_ms([*command, *extra], env, args.runs):6.0f} ms wall")


if __name__ == "__main__":
    main()
