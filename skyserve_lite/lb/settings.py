"""Load balancer settings read from the environment; no aiohttp here, so the CLI can validate them cheaply.

``SKY_LITE_LB_HOLD_SECONDS``
    How long a request waits for a READY replica before it gets 503 (default 30; 0 or more).
``SKY_LITE_LB_MAX_CONNECTIONS``
    Client connections open at once (a whole number, at least 1). At the limit a new connection closes the
    client connection idle the longest to take its place; with none idle it gets 503 and is closed. Unset,
    ``compute_default_max_connections`` of the open-file limit, which the load balancer raises to the hard
    limit at start.
``SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT``
    Client connections open at once from one client address (a whole number, at least 1); the next one
    from that address gets 503 and is closed. Unset, a quarter of the connection limit
    (``compute_default_max_connections_per_client``).
``SKY_LITE_LB_HEAD_SECONDS``
    The deadline for a request's head (default 10; more than 0): a new connection must send a whole
    request head within it, and a kept-alive one within it of the head's first byte; else it is closed
    (with 408 when part of a head came).
``SKY_LITE_LB_KEEPALIVE_SECONDS``
    How long a client connection may sit idle between requests before it is closed (default 20; more
    than 0).
``SKY_LITE_LB_UPSTREAM_TIMEOUT_SECONDS``
    How long a replica may take to send its response head once it has the request (default 600; more
    than 0); past it the client gets 504 and the attempt counts as the replica's failure.
``SKY_LITE_LB_EJECT_AFTER_FAILURES``
    Failed attempts in a row (no connection, a reset, an invalid answer, a timeout) after which a replica
    is ejected from the rotation (default 5; 0 never ejects).
``SKY_LITE_LB_EJECT_SECONDS``
    How long an ejected replica gets no request before a trial one (default 30; more than 0).

``SKY_LITE_LB_WORKERS``
    Processes serving the endpoint (a whole number, at least 1, or ``auto``: one per CPU the process may
    run on). Unset: 2 where the load balancer runs compiled (setup.py) on 2 or more CPUs, else 1
    (``compute_worker_count``: a second process pays off only compiled; docs/benchmarks.md). With more
    than one, a parent process owns the port and hands each connection to the worker with the fewest
    (``lb.workers``). Where sockets cannot be passed between processes (not Linux) it is always 1.

``LbSettings.from_env`` reads them all and raises ``UsageError`` naming the first invalid variable.
The deadlines are checked by one sweep a second, so each may run up to a second longer than set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

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
# One client address may hold a quarter of the connections by default: with the 480 connections of an
# open-file limit of 1,024 that is 120, so one client holding thousands of idle connections leaves 360 to
# everyone else, and at least four addresses are needed to fill the load balancer (where the oldest idle
# connections then make room for new ones). Behind a proxy every client has the proxy's address: set
# SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT to the connection limit there.
PER_CLIENT_SHARE: Final = 4
# nginx's client_header_timeout is 60 s; a client on any working network sends a head (a few hundred
# bytes, 8 KiB at most) in well under a second, and 10 s is what an idle or trickling connection may hold
# a place without sending a request.
DEFAULT_HEAD_SECONDS: Final = 10.0
# Above the idle timeouts of common client pools (httpx 5 s, aiohttp's client 15 s), so that those close
# an idle connection first and never send a request down one the load balancer is closing; far below
# nginx's 75 s, which let idle connections hold places for a minute and a half.
DEFAULT_KEEPALIVE_SECONDS: Final = 20.0
# The OpenAI client's own default: a non-streamed answer of thousands of tokens takes minutes, and a
# replica silent for 10 minutes after a request is stuck, not busy.
DEFAULT_UPSTREAM_TIMEOUT_SECONDS: Final = 600.0
# Envoy's outlier detection defaults: 5 consecutive failures, 30 s ejection.
DEFAULT_EJECT_AFTER_FAILURES: Final = 5
DEFAULT_EJECT_SECONDS: Final = 30.0

HOLD_SECONDS_VARIABLE: Final = "SKY_LITE_LB_HOLD_SECONDS"
MAX_CONNECTIONS_VARIABLE: Final = "SKY_LITE_LB_MAX_CONNECTIONS"
MAX_CONNECTIONS_PER_CLIENT_VARIABLE: Final = "SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT"
HEAD_SECONDS_VARIABLE: Final = "SKY_LITE_LB_HEAD_SECONDS"
KEEPALIVE_SECONDS_VARIABLE: Final = "SKY_LITE_LB_KEEPALIVE_SECONDS"
UPSTREAM_TIMEOUT_VARIABLE: Final = "SKY_LITE_LB_UPSTREAM_TIMEOUT_SECONDS"
EJECT_AFTER_FAILURES_VARIABLE: Final = "SKY_LITE_LB_EJECT_AFTER_FAILURES"
EJECT_SECONDS_VARIABLE: Final = "SKY_LITE_LB_EJECT_SECONDS"
WORKERS_VARIABLE: Final = "SKY_LITE_LB_WORKERS"
# Unset, a compiled load balancer runs as a parent and 2 workers: measured 0.82x nginx's requests/s against
# 0.64x for one compiled process on 2 cores; more than the cores is worse (0.70x with 3 on 2).
DEFAULT_COMPILED_WORKERS: Final = 2
# A count of processes, "auto" (one per CPU) or "default" (``compute_worker_count``).
WorkerSetting = int | Literal["auto", "default"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What the client-facing server allows per connection and in all.

    ``max_per_client`` None means ``compute_default_max_connections_per_client(max_connections)``.
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_per_client: int | None = None
    head_seconds: float = DEFAULT_HEAD_SECONDS
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS

    @property
    def per_client(self) -> int:
        """Connections one client address may hold, never more than ``max_connections``."""
        if self.max_per_client is None:
            return compute_default_max_connections_per_client(self.max_connections)
        return min(self.max_per_client, self.max_connections)


@dataclass(frozen=True, slots=True)
class LbSettings:
    """The load balancer's settings; ``max_connections`` and ``max_connections_per_client`` None mean the
    defaults for the open-file limit (``connection_limits``)."""

    hold_seconds: float = DEFAULT_HOLD_SECONDS
    max_connections: int | None = None
    max_connections_per_client: int | None = None
    head_seconds: float = DEFAULT_HEAD_SECONDS
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
    upstream_timeout_seconds: float = DEFAULT_UPSTREAM_TIMEOUT_SECONDS
    eject_after_failures: int = DEFAULT_EJECT_AFTER_FAILURES
    eject_seconds: float = DEFAULT_EJECT_SECONDS
    workers: WorkerSetting = "default"  # a count, "auto" (one per CPU) or "default" (``compute_worker_count``)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LbSettings:
        """Every setting from ``environ``. Raises ``UsageError`` naming the first invalid variable."""
        return cls(
            hold_seconds=hold_seconds_from_env(environ),
            max_connections=max_connections_from_env(environ),
            max_connections_per_client=_count_from_env(environ, MAX_CONNECTIONS_PER_CLIENT_VARIABLE, 1),
            head_seconds=_positive_seconds(environ, HEAD_SECONDS_VARIABLE, DEFAULT_HEAD_SECONDS),
            keepalive_seconds=_positive_seconds(environ, KEEPALIVE_SECONDS_VARIABLE, DEFAULT_KEEPALIVE_SECONDS),
            upstream_timeout_seconds=_positive_seconds(
                environ, UPSTREAM_TIMEOUT_VARIABLE, DEFAULT_UPSTREAM_TIMEOUT_SECONDS
            ),
            eject_after_failures=_or_default(
                _count_from_env(environ, EJECT_AFTER_FAILURES_VARIABLE, 0), DEFAULT_EJECT_AFTER_FAILURES
            ),
            eject_seconds=_positive_seconds(environ, EJECT_SECONDS_VARIABLE, DEFAULT_EJECT_SECONDS),
            workers=workers_from_env(environ),
        )

    def connection_limits(self, open_file_limit: int) -> ConnectionLimits:
        """The server's limits for a process that may open ``open_file_limit`` files."""
        return ConnectionLimits(
            max_connections=self.max_connections or compute_default_max_connections(open_file_limit),
            max_per_client=self.max_connections_per_client,
            head_seconds=self.head_seconds,
            keepalive_seconds=self.keepalive_seconds,
        )


def hold_seconds_from_env(environ: Mapping[str, str]) -> float:
    """``SKY_LITE_LB_HOLD_SECONDS`` as a number of seconds (0 or more); ``DEFAULT_HOLD_SECONDS`` when unset
    or empty. Raises ``UsageError`` naming the variable for anything else ("abc", "-1", "inf")."""
    value = _seconds_from_env(environ, HOLD_SECONDS_VARIABLE)
    if value is None:
        return DEFAULT_HOLD_SECONDS
    if value < 0:
        text = environ[HOLD_SECONDS_VARIABLE].strip()
        raise UsageError(f"{HOLD_SECONDS_VARIABLE} must be a finite number of seconds >= 0, got {text!r}")
    return value


def max_connections_from_env(environ: Mapping[str, str]) -> int | None:
    """``SKY_LITE_LB_MAX_CONNECTIONS`` as a whole number (1 or more); None when unset or empty. Raises
    ``UsageError`` naming the variable for anything else ("many", "2.5", "0")."""
    return _count_from_env(environ, MAX_CONNECTIONS_VARIABLE, 1)


def workers_from_env(environ: Mapping[str, str]) -> WorkerSetting:
    """``SKY_LITE_LB_WORKERS``: a whole number (1 or more), or ``"auto"``; ``"default"`` when unset or empty.
    Raises ``UsageError`` naming the variable for anything else ("two", "0")."""
    if environ.get(WORKERS_VARIABLE, "").strip().lower() == "auto":
        return "auto"
    count = _count_from_env(environ, WORKERS_VARIABLE, 1)
    return "default" if count is None else count


def compute_worker_count(setting: WorkerSetting, cpus: int, can_hand_off: bool, compiled: bool) -> int:
    """How many processes serve: 1 where connections cannot be handed between processes; else a count as
    set, ``cpus`` for ``"auto"``, and by default ``DEFAULT_COMPILED_WORKERS`` (at most ``cpus``) where the
    load balancer runs compiled and 1 where it runs interpreted (two interpreted processes spend more CPU
    for fewer requests: docs/benchmarks.md, "fifth pass"). Pure."""
    if not can_hand_off:
        return 1
    if setting == "auto":
        return max(1, cpus)
    if setting == "default":
        return max(1, min(DEFAULT_COMPILED_WORKERS, cpus)) if compiled else 1
    return setting


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def _seconds_from_env(environ: Mapping[str, str], name: str) -> float | None:
    """``name`` as a finite number; None when unset or empty. Raises ``UsageError`` naming it otherwise."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number of seconds, got {text!r}")
    return value


def _positive_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    value = _seconds_from_env(environ, name)
    if value is None:
        return default
    if value <= 0:
        raise UsageError(f"{name} must be a number of seconds > 0, got {environ[name].strip()!r}")
    return value


def _count_from_env(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    """``name`` as a whole number of at least ``minimum``; None when unset or empty. Raises ``UsageError``
    naming the variable for anything else."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name} must be a whole number, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{name} must be at least {minimum}, got {text!r}")
    return value


def compute_default_max_connections(open_file_limit: int) -> int:
    """The connection limit when ``SKY_LITE_LB_MAX_CONNECTIONS`` is unset, for a process that may open
    ``open_file_limit`` files.

    A client connection holds one descriptor, and one with a request in flight a second for its upstream
    connection to the replica, so half of what ``FD_RESERVE`` leaves, at most ``DEFAULT_MAX_CONNECTIONS``:
    1,024 -> 480, 20,000 -> 9,968, 1,048,576 -> 10,000. At least 1, even for a limit below the reserve.
    """
    return max(1, min(DEFAULT_MAX_CONNECTIONS, (open_file_limit - FD_RESERVE) // 2))


def compute_default_max_connections_per_client(max_connections: int) -> int:
    """The per-address limit when ``SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT`` is unset: a quarter of
    ``max_connections`` (``PER_CLIENT_SHARE``), at least 1: 480 -> 120, 10,000 -> 2,500, 3 -> 1."""
    return max(1, max_connections // PER_CLIENT_SHARE)
