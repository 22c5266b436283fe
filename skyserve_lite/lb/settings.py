"""Load balancer settings read from the environment; no aiohttp here, so the CLI can validate them cheaply.

``SKY_LITE_LB_HOLD_SECONDS``
    How long a request waits for a READY replica before it gets 503 (default 30; 0 or more).
``SKY_LITE_LB_MAX_CONNECTIONS``
    Client connections open at once; the next one gets 503 and is closed (a whole number, at least 1).
    Unset, ``compute_default_max_connections`` of the open-file limit, which the load balancer raises to
    the hard limit at start.

``LbSettings.from_env`` reads both and raises ``UsageError`` naming the variable for an invalid value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from skyserve_lite.errors import UsageError

# How long a request waits for a READY replica before it gets 503 (see DEFAULT_MAX_WAITING in proxy.py for
# the reasoning): long enough for a replica to start, short of common client timeouts (60 s).
DEFAULT_HOLD_SECONDS: Final = 30.0
# The most client connections by default, however many files the process may open: an idle connection
# costs some 10 KiB of parser and buffers in the load balancer, so 10,000 are about 100 MiB; a service
# that needs more sets SKY_LITE_LB_MAX_CONNECTIONS.
DEFAULT_MAX_CONNECTIONS: Final = 10_000
# Descriptors the process needs besides connections: the listening socket, the state store (database,
# WAL and shared-memory files), the log, the interpreter's own; about 20 in practice, 64 leaves room.
FD_RESERVE: Final = 64

HOLD_SECONDS_VARIABLE: Final = "SKY_LITE_LB_HOLD_SECONDS"
MAX_CONNECTIONS_VARIABLE: Final = "SKY_LITE_LB_MAX_CONNECTIONS"


@dataclass(frozen=True, slots=True)
class LbSettings:
    """The load balancer's settings; ``max_connections`` None means the default for the open-file limit."""

    hold_seconds: float = DEFAULT_HOLD_SECONDS
    max_connections: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LbSettings:
        """Both settings from ``environ``. Raises ``UsageError`` naming the first invalid variable."""
        return cls(hold_seconds=hold_seconds_from_env(environ), max_connections=max_connections_from_env(environ))


def hold_seconds_from_env(environ: Mapping[str, str]) -> float:
    """``SKY_LITE_LB_HOLD_SECONDS`` as a number of seconds (0 or more); ``DEFAULT_HOLD_SECONDS`` when unset
    or empty. Raises ``UsageError`` naming the variable for anything else ("abc", "-1", "inf")."""
    text = environ.get(HOLD_SECONDS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_HOLD_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{HOLD_SECONDS_VARIABLE} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{HOLD_SECONDS_VARIABLE} must be a finite number of seconds >= 0, got {text!r}")
    return value


def max_connections_from_env(environ: Mapping[str, str]) -> int | None:
    """``SKY_LITE_LB_MAX_CONNECTIONS`` as a whole number (1 or more); None when unset or empty. Raises
    ``UsageError`` naming the variable for anything else ("many", "2.5", "0")."""
    text = environ.get(MAX_CONNECTIONS_VARIABLE, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{MAX_CONNECTIONS_VARIABLE} must be a whole number of connections, got {text!r}") from None
    if value < 1:
        raise UsageError(f"{MAX_CONNECTIONS_VARIABLE} must be at least 1, got {text!r}")
    return value


def compute_default_max_connections(open_file_limit: int) -> int:
    """The connection limit when ``SKY_LITE_LB_MAX_CONNECTIONS`` is unset, for a process that may open
    ``open_file_limit`` files.

    A client connection holds one descriptor, and one with a request in flight a second for its upstream
    connection to the replica, so half of what ``FD_RESERVE`` leaves, at most ``DEFAULT_MAX_CONNECTIONS``:
    1,024 -> 480, 20,000 -> 9,968, 1,048,576 -> 10,000. At least 1, even for a limit below the reserve.
    """
    return max(1, min(DEFAULT_MAX_CONNECTIONS, (open_file_limit - FD_RESERVE) // 2))
