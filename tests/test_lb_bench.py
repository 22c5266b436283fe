"""benchmarks/lb_bench.py's arithmetic, which the figures in docs/benchmarks.md rest on: the per-request rates
between two readings of /proc, the medians over rounds, and the --workers argument."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "lb_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lb_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lb_bench"] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["lb_bench"]
    return module


# (proxy before, proxy after, replicas before, replicas after, machine before, machine after, requests)
#   -> (cpu_us, preempted, replicas_cpu_us, idle_percent)
RATES = {
    "all known": (
        (1.0, 10), (1.5, 60), (2.0, 0), (3.0, 5), (1000, 100), (2000, 200), 10_000,
        (50.0, 0.005, 100.0, 10.0),
    ),
    "no proxy (a process gone)": (
        None, (1.5, 60), (2.0, 0), (2.5, 0), (1000, 100), (1100, 150), 1000, (None, None, 500.0, 50.0),
    ),
    "no replicas (the direct path)": (
        (0.0, 0), (0.1, 0), None, None, (0, 0), (100, 0), 1000, (100.0, 0.0, None, 0.0),
    ),
    "no ticks passed": ((0.0, 0), (0.1, 0), None, None, (5, 1), (5, 1), 1000, (100.0, 0.0, None, None)),
    "no requests": ((0.0, 0), (0.1, 0), (0.0, 0), (0.1, 0), (0, 0), (100, 50), 0, (None, None, None, None)),
}


@pytest.mark.parametrize("case", RATES.values(), ids=RATES.keys())
def test_rates_per_request_between_two_readings(bench: ModuleType, case: tuple[object, ...]) -> None:
    proxy_a, proxy_b, replicas_a, replicas_b, machine_a, machine_b, requests, expected = case
    result = bench.WrkResult(rps=1.0, p50_ms=1.0, p99_ms=2.0, errors=0, requests=requests)
    rated = bench.compute_rates(
        result, bench.Counters(proxy_a, replicas_a, machine_a), bench.Counters(proxy_b, replicas_b, machine_b)
    )
    got = (rated.cpu_us, rated.preempted, rated.replicas_cpu_us, rated.idle_percent)
    assert isinstance(expected, tuple)
    assert [g is None for g in got] == [e is None for e in expected], got
    assert [g for g in got if g is not None] == pytest.approx([e for e in expected if e is not None])


def test_medians_are_of_each_figure_and_unknown_when_a_round_could_not_tell(bench: ModuleType) -> None:
    rounds = [
        bench.WrkResult(100.0, 1.0, 3.0, 0, 10, cpu_us=30.0, preempted=0.5, replicas_cpu_us=40.0, idle_percent=5.0),
        bench.WrkResult(300.0, 2.0, 1.0, 1, 20, cpu_us=10.0, preempted=0.7, replicas_cpu_us=None, idle_percent=7.0),
        bench.WrkResult(200.0, 3.0, 2.0, 2, 30, cpu_us=20.0, preempted=0.6, replicas_cpu_us=42.0, idle_percent=6.0),
    ]
    median = bench.median_result(rounds)
    assert (median.rps, median.p50_ms, median.p99_ms) == (200.0, 2.0, 2.0)
    assert (median.errors, median.requests) == (3, 60)
    assert (median.cpu_us, median.preempted, median.idle_percent) == (20.0, 0.6, 6.0)
    assert median.replicas_cpu_us is None  # one round could not tell: no median of the other two


@pytest.mark.parametrize(("text", "expected"), [("1", (1,)), ("1,2", (1, 2)), (" 2 , 3 ", (2, 3))])
def test_workers_argument(bench: ModuleType, text: str, expected: tuple[int, ...]) -> None:
    assert bench.parse_workers(text) == expected


@pytest.mark.parametrize("text", ["", "0", "1,x", "-1", "2,2"])
def test_a_bad_workers_argument_is_refused_by_name(bench: ModuleType, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--workers"):
        bench.parse_workers(text)
