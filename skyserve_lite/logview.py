"""What `serve logs` shows of a log first: `--since DURATION` and `--tail N` over its lines. Pure.

A line's time is its prefix: ``2026-12-01T17:30:05.123Z `` (UTC; what a local replica's supervisor writes,
``supervisor.format_line_time``), or ``2026-12-01 17:30:05,123 `` (Python's logging default, the host's
local time: the controller's and the load balancers' logs). A line without one (a traceback, a long line
the supervisor wrote in pieces, the console of a cloud instance, a replica started by an older sky-lite)
goes with the line before it; lines before the first time are shown, since nothing says they are old, so a
log without any times is shown whole.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone

from skyserve_lite.errors import UsageError

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_ISO_UTC = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?Z ")
_LOGGING_LOCAL = re.compile(rb"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),(\d{3}) ")


def parse_duration(text: str, option: str = "--since") -> float:
    """Seconds in ``30s``, ``5m``, ``2h``, ``1d``, ``1.5h`` or ``1h30m``. Raises ``UsageError`` (exit 2)
    naming ``option`` for anything else."""
    if not _DURATION.fullmatch(text.strip()):
        raise UsageError(f"{option}: {text!r} is not a duration: write a number and a unit, s, m, h or d "
                         "(30s, 5m, 2h, 1d)")
    return float(sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(text)))


def find_line_time(line: bytes) -> float | None:
    """The time of ``line`` (seconds since the epoch) from its prefix (module docstring); None when it has
    none. A logging-style prefix is read in this machine's time zone, the one that wrote it."""
    if not line[:1].isdigit():
        return None
    iso = _ISO_UTC.match(line)
    if iso is not None:
        year, month, day, hour, minute, second = (int(f) for f in iso.groups()[:6])
        fraction: bytes = iso.group(7) or b"0"
        try:
            moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
        except ValueError:  # digits in the shape of a date that is none (month 13)
            return None
        return moment.timestamp() + int(fraction) / 10.0 ** len(fraction)
    local = _LOGGING_LOCAL.match(line)
    if local is not None:
        year, month, day, hour, minute, second, millis = (int(f) for f in local.groups())
        try:
            datetime(year, month, day, hour, minute, second)  # mktime would carry month 13 into the next year
        except ValueError:
            return None
        return time.mktime((year, month, day, hour, minute, second, 0, 0, -1)) + millis / 1000
    return None


def select_lines(lines: Iterable[bytes], *, since: float | None = None, tail: int | None = None
                 ) -> Iterator[bytes]:
    """The ``lines`` to show: those at or after ``since`` (seconds since the epoch; a line without a time
    goes with the line before it, and those before the first time are kept), then of those the last
    ``tail``. Without ``tail`` the lines stream through; with it at most ``tail`` are held."""
    kept: Iterable[bytes] = lines if since is None else _since(lines, since)
    if tail is None:
        yield from kept
    else:
        yield from deque(kept, maxlen=tail)


def _since(lines: Iterable[bytes], since: float) -> Iterator[bytes]:
    keep = True
    for line in lines:
        moment = find_line_time(line)
        if moment is not None:
            keep = moment >= since
        if keep:
            yield line
