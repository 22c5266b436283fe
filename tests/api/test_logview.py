"""`serve logs --since/--tail`: durations, the time prefixes of log lines, which lines are shown first, and
the same selection on a real file that then keeps being followed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.api import read_file_chunks
from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import UsageError
from skyserve_lite.logview import find_line_time, parse_duration, select_lines

T0 = 1_796_146_200.0  # 2026-12-01T17:30:00Z


@pytest.fixture
def utc_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process in UTC, so that logging-style (local time) prefixes read as the table says."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("30s", 30, id="seconds"),
        pytest.param("5m", 300, id="minutes"),
        pytest.param("2h", 7200, id="hours"),
        pytest.param("1d", 86400, id="days"),
        pytest.param("1.5h", 5400, id="a-fraction"),
        pytest.param("1h30m", 5400, id="parts-add-up"),
        pytest.param("0s", 0, id="zero-is-now"),
        pytest.param(" 10m ", 600, id="blanks-around"),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "m", "-5m", "5 m", "5w", "1e3s", "nan", "inf", "5m-", "five minutes"])
def test_parse_duration_refuses_what_is_none_naming_the_option(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--since: .* is not a duration: .*30s, 5m, 2h, 1d") as caught:
        parse_duration(text)
    assert caught.value.exit_code == 2


@pytest.mark.usefixtures("utc_zone")
@pytest.mark.parametrize(
    ("line", "moment"),
    [
        pytest.param(b"2026-12-01T17:30:00.000Z hello\n", T0, id="replica-line"),
        pytest.param(b"2026-12-01T17:30:05.123Z x", T0 + 5.123, id="milliseconds"),
        pytest.param(b"2026-12-01T17:30:05Z x", T0 + 5, id="whole-seconds"),
        pytest.param(b"2026-12-01 17:30:05,250 INFO skyserve_lite.controller.loop: started\n", T0 + 5.25,
                     id="logging-default-in-local-time"),
        pytest.param(b"    at line 3\n", None, id="a-traceback-line"),
        pytest.param(b"2026-12-01T17:30:05.123Zx", None, id="no-space-after"),
        pytest.param(b"2026-13-01T17:30:05.123Z x", None, id="no-such-month"),
        pytest.param(b"2026-02-30 17:30:05,250 x", None, id="no-such-day-in-local-time"),
        pytest.param(b"[    0.000000] Linux version", None, id="a-kernel-console-line"),
        pytest.param(b"", None, id="empty"),
    ],
)
def test_find_line_time(line: bytes, moment: float | None) -> None:
    found = find_line_time(line)
    assert found == (pytest.approx(moment) if moment is not None else None)


def at(offset: float, text: str) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(T0 + offset))
    return f"{stamp}.000Z {text}\n".encode()


LOG = [at(0, "a"), at(60, "b"), b"  b continued\n", at(120, "c"), at(180, "d"), b"d continued"]


@pytest.mark.parametrize(
    ("since", "tail", "expected"),
    [
        pytest.param(None, None, LOG, id="everything"),
        pytest.param(T0 + 120, None, LOG[3:], id="since-a-moment"),
        pytest.param(T0 + 30, None, LOG[1:], id="a-continuation-goes-with-its-line"),
        pytest.param(T0 + 1000, None, [], id="nothing-that-recent"),
        pytest.param(T0 - 1000, None, LOG, id="everything-that-recent"),
        pytest.param(None, 2, LOG[-2:], id="tail"),
        pytest.param(None, 0, [], id="tail-zero"),
        pytest.param(None, 100, LOG, id="tail-longer-than-the-log"),
        pytest.param(T0 + 30, 2, LOG[-2:], id="since-then-tail"),
        pytest.param(T0 + 150, 5, LOG[-2:], id="tail-of-what-since-kept"),
    ],
)
def test_select_lines(since: float | None, tail: int | None, expected: list[bytes]) -> None:
    assert list(select_lines(LOG, since=since, tail=tail)) == expected


def test_lines_before_the_first_time_are_kept_so_a_log_without_times_is_shown_whole() -> None:
    console = [b"[    0.1] kernel\n", b"cloud-init: ok\n"]
    assert list(select_lines(console, since=T0)) == console
    assert list(select_lines([*console, at(0, "old"), at(200, "new")], since=T0 + 100)) == [*console, at(200, "new")]


def test_file_selection_then_follow(tmp_path: Path) -> None:
    log = tmp_path / "replica.log"
    log.write_bytes(b"".join(LOG[:-1]))  # whole lines only
    chunks = read_file_chunks(log, True, FakeClock(), since=T0 + 100, tail=1)
    assert next(chunks) == at(180, "d")
    assert next(chunks) == b""  # polled: nothing new
    with log.open("ab") as stream:
        stream.write(b"appended, shown whole\n")
    assert next(chunks) == b"appended, shown whole\n"
    chunks.close()  # type: ignore[attr-defined]


def test_file_selection_keeps_a_partial_last_line_and_long_lines(tmp_path: Path) -> None:
    log = tmp_path / "replica.log"
    long = at(60, "x" * 200_000)
    log.write_bytes(at(0, "old") + long + b"partial")
    assert b"".join(read_file_chunks(log, False, FakeClock(), since=T0 + 30)) == long + b"partial"
    assert b"".join(read_file_chunks(log, False, FakeClock(), tail=1)) == b"partial"
