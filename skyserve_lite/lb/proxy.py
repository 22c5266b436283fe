"""The proxy decisions: which replica gets a request, holding, retries, counting and load reports.

``LoadBalancer`` decides; the client-facing server (``skyserve_lite.lb.server``) speaks HTTP to clients and
calls it per request; replicas are reached through an ``UpstreamClient`` (``skyserve_lite.lb.upstream``), by
default the pooled one. Nothing here parses or writes HTTP bytes.

What happens per request:

1. ``select_target`` counts the request under its whole epoch second (from the injected clock) for the
   autoscaler and asks the policy for a replica; with none (a service scaled to zero, or one just starting)
   it holds the request until a replica is READY, up to ``hold_seconds`` and at most ``max_waiting``
   requests at once; None means answer ``no_replica_answer`` (503 naming ``sky-lite serve status``);
2. the server builds the replica's headers with ``render_upstream_headers`` (minus hop-by-hop ones, plus
   ``X-Forwarded-*``) and reads a body up to ``BUFFER_LIMIT`` whole, else hands it over as a stream;
3. ``forward`` sends method, path, query, headers and body; when an attempt gets no response head it may
   be retried once on another replica (``is_retryable``: any request when nothing was sent, an idempotent
   one with a body that can be sent again when the connection broke before the answer); when every
   attempt fails it returns the 502 to answer (504 after the upstream timeout);
4. the server relays status, headers (minus hop-by-hop ones) and body unchanged: no decompression, no
   recompression; ``is_buffered_response`` says whether the body is read whole or streamed. A 101 to a
   WebSocket handshake turns the connection into a tunnel to the replica.

Before step 1, ``check_request`` lets the service's ``Guard`` (``lb.guard``) decide the request: a
``LocalAnswer`` (429 with ``Retry-After``, 401 with ``WWW-Authenticate``) refuses it before any replica is
chosen, held or counted for the autoscaler (a flood of refused requests must not scale the service up).
With ``service.auth`` on, ``strips_authorization`` tells the server to keep the client's ``Authorization``
from the replica: the keys are the load balancer's.

A request is in flight to its replica from its first attempt until the server releases the response
(``Forwarded.release``: the body relayed, the client gone, or the tunnel closed), whatever ends it.
Failed attempts feed the passive health check (``outliers``): a replica failing
``eject_after_failures`` times in a row is left out of the rotation for ``eject_seconds``, then tried
again with one request.

Every finished attempt, and every answer the load balancer makes itself in place of a replica's (401,
429, 503, and the 502 or 504 after failed attempts), goes to the ``OutcomeSink`` sinks given to the
constructor as one ``Outcome`` (``lb.outcomes``): a failed attempt where it fails in ``forward``, a
response when ``Forwarded.release`` ends it, the others where they are decided. Nothing else records a
request's result, so the metrics and the canary counts cannot disagree.

Everything outside the request path comes in through the constructor: a ``TargetSource`` says which
replicas are READY and which policy to use (an ``LbView``, the store's own type, re-exported here), a
``MetricsSink`` takes the per-second request counts and the load reports, a ``Clock`` tells the time. A
background task (``start`` to ``close``) reads the source every ``refresh_seconds``, flushes the counts of
completed seconds to the sink and hands it a load report (requests in flight per replica, requests held)
when the load changed, or every ``REPORT_HEARTBEAT_SECONDS`` when it did not; on the same pass it reads a
``GuardSource`` (the current version's keys and limits) and ``configure``s the guard, keeping the config it
has when the keys cannot be read (logged once per problem). While requests are held it
reads the source at once and then every ``HOLD_REFRESH_SECONDS``, so that a replica turning READY is used
within about 0.1 s instead of one ``refresh_seconds`` later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import aiohttp

from skyserve_lite.clock import Clock
from skyserve_lite.defaults import LB_REFRESH_SECONDS
from skyserve_lite.endpoint_identity import IDENTITY_HEADER, IDENTITY_PATH
from skyserve_lite.errors import StateConflictError
from skyserve_lite.lb.guard import Allowed, Guard, GuardConfig, compute_answer
from skyserve_lite.lb.http1 import HOP_BY_HOP_HEADERS, HOP_BY_HOP_NAMES, RawHeaders
from skyserve_lite.lb.outcomes import Failure, Outcome, OutcomeSink
from skyserve_lite.lb.outliers import OutlierDetector
from skyserve_lite.lb.policies import ROUND_ROBIN, InFlight, Policy, make_policy
from skyserve_lite.lb.pooled_upstream import PooledUpstream
from skyserve_lite.lb.records import tuple_maker
from skyserve_lite.lb.settings import (
    DEFAULT_EJECT_AFTER_FAILURES,
    DEFAULT_EJECT_SECONDS,
    DEFAULT_HOLD_SECONDS,
    UPSTREAM_TIMEOUT_VARIABLE,
)
from skyserve_lite.lb.split import VersionSplit
from skyserve_lite.lb.upstream import (
    PendingResponse,
    UpstreamClient,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResetError,
    UpstreamResponse,
    UpstreamTimeoutError,
)
from skyserve_lite.state.models import LbReport, LbView

__all__ = [
    "BUFFER_LIMIT",
    "DEFAULT_HOLD_SECONDS",
    "DEFAULT_MAX_WAITING",
    "HOLD_REFRESH_SECONDS",
    "HOP_BY_HOP_HEADERS",
    "HOP_BY_HOP_NAMES",
    "IDEMPOTENT_METHODS",
    "IDENTITY_HEADER",
    "IDENTITY_PATH",
    "MAX_ATTEMPTS",
    "REPORT_HEARTBEAT_SECONDS",
    "STREAM_CHUNK",
    "ForwardListener",
    "Forwarded",
    "GuardSource",
    "LbReport",
    "LbView",
    "LoadBalancer",
    "LocalAnswer",
    "MetricsSink",
    "PendingForward",
    "TargetSource",
    "find_failure",
    "is_buffered_response",
    "is_report_due",
    "is_retryable",
    "merge_counts",
    "no_replica_message",
    "render_upstream_headers",
    "split_completed_seconds",
]

log = logging.getLogger(__name__)

# One retry covers the usual failure (one replica just died, the next one is fine) without letting a
# request wander across a fleet: a second failure in a row is more likely the request than the replicas,
# and the passive health check takes a dead replica out of the rotation after a few failures anyway.
MAX_ATTEMPTS: Final = 2
# RFC 9110 9.2.2: sending these twice has the effect of sending them once, so one that may have reached a
# replica may still go to another.
IDEMPOTENT_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# 1 MiB: a typical JSON answer (a few KiB) is read whole and sent with a single write, head and body
# together; a 5 MiB download is streamed so that 1,000 concurrent ones do not hold 5 GiB.
BUFFER_LIMIT: Final = 1024 * 1024
# Chunk for streamed bodies: 256 KiB is 20 writes for a 5 MiB body, and small enough for back-pressure.
STREAM_CHUNK: Final = 256 * 1024
# Counts the sink refused are kept for a retry on the next flush, but not forever: the autoscaler looks at
# the last minutes, and 600 one-second keys are a few KiB.
MAX_UNFLUSHED_SECONDS: Final = 600
# An unchanged load report is repeated this often. The controller ignores a report older than 10 s (it takes
# it for a load balancer that is gone); 2 s leaves room for 4 missed writes (a locked database, a slow pass)
# before a live load balancer looks dead, at one small SQLite write every 2 s per idle service.
REPORT_HEARTBEAT_SECONDS: Final = 2.0
# Source reads while requests are held for a READY replica. A replica of a service woken from zero takes
# seconds to minutes to start; reading every 0.1 s (an indexed SQLite read of well under 1 ms) adds at most
# 0.1 s to the first answer, where the normal 0.5 s refresh would add up to 0.5 s.
HOLD_REFRESH_SECONDS: Final = 0.1
# Defaults for holding requests while no replica is READY. 30 s covers a local replica that starts in
# seconds and stays within common client timeouts (60 s in nginx, browsers, requests' usual settings);
# 256 held requests cost one coroutine and one socket each, and beyond them a burst gets 503 at once.
DEFAULT_MAX_WAITING: Final = 256

# Dropped from requests: the hop-by-hop headers (``http1.HOP_BY_HOP_HEADERS``), Expect (the load balancer
# answered "100 Continue" itself; the replica gets the whole request),
# Content-Length (the upstream client writes the framing), X-Forwarded-Host and -Proto (this hop says them).
_UPSTREAM_DROPPED: Final = HOP_BY_HOP_NAMES | {b"expect", b"content-length", b"x-forwarded-host", b"x-forwarded-proto"}
_UPSTREAM_DROPPED_AUTH: Final = _UPSTREAM_DROPPED | {b"authorization"}
_FORWARDED_PROTO: Final = {scheme: b"X-Forwarded-Proto: %s\r\n" % scheme.encode() for scheme in ("http", "https")}
# Responses that never have a body (RFC 9110 6.4.1); they take the buffered path whatever their headers say.
_BODYLESS_STATUSES: Final = frozenset({204, 304})
_new_outcome: Final = tuple_maker(Outcome)


@dataclass(frozen=True, slots=True)
class LocalAnswer:
    """A response the load balancer makes itself (503 without a replica, 502 after failed attempts, 429 and
    401 from the guard, its identity), with ``headers`` besides the ones every such answer has
    (``Retry-After``, ``WWW-Authenticate``) and its ``content_type``."""

    status: int
    text: str
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "text/plain; charset=utf-8"


class Forwarded:
    """An attempt to ``url`` and, once ``answered``, the replica's response to relay; whoever relays it must
    call ``release`` once done with it, which releases the response, ends the request's time in flight and
    hands its ``Outcome`` to the ``sinks`` (``seconds`` since ``started``, on ``monotonic``'s time). Before
    ``answered``, and after the first, ``release`` does nothing; ``response`` is there once answered."""

    __slots__ = ("_in_flight", "_monotonic", "_sinks", "attempt", "response", "started", "url", "version")

    def __init__(self, url: str, started: float = 0.0, attempt: int = 1,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.started = started
        self.attempt = attempt
        self._monotonic = monotonic
        self._in_flight: InFlight | None = None
        self._sinks: tuple[OutcomeSink, ...] = ()
        self.version: int | None = None

    def answered(self, response: UpstreamResponse, in_flight: InFlight, sinks: tuple[OutcomeSink, ...] = (),
                 version: int | None = None) -> None:
        """The replica answered: ``release`` will end the attempt in ``in_flight`` and tell the ``sinks``."""
        self.response = response
        self._in_flight = in_flight
        self._sinks = sinks
        self.version = version

    def release(self) -> None:
        in_flight = self._in_flight
        if in_flight is None:
            return
        self._in_flight = None
        try:
            self.response.release()
        finally:
            in_flight.end(self.url)
            sinks = self._sinks
            if sinks:
                outcome = _new_outcome((self.version, self.url, self.response.status,
                                        self._monotonic() - self.started, self.attempt, None))
                for sink in sinks:
                    sink.record(outcome)


def is_retryable(error: UpstreamError, method: str, replayable: bool) -> bool:
    """Whether an attempt that failed with ``error`` may be sent again (to another replica).

    Nothing was sent (``UpstreamConnectError``): yes, whatever the method and body. The connection broke
    before the answer (``UpstreamResetError``): the replica may have acted on the request, so only for an
    idempotent method (``IDEMPOTENT_METHODS``) with a body that can be sent again. An invalid answer or a
    timeout: no, the replica answered or is still working.
    """
    if isinstance(error, UpstreamConnectError):
        return True
    if isinstance(error, UpstreamResetError):
        return replayable and method in IDEMPOTENT_METHODS
    return False


def find_failure(error: UpstreamError) -> Failure:
    """The ``Failure`` an attempt that raised ``error`` is recorded with."""
    if isinstance(error, UpstreamConnectError):
        return Failure.CONNECT
    if isinstance(error, UpstreamResetError):
        return Failure.RESET
    if isinstance(error, UpstreamTimeoutError):
        return Failure.TIMEOUT
    return Failure.INVALID


def is_buffered_response(status: int, content_length: int | None, method: str) -> bool:
    """Whether a response is read whole and sent with one write, rather than streamed.

    Yes for a known length up to ``BUFFER_LIMIT``, for statuses that never have a body (204, 304), and for
    any answer to HEAD; a larger or unknown-length body (chunked, or ending with the connection) streams.
    """
    return (
        (content_length is not None and content_length <= BUFFER_LIMIT)
        or status in _BODYLESS_STATUSES
        or method == "HEAD"
    )


class TargetSource(Protocol):
    def read(self) -> LbView | None:
        """The current view, or None when the service no longer exists (the load balancer then stops).

        Called from a worker thread, never concurrently with itself; may block (SQLite). Any exception is
        logged and the previous view stays in force.
        """
        ...


class GuardSource(Protocol):
    def read(self) -> GuardConfig | None:
        """The keys and rate limits of the service's current version; None once the service is gone.

        Called from a worker thread, never concurrently with itself or the other sources; may block.
        ``StateConflictError`` (a key that cannot be read; its message holds no key) is logged once and the
        guard keeps its config; any other exception is logged and the config kept too.
        """
        ...


class MetricsSink(Protocol):
    def record_request_counts(self, counts: Mapping[int, int]) -> None:
        """Take ``{epoch_second: requests}`` for completed seconds; each second is handed over once.

        Called from a worker thread, never concurrently with itself or ``record_load``; may block. On an
        exception the counts are handed over again (merged with newer ones) on the next flush.
        """
        ...

    def record_load(self, report: LbReport) -> None:
        """Take the latest load report; it replaces any earlier one.

        Called from a worker thread, never concurrently with itself or ``record_request_counts``; may
        block. On an exception the next refresh pass hands over a fresh report.
        """
        ...


def render_upstream_headers(
    headers: RawHeaders, peer: str | None, scheme: str, strip_authorization: bool = False
) -> bytes:
    """The header lines (each ending in CRLF) to send to a replica for a request that arrived with
    ``headers``, without ``Host`` and the body's framing, which the upstream client adds.

    Hop-by-hop headers (``HOP_BY_HOP_NAMES`` and every name the ``Connection`` header lists), ``Expect``
    and ``Content-Length`` are dropped. ``Host`` is dropped too, so that the replica sees its own address
    as nginx does by default; the client's Host goes to ``X-Forwarded-Host``. ``X-Forwarded-For`` gets
    ``peer`` appended (an earlier proxy's list is kept); ``X-Forwarded-Host`` and ``X-Forwarded-Proto`` say
    what this hop saw, replacing any value the client sent, because the load balancer is the edge: a client
    must not be able to claim it came in over https. With ``strip_authorization`` (``service.auth`` on)
    ``Authorization`` is dropped: the API key was for the load balancer, and a replica's logs must not
    collect it. Everything else goes as the client sent it, byte for byte and in its order.
    """
    drop = _UPSTREAM_DROPPED_AUTH if strip_authorization else _UPSTREAM_DROPPED
    listed = headers.connection_tokens()
    if listed:
        drop = drop | listed
    lines = []
    host = None
    forwarded_for = []
    for name, value in headers.raw:
        lower = name.lower()
        if lower == b"host":  # whatever Connection lists: X-Forwarded-Host is this hop's to say
            host = value if host is None else host
        elif lower in drop:
            continue
        elif lower == b"x-forwarded-for" and peer is not None:
            forwarded_for.append(value)
        else:
            lines.append(b"%s: %s\r\n" % (name, value))
    if peer is not None:
        forwarded_for.append(peer.encode("ascii", "surrogateescape"))
        lines.append(b"X-Forwarded-For: %s\r\n" % b", ".join(forwarded_for))
    if host is not None:
        lines.append(b"X-Forwarded-Host: %s\r\n" % host)
    proto = _FORWARDED_PROTO.get(scheme)
    lines.append(proto if proto is not None else b"X-Forwarded-Proto: %s\r\n" % scheme.encode())
    return b"".join(lines)


def split_completed_seconds(counts: Mapping[int, int], now_second: int) -> tuple[dict[int, int], dict[int, int]]:
    """``(completed, current)``: seconds before ``now_second`` and the rest.

    At 12:00:05.3 (``now_second`` 12:00:05) the counts of 12:00:04 are final and go to the sink, the
    counts of 12:00:05 are still growing and stay.
    """
    completed = {second: n for second, n in counts.items() if second < now_second}
    current = {second: n for second, n in counts.items() if second >= now_second}
    return completed, current


def merge_counts(into: Mapping[int, int], more: Mapping[int, int], oldest_second: int) -> dict[int, int]:
    """``into`` plus ``more``, summed per second, without seconds before ``oldest_second``."""
    merged = {second: n for second, n in into.items() if second >= oldest_second}
    for second, n in more.items():
        if second >= oldest_second:
            merged[second] = merged.get(second, 0) + n
    return merged


def is_report_due(last: LbReport | None, in_flight: tuple[tuple[str, int], ...], waiting: int, now: float) -> bool:
    """Whether a load balancer that last reported ``last`` reports now.

    Yes when nothing was reported yet, when the load differs from ``last``, or when ``last`` is
    ``REPORT_HEARTBEAT_SECONDS`` old or more (reported at 10.0: due again at 12.0 even if idle throughout).
    A clock that went backwards counts as a change: a report from the future would look fresh too long.
    """
    if last is None or last.in_flight != in_flight or last.waiting != waiting:
        return True
    age = now - last.reported_at
    return age >= REPORT_HEARTBEAT_SECONDS or age < 0


def no_replica_message(service: str) -> str:
    """The 503 body: says what is wrong and which command tells why."""
    return f"No ready replica for service {service}. Run 'sky-lite serve status {service}' to see why.\n"


def _bad_gateway_message(service: str, attempts: int, last_error: str) -> str:
    return (
        f"Bad gateway: {attempts} attempt(s) to reach a ready replica of service {service} failed; "
        f"last error: {last_error}. Run 'sky-lite serve status {service}' to see the replicas.\n"
    )


def _gateway_timeout_message(service: str, last_error: str) -> str:
    return (
        f"Gateway timeout: a replica of service {service} did not answer in time ({last_error}; the limit is "
        f"{UPSTREAM_TIMEOUT_VARIABLE}). Run 'sky-lite serve status {service}' to see the replicas.\n"
    )


class ForwardListener(Protocol):
    """Told the end of a request ``LoadBalancer.forward_now`` sent: one of the three, once."""

    def forwarded(self, forwarded: Forwarded) -> None:
        """The replica's response, to relay and ``release``."""
        ...

    def answer(self, answer: LocalAnswer) -> None:
        """The 502 or 504 to give after failed attempts."""
        ...

    def go_on(self, forwarding: Coroutine[Any, Any, Forwarded | LocalAnswer], abandon: Callable[[], None]) -> None:
        """A retry that has to wait for a connection: await ``forwarding`` (``forward`` going on from the
        next attempt) for the response or answer; if it will never be awaited (the client went first),
        close it and call ``abandon``, which counts that attempt as aborted."""
        ...


class PendingForward(Forwarded):
    """A request ``LoadBalancer.forward_now`` sent, waiting for its response head; the ``ResponseCallbacks``
    of its attempts. ``forward``'s loop in callbacks: the same steps (``_attempt_answered``,
    ``_attempt_failed``, ``_abandon_attempt``) in the same order. Once a response arrives it is itself the
    ``Forwarded`` its listener is told (one object per request, not two); until then ``release`` does
    nothing."""

    __slots__ = ("_body", "_first_started", "_headers", "_lb", "_listener", "_method", "_path", "_pending",
                 "_tried")

    def __init__(self, lb: LoadBalancer, url: str, method: str, path: str, headers: bytes,
                 body: bytes | None, listener: ForwardListener) -> None:
        super().__init__(url, monotonic=lb._monotonic)  # ``sent`` sets the attempt's url and start
        self._lb = lb
        self._method = method
        self._path = path
        self._headers = headers
        self._body = body
        self._listener = listener
        self._pending: PendingResponse | None = None
        self._tried: tuple[str, ...] = ()
        self._first_started = 0.0

    def sent(self, pending: PendingResponse, url: str, started: float) -> None:
        self._pending = pending
        self.url = url
        self.started = started
        if self.attempt == 1:
            self._first_started = started

    def cancel(self) -> None:
        """The client went away: stop waiting, as a cancelled ``forward`` does."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        pending.cancel()
        self._lb._abandon_attempt(self.url, self.started, self.attempt)

    # -- ResponseCallbacks ----------------------------------------------------------------------------------

    def response_arrived(self, response: UpstreamResponse) -> None:
        if self._pending is None:
            response.release()
            return
        self._pending = None
        try:
            self._lb._attempt_answered(self, response)
        except Exception:  # a replica's callback: this request alone fails, as in ``forward`` it would
            response.release()
            self._lb._in_flight.end(self.url)
            self._fail()
            return
        self._listener.forwarded(self)

    def response_failed(self, error: UpstreamError) -> None:
        if self._pending is None:
            return
        self._pending = None
        try:
            self._go_on_after(error)
        except Exception:  # as in ``response_arrived``
            self._fail()

    def _go_on_after(self, error: UpstreamError) -> None:
        lb, url = self._lb, self.url
        self._tried += (url,)
        next_step = lb._attempt_failed(url, error, self.started, self.attempt, self._tried, self._first_started,
                                       self._method, True)
        if isinstance(next_step, LocalAnswer):
            self._listener.answer(next_step)
            return
        self.attempt += 1
        upstream = lb._upstream
        assert upstream is not None, "the load balancer has not started"
        sent = upstream.send_now(next_step, self._method, self._path, self._headers, self._body, self)
        if sent is not None:
            lb._start_attempt(next_step)
            self.sent(sent, next_step, lb._monotonic())
            return
        attempt = self.attempt
        self._listener.go_on(
            lb.forward(next_step, self._method, self._path, self._headers, self._body, attempt=attempt,
                       tried=self._tried, first_started=self._first_started),
            lambda: lb.abandon_unsent(next_step, attempt))

    def _fail(self) -> None:
        log.exception("service %s: a request to %s failed in the load balancer", self._lb.service, self.url)
        self._listener.answer(self._lb.bad_gateway_answer(self.attempt, "an error in the load balancer"))


class LoadBalancer:
    """Proxies requests for one service to its READY replicas.

    The constructor only stores its arguments; nothing runs before ``start``, which creates the upstream
    client (``upstream``, a factory called inside the event loop: ``PooledUpstream`` unless told otherwise),
    reads the source once (so the first request already has targets) and starts the refresh task.
    ``stop_holding`` answers the held requests (503) and makes later ones without a target fail at once; the
    service's end calls it before waiting for the requests in flight. ``close`` stops holding and the task,
    flushes the completed seconds and closes the client. In between, ``select_target`` and ``forward`` are
    the proxy decisions the server (``skyserve_lite.lb.server``) runs per request, and ``no_replica_answer``
    and ``bad_gateway_answer`` the answers it makes itself. One ``LoadBalancer`` runs once at a time.

    ``hold_seconds`` (0 or more; 0 answers 503 at once) and ``max_waiting`` bound how long and how many
    requests wait for a READY replica; the hold is measured on the event loop's monotonic time.
    ``eject_after_failures`` (0: never) and ``eject_seconds`` are the passive health check's
    (``lb.outliers``), on the event loop's time too. ``retries`` and ``ejections`` count since ``start``.
    ``guard`` decides requests before anything else (none: every request goes on); ``guard_source``, read
    on each refresh pass, reconfigures it; ``monotonic`` is the guard's clock (it must never go back), and
    the one the ``outcomes`` sinks' seconds are measured on. ``identity`` (JSON-ready values: the service,
    its controller id, the process) is answered at ``IDENTITY_PATH`` to anyone, before the guard; without
    it that path goes to the replicas like any other.
    """

    def __init__(
        self,
        service: str,
        source: TargetSource,
        sink: MetricsSink | None,
        clock: Clock,
        refresh_seconds: float = LB_REFRESH_SECONDS,
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
        max_waiting: int = DEFAULT_MAX_WAITING,
        upstream: Callable[[], UpstreamClient] = PooledUpstream,
        eject_after_failures: int = DEFAULT_EJECT_AFTER_FAILURES,
        eject_seconds: float = DEFAULT_EJECT_SECONDS,
        guard: Guard | None = None,
        guard_source: GuardSource | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        outcomes: tuple[OutcomeSink, ...] = (),
        identity: Mapping[str, str | int] | None = None,
        split: VersionSplit | None = None,
    ) -> None:
        self.service = service
        self._source = source
        self._sink = sink
        self._clock = clock
        self._refresh_seconds = refresh_seconds
        self._hold_seconds = hold_seconds
        self._max_waiting = max_waiting
        self._policy_name = ROUND_ROBIN
        self._in_flight = InFlight()
        self._policy: Policy = make_policy(ROUND_ROBIN, self._in_flight)
        self._waiting = 0
        self._last_report: LbReport | None = None
        self._urls: tuple[str, ...] = ()
        self._accelerators: tuple[str | None, ...] = ()
        self._rejected_policy: str | None = None
        self._counts: dict[int, int] = {}
        self._make_upstream = upstream
        self._upstream: UpstreamClient | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._source_gone: asyncio.Event | None = None
        # Set to make the refresh loop run a pass now (or notice that it is stopping).
        self._poke: asyncio.Event | None = None
        self._stopping = False
        # Held requests wait on this; set while there are targets, or once holding has stopped.
        self._wake_held: asyncio.Event | None = None
        self._holding = False
        self._no_replica_text = no_replica_message(service)
        self._outliers = OutlierDetector(eject_after_failures, eject_seconds)
        self.retries = 0
        self.ejections = 0
        self._guard = guard
        self._guard_source = guard_source if guard is not None else None
        self._guard_problem: str | None = None
        self._monotonic = monotonic
        self._outcomes = outcomes
        self._split = split if split is not None else VersionSplit()  # a canary's weights between versions
        self._identity = None if identity is None else LocalAnswer(
            200, json.dumps(dict(identity), sort_keys=True) + "\n", ((IDENTITY_HEADER, service),),
            "application/json")
        self._versions: dict[str, int] = {}  # replica url -> its service version, from the view
        self._versions_of: tuple[tuple[str, ...], tuple[int, ...]] = ((), ())  # the view they come from

    async def start(self) -> None:
        """Create the upstream client, read the source once, start the refresh task."""
        self._source_gone = asyncio.Event()
        self._poke = asyncio.Event()
        self._wake_held = asyncio.Event()
        self._stopping = False
        self._holding = True
        self.retries = self.ejections = 0
        self._upstream = self._make_upstream()
        # One pass before the site starts listening, so that the first request already has targets.
        await self._refresh_pass()
        self._refresh_task = asyncio.create_task(self._refresh_loop(), name=f"lb-refresh-{self.service}")

    async def close(self) -> None:
        """Stop holding, stop the refresh task, flush the completed seconds, close the upstream client.

        Idempotent.
        """
        self.stop_holding()
        if self._refresh_task is not None:
            # Ask the loop to stop instead of cancelling it: a cancelled flush cannot tell whether its worker
            # thread wrote the counts, and guessing wrong would lose or double them.
            assert self._poke is not None
            self._stopping = True
            self._poke.set()
            await self._refresh_task
            self._refresh_task = None
        try:
            await self._flush_counts()
        except Exception:  # the last flush; nothing is left to retry it
            log.exception("load balancer for service %s: final flush of request counts failed", self.service)
        if self._upstream is not None:
            await self._upstream.close()
            self._upstream = None

    async def wait_source_gone(self) -> None:
        """Return once the source said the service no longer exists. Only valid after ``start``."""
        assert self._source_gone is not None, "the load balancer has not started"
        await self._source_gone.wait()

    def stop_holding(self) -> None:
        """Answer every held request with 503 now, and later requests without a target at once. Idempotent.

        For the end of the service: without it, stopping would wait for held requests for up to
        ``hold_seconds``.
        """
        self._holding = False
        self._update_wake_held()

    @property
    def waiting(self) -> int:
        """Requests held right now for a READY replica."""
        return self._waiting

    def in_flight(self) -> tuple[tuple[str, int], ...]:
        """Requests in flight per replica url right now, as the load report gives them."""
        return self._in_flight.snapshot()

    @property
    def ejected(self) -> frozenset[str]:
        """Replica urls out of the rotation now for failing (``lb.outliers``)."""
        return self._outliers.ejected

    async def _refresh_loop(self) -> None:
        poke, gone = self._poke, self._source_gone
        assert poke is not None and gone is not None
        while not gone.is_set():
            period = min(self._refresh_seconds, HOLD_REFRESH_SECONDS) if self._waiting else self._refresh_seconds
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(poke.wait(), period)
            poke.clear()
            if self._stopping:
                return
            await self._refresh_pass()

    async def _refresh_pass(self) -> None:
        """Read the source, apply what it says, end cool-downs, flush completed seconds, report the load.
        Never raises."""
        try:
            await self._refresh_targets()
        except Exception:  # top of the loop: keep the previous targets and try again next time
            log.exception("load balancer for service %s: reading the targets failed", self.service)
        for url in self._outliers.release_due(asyncio.get_running_loop().time()):
            log.info("service %s: replica %s ends its cool-down; its next request is a trial", self.service, url)
        await self._refresh_guard()
        try:
            await self._flush_counts()
        except Exception:  # top of the loop: the counts were kept and go with the next flush
            log.exception("load balancer for service %s: recording request counts failed", self.service)
        try:
            await self._report_load()
        except Exception:  # top of the loop: the next pass reports again (the last report is still due)
            log.exception("load balancer for service %s: recording the load report failed", self.service)

    async def _refresh_guard(self) -> None:
        """Read the guard's source and configure the guard; on failure keep its config. Never raises."""
        source, guard = self._guard_source, self._guard
        if source is None or guard is None:
            return
        try:
            config = await asyncio.to_thread(source.read)
        except StateConflictError as exc:  # a key that cannot be read: serve on with the keys the guard has
            problem = str(exc)
            if problem != self._guard_problem:
                log.warning("service %s: keeping the previous API keys and rate limits: %s", self.service, problem)
                self._guard_problem = problem
            return
        except Exception:  # top of the loop: keep the config and read again on the next pass
            log.exception("load balancer for service %s: reading the API keys and rate limits failed", self.service)
            return
        if self._guard_problem is not None:
            log.info("service %s: the API keys and rate limits can be read again", self.service)
            self._guard_problem = None
        if config is not None and config != guard.config:
            guard.configure(config)
            keys = config.keys
            log.info("service %s: %s, %d rate limit(s)", self.service,
                     f"API keys {', '.join(keys.names)}" if keys is not None else "no API keys",
                     len(config.rate_limits))

    async def _refresh_targets(self) -> None:
        view = await asyncio.to_thread(self._source.read)
        if view is None:
            log.info("service %s no longer exists; the load balancer stops", self.service)
            assert self._source_gone is not None
            self._source_gone.set()
            self.stop_holding()
            return
        self._apply_view(view)
        self._update_wake_held()

    def _update_wake_held(self) -> None:
        wake = self._wake_held
        if wake is None:
            return
        if self._urls or not self._holding:
            wake.set()
        else:
            wake.clear()

    def _apply_view(self, view: LbView) -> None:
        if view.policy != self._policy_name:
            try:
                policy = make_policy(view.policy, self._in_flight)
            except ValueError as exc:
                if view.policy != self._rejected_policy:
                    log.warning("service %s: %s; keeping %s", self.service, exc, self._policy_name)
                    self._rejected_policy = view.policy
            else:
                # The in-flight counts belong to the load balancer, not to a policy: a switch to least_load
                # starts from the real load, including requests the previous policy sent.
                policy.set_targets(view.ready_urls, view.accelerators)
                self._in_flight.set_targets(view.ready_urls)
                self._outliers.set_targets(view.ready_urls)
                self._policy, self._policy_name, self._urls = policy, view.policy, view.ready_urls
                self._accelerators = view.accelerators
                self._set_versions(view)
                self._rejected_policy = None
                log.info("service %s: policy %s, targets %s", self.service, view.policy, list(self._urls))
                self._apply_split(view)
                return
        if view.ready_urls != self._urls or view.accelerators != self._accelerators:
            self._policy.set_targets(view.ready_urls, view.accelerators)
            self._in_flight.set_targets(view.ready_urls)
            self._outliers.set_targets(view.ready_urls)
            self._urls, self._accelerators = view.ready_urls, view.accelerators
            log.info("service %s: targets %s", self.service, list(self._urls))
        if (view.ready_urls, view.versions) != self._versions_of:
            self._set_versions(view)
        self._apply_split(view)

    def _apply_split(self, view: LbView) -> None:
        """The view's canary split, with one policy (the one in use) per group of versions (``lb.split``)."""
        name, in_flight = self._policy_name, self._in_flight
        self._split.set_view(view.ready_urls, view.accelerators, view.versions, view.split, name,
                             lambda: make_policy(name, in_flight))

    def _set_versions(self, view: LbView) -> None:
        """Know the version of each url of ``view``; a url that left it keeps its version while requests
        to it are in flight (a retry to a replica taken out of READY mid-request still counts for its
        version), then is forgotten."""
        in_flight = self._in_flight
        versions = {url: v for url, v in self._versions.items() if in_flight.get(url)}
        versions.update(zip(view.ready_urls, view.versions, strict=False))  # empty: versions unknown
        self._versions, self._versions_of = versions, (view.ready_urls, view.versions)

    async def _flush_counts(self) -> None:
        now_second = int(self._clock.now())
        completed, current = split_completed_seconds(self._counts, now_second)
        if not completed:
            return
        self._counts = current
        if self._sink is None:
            return
        try:
            await asyncio.to_thread(self._sink.record_request_counts, completed)
        except Exception:
            # Put them back for the next flush (requests may have added to ``self._counts`` meanwhile).
            self._counts = merge_counts(self._counts, completed, now_second - MAX_UNFLUSHED_SECONDS)
            raise

    async def _report_load(self) -> None:
        if self._sink is None:
            return
        now = self._clock.now()
        in_flight = self._in_flight.snapshot()
        if not is_report_due(self._last_report, in_flight, self._waiting, now):
            return
        report = LbReport(reported_at=now, in_flight=in_flight, waiting=self._waiting)
        await asyncio.to_thread(self._sink.record_load, report)
        self._last_report = report

    def _count_request(self) -> None:
        # Every request counts, including those answered 503: a service scaled to zero replicas must
        # still show demand to the autoscaler, or it would never scale up again.
        second = int(self._clock.now())
        counts = self._counts
        counts[second] = counts.get(second, 0) + 1

    def check_request(self, path: str, client_ip: str | None, headers: Mapping[str, str]) -> LocalAnswer | None:
        """The guard's answer to a request for target ``path`` from ``client_ip`` (the connection's peer, never
        a header) with ``headers`` (case-insensitive): None to go on, else the 429 or 401 to answer, or the
        identity at ``IDENTITY_PATH``. Comes before ``select_target``: a refused request chooses, holds and
        counts nothing."""
        if path == IDENTITY_PATH and self._identity is not None:
            return self._identity
        guard = self._guard
        if guard is None:
            return None
        verdict = guard.decide(path, client_ip, headers, self._monotonic())
        if isinstance(verdict, Allowed):
            return None
        answer = compute_answer(verdict, self.service)
        self._record_local(answer.status, 0.0)
        return LocalAnswer(answer.status, answer.text, answer.headers)

    def _record_local(self, status: int, seconds: float) -> None:
        """Hand the outcome of an answer the load balancer made in place of a replica's to the sinks."""
        sinks = self._outcomes
        if sinks:
            outcome = Outcome(None, None, status, seconds, 0)
            for sink in sinks:
                sink.record(outcome)

    @property
    def strips_authorization(self) -> bool:
        """Whether the client's ``Authorization`` stays here: with ``service.auth`` the keys are the load
        balancer's, and a replica never sees one."""
        guard = self._guard
        return guard is not None and guard.config.keys is not None

    async def select_target(self) -> str | None:
        """Count the request and choose its replica; None means "answer ``no_replica_answer``" (503, which
        this records as the request's outcome).

        The first step of every request. Without a READY replica it holds the request as
        ``_hold`` says. Valid between ``start`` and ``close``.
        """
        url = self.select_now()
        if url is None:
            url = await self.hold_target()
        return url

    def select_now(self) -> str | None:
        """``select_target`` without holding: count the request and choose its replica; None when no READY
        replica is there now, and the request is then to be held with ``hold_target``."""
        second = int(self._clock.now())  # _count_request, inlined: this runs per request
        counts = self._counts
        counts[second] = counts.get(second, 0) + 1
        return self._select()

    async def hold_target(self) -> str | None:
        """Hold a request ``select_now`` found no replica for, as ``select_target`` does; None means answer
        ``no_replica_answer`` (recorded here as the request's outcome)."""
        started = self._monotonic()
        url = await self._hold()
        if url is None:
            self._record_local(503, self._monotonic() - started)
        return url

    def _select(self) -> str | None:
        """The policy's choice among the replicas not ejected; among all of them when every one is. With a
        canary split (``lb.split``), among the drawn version's replicas first."""
        excluded = self._outliers.excluded
        if self._split.active:  # a canary split: the version drawn first, then the policy among its replicas
            url = self._split.select(excluded)
            if url is not None:
                return url
        if not excluded:
            return self._policy.select()
        return self._policy.select(excluded) or self._policy.select()

    async def forward(
        self,
        url: str,
        method: str,
        path: str,
        headers: bytes,
        body: bytes | aiohttp.StreamReader | None,
        upgrade: bool = False,
        *,
        content_length: int | None = None,
        attempt: int = 1,
        tried: tuple[str, ...] = (),
        first_started: float | None = None,
    ) -> Forwarded | LocalAnswer:
        """Send the request to ``url`` (from ``select_target``); retry it once elsewhere when
        ``is_retryable`` allows.

        ``headers`` come from ``render_upstream_headers`` (plus Connection and Upgrade with ``upgrade``);
        a ``bytes`` body or None can be sent again, a stream only once (``content_length`` long, or chunked
        when None). Returns the replica's response (the
        caller relays it and must ``release`` it) or the answer to give after failed attempts: 502, or 504
        after the upstream timeout. Never raises ``UpstreamError``. ``attempt``, ``tried`` and
        ``first_started`` carry on a request whose first attempt ``forward_now`` made.
        """
        upstream = self._upstream
        assert upstream is not None, "the load balancer has not started"
        while True:
            url = self._attempt_target(url, attempt)
            self._start_attempt(url)
            started = self._monotonic()
            if first_started is None:
                first_started = started
            try:
                response = await upstream.request(url, method, path, headers, body, upgrade, content_length)
            except UpstreamError as exc:
                error = exc
            except BaseException:  # cancelled: the client went away; the replica is neither good nor bad
                self._abandon_attempt(url, started, attempt)
                raise
            else:
                return self._attempt_answered(Forwarded(url, started, attempt, self._monotonic), response)
            tried += (url,)
            next_step = self._attempt_failed(url, error, started, attempt, tried, first_started, method,
                                             not isinstance(body, aiohttp.StreamReader))
            if isinstance(next_step, LocalAnswer):
                return next_step
            url = next_step
            attempt += 1

    def forward_now(
        self,
        url: str,
        method: str,
        path: str,
        headers: bytes,
        body: bytes | None,
        listener: ForwardListener,
    ) -> PendingForward | None:
        """``forward`` without a coroutine, for the common case: when the request can be written to ``url``
        at once (an idle pooled connection), send it and return; ``listener`` is then told, from the event
        loop, the ``Forwarded`` response or the ``LocalAnswer`` after failed attempts, exactly as ``forward``
        would return them, or handed the coroutine that goes on when a retry has to wait for a connection.
        None, with nothing sent or counted, when the first attempt cannot go out at once: use ``forward``.
        The returned handle's ``cancel`` is ``forward``'s cancellation (the client went away)."""
        upstream = self._upstream
        assert upstream is not None, "the load balancer has not started"
        outliers = self._outliers
        if outliers.failures:
            url = self._attempt_target(url, 1)
        pending = PendingForward(self, url, method, path, headers, body, listener)
        sent = upstream.send_now(url, method, path, headers, body, pending)
        if sent is None:
            return None
        if outliers.failures:  # _start_attempt, its common case inlined: this runs per request
            outliers.begin_trial(url)
        self._in_flight.start(url)
        pending.sent(sent, url, self._monotonic())
        return pending

    def _attempt_target(self, url: str, attempt: int) -> str:
        """The replica attempt number ``attempt`` goes to: ``url``, or another for a first attempt when
        ``url`` went on probation since it was chosen."""
        outliers = self._outliers
        if attempt == 1 and outliers.failures and url in outliers.excluded:
            # Chosen while it was on probation, and another request began its trial since (this one read
            # its body meanwhile): the trial is that request's alone.
            return self._select() or url
        return url

    def _start_attempt(self, url: str) -> None:
        """Count an attempt to ``url`` in flight, and as its trial when it is on probation."""
        if self._outliers.failures:
            self._outliers.begin_trial(url)
        self._in_flight.start(url)

    def abandon_unsent(self, url: str, attempt: int) -> None:
        """Attempt number ``attempt`` to ``url`` was handed to ``forward``, which never ran (the client went
        first): counted as aborted, as ``forward``'s cancellation would have counted it."""
        if self._outcomes:
            self._record_attempt(url, self._monotonic(), attempt, Failure.ABORTED)

    def _abandon_attempt(self, url: str, started: float, attempt: int) -> None:
        """The client went away during the attempt: the replica is neither good nor bad."""
        self._in_flight.end(url)
        self._outliers.abandon_trial(url)
        if self._outcomes:
            self._record_attempt(url, started, attempt, Failure.ABORTED)

    def _attempt_answered(self, forwarded: Forwarded, response: UpstreamResponse) -> Forwarded:
        """The attempt ``forwarded`` stands for got ``response``."""
        url = forwarded.url
        if self._outliers.failures:
            self._record_success(url)
        if self._outcomes:
            forwarded.answered(response, self._in_flight, self._outcomes, self._versions.get(url))
        else:
            forwarded.answered(response, self._in_flight)
        return forwarded

    def _attempt_failed(
        self, url: str, error: UpstreamError, started: float, attempt: int, tried: tuple[str, ...],
        first_started: float, method: str, replayable: bool,
    ) -> str | LocalAnswer:
        """Record a failed attempt and decide: the replica to retry on, or the answer to give."""
        self._in_flight.end(url)
        self._record_failure(url, error)
        if self._outcomes:
            self._record_attempt(url, started, attempt, find_failure(error))
        retry = None
        if attempt < MAX_ATTEMPTS and is_retryable(error, method, replayable):
            retry = self._select_retry(tried, isinstance(error, UpstreamConnectError))
        if retry is None:
            log.warning("service %s: %s to %s failed: %s", self.service, method, url, error)
            answer = self._failed_answer(attempt, error)
            self._record_local(answer.status, self._monotonic() - first_started)
            return answer
        self.retries += 1
        log.warning(
            "service %s: %s to %s failed before a response (%s); retrying on %s (%d retries since start)",
            self.service, method, url, error, retry, self.retries,
        )
        return retry

    def _record_attempt(self, url: str, started: float, attempt: int, failure: Failure) -> None:
        """Hand the outcome of an attempt to ``url`` that got no response to the sinks."""
        outcome = Outcome(self._versions.get(url), url, None, self._monotonic() - started, attempt, failure)
        for sink in self._outcomes:
            sink.record(outcome)

    def _select_retry(self, tried: tuple[str, ...], refused: bool) -> str | None:
        """The replica for a retry: a READY one not tried and not ejected; else one not tried; else, unless
        the last one could not be reached at all (``refused``), the same one again on a new connection (a
        pooled connection the replica had just closed is the usual reset, and with one replica the only
        other chance)."""
        policy = self._policy
        excluded = self._outliers.excluded
        url = policy.select(excluded.union(tried)) if excluded else policy.select(tried)
        if url is None and excluded:
            url = policy.select(tried)
        if url is None and not refused:
            url = tried[-1]
        return url

    def _record_success(self, url: str) -> None:
        if self._outliers.record_success(url):
            log.info("service %s: replica %s answered its trial request and is back in the rotation",
                     self.service, url)

    def _record_failure(self, url: str, error: UpstreamError) -> None:
        outliers = self._outliers
        if outliers.record_failure(url, asyncio.get_running_loop().time()):
            self.ejections += 1
            log.warning(
                "service %s: replica %s ejected for %g s after %d failed attempt(s) in a row (last: %s)",
                self.service, url, outliers.cooldown_seconds, outliers.failures.get(url, 0), error,
            )

    def _failed_answer(self, attempts: int, error: UpstreamError) -> LocalAnswer:
        if isinstance(error, UpstreamTimeoutError):
            return LocalAnswer(504, _gateway_timeout_message(self.service, str(error)))
        return self.bad_gateway_answer(attempts, str(error))

    def no_replica_answer(self) -> LocalAnswer:
        """The 503 for a request that found no READY replica within the hold."""
        return LocalAnswer(503, self._no_replica_text)

    def bad_gateway_answer(self, attempts: int, last_error: str) -> LocalAnswer:
        """The 502 after ``attempts`` failed attempts, naming the last error."""
        return LocalAnswer(502, _bad_gateway_message(self.service, attempts, last_error))

    def log_body_failure(self, url: str, exc: UpstreamError) -> None:
        """Log a response body from ``url`` that broke off while being relayed."""
        log.warning("service %s: the response body from %s broke off: %s", self.service, url, exc)

    async def _hold(self) -> str | None:
        """Wait until a target is available and select it; None after ``hold_seconds``, when
        ``max_waiting`` requests are held already, or once holding stopped.

        The first request to wait asks the refresh loop for a pass at once; all held requests wake together
        when a pass finds targets.
        """
        wake, poke = self._wake_held, self._poke
        if not self._holding or self._hold_seconds <= 0 or self._waiting >= self._max_waiting:
            return None
        assert wake is not None and poke is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._hold_seconds
        self._waiting += 1
        if self._waiting == 1:
            poke.set()
        try:
            while self._holding:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    await asyncio.wait_for(wake.wait(), remaining)
                except asyncio.TimeoutError:
                    return None
                # Set means targets, unless holding stopped; another pass may have emptied them again since
                # (the event is then clear once more, so this loop waits rather than spins).
                url = self._select()
                if url is not None:
                    return url
            return None
        finally:
            self._waiting -= 1
