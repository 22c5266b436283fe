"""The replica supervisor's log capture: every line the workload prints, stdout and stderr, lands in the log
with its UTC time in front, none held back or lost, and a busy copy never delays a stop."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from skyserve_lite import supervisor
from skyserve_lite.logview import find_line_time
from skyserve_lite.supervisor import format_line_time, stamp_lines

pytestmark = pytest.mark.skipif(not supervisor.is_supported(), reason="the supervisor runs on Linux only")

STAMP = b"T "
PREFIX = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
SH = shutil.which("sh") or "/bin/sh"


@pytest.mark.parametrize(
    ("data", "at_line_start", "expected", "ends_line"),
    [
        pytest.param(b"one\n", True, b"T one\n", True, id="a-whole-line"),
        pytest.param(b"one\ntwo\n", True, b"T one\nT two\n", True, id="two-lines"),
        pytest.param(b"one\ntw", True, b"T one\nT tw", False, id="a-partial-line-is-written-at-once"),
        pytest.param(b"o\n", False, b"o\n", True, id="the-rest-of-a-line-gets-no-second-stamp"),
        pytest.param(b"\n\n", True, b"T \nT \n", True, id="empty-lines-are-lines"),
        pytest.param(b"", False, b"", False, id="nothing"),
        pytest.param(b"\xff\x00bin", True, b"T \xff\x00bin", False, id="binary-data-passes"),
    ],
)
def test_stamp_lines(data: bytes, at_line_start: bool, expected: bytes, ends_line: bool) -> None:
    assert stamp_lines(data, at_line_start, STAMP) == (expected, ends_line)


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        pytest.param(1_767_225_600.0, b"2026-01-01T00:00:00.000Z ", id="whole-second"),
        pytest.param(1_796_146_205.1239, b"2026-12-01T17:30:05.123Z ", id="milliseconds-cut-not-rounded"),
    ],
)
def test_format_line_time_is_iso_utc_and_reads_back(epoch: float, expected: bytes) -> None:
    assert format_line_time(epoch) == expected
    assert find_line_time(expected + b"hello\n") == pytest.approx(int(epoch * 1000) / 1000)


def run_supervised(tmp_path: Path, script: str, *, timeout: float = 30) -> tuple[int, bytes]:
    """Run ``script`` under the supervisor with its output to a log, as the local provider does."""
    log = tmp_path / "replica.log"
    with log.open("ab") as out:
        done = subprocess.run(supervisor.supervisor_argv(tmp_path / "pid", 1, [SH, "-c", script]), stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    return done.returncode, log.read_bytes()


def lines_of(log: bytes) -> list[bytes]:
    """The log's lines without their time prefix; every line must have one."""
    lines = log.split(b"\n")
    assert lines[-1] == b"", "the log ends with a whole line"
    for line in lines[:-1]:
        assert re.match(PREFIX, line), line[:80]
    return [line[25:] for line in lines[:-1]]


def test_stdout_and_stderr_lines_are_stamped_and_a_partial_last_line_is_kept(tmp_path: Path) -> None:
    code, log = run_supervised(tmp_path, "echo out; echo err >&2; printf 'no newline'; exit 3")
    assert code == 3
    assert lines_of(log) == [b"out", b"err", b"no newline"]


def test_a_long_line_and_binary_data_come_through_whole(tmp_path: Path) -> None:
    # 300,000 bytes without a newline: read in several pieces, stamped once.
    script = "head -c 300000 /dev/zero | tr '\\0' x; echo; printf '\\377\\001\\n'; echo after"
    code, log = run_supervised(tmp_path, script)
    assert code == 0
    assert lines_of(log) == [b"x" * 300_000, b"\xff\x01", b"after"]


def test_lines_carry_the_time_they_were_printed(tmp_path: Path) -> None:
    before = time.time()
    _code, log = run_supervised(tmp_path, "echo first; sleep 1; echo second")
    first, second = (find_line_time(line) for line in log.splitlines())
    assert first is not None and second is not None
    assert before - 0.01 <= first <= second - 0.9
    assert second <= time.time() + 0.01


def test_the_supervisors_own_message_is_stamped(tmp_path: Path) -> None:
    log = tmp_path / "replica.log"
    with log.open("ab") as out:
        code = subprocess.run(supervisor.supervisor_argv(tmp_path / "pid", 1, [str(tmp_path / "missing")]),
                              stdout=out, stderr=subprocess.STDOUT, timeout=30, check=False).returncode
    assert code == 127
    assert re.fullmatch(PREFIX + rb"sky-lite: cannot start .*missing: No such file or directory\n", log.read_bytes())


def test_a_stop_is_not_held_up_by_a_workload_that_prints_without_pause(tmp_path: Path) -> None:
    log = tmp_path / "replica.log"
    with log.open("ab") as out:
        process = subprocess.Popen(supervisor.supervisor_argv(tmp_path / "pid", 1,
                                                              [SH, "-c", "while :; do echo busy; done"]),
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while log.stat().st_size < 10_000:
            assert time.monotonic() < deadline, "the workload's output never reached the log"
            time.sleep(0.05)
        started = time.monotonic()
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=10) == 128 + signal.SIGTERM
        assert time.monotonic() - started < 3
    finally:
        process.kill()
        process.wait()
    assert set(lines_of(log.read_bytes())) == {b"busy"}
