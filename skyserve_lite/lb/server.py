"""The load balancer: one HTTP server per service that proxies every request to a READY replica.

Two client-facing servers run the same proxy decisions (``LoadBalancer.select_target`` and ``forward``):
the lean one (``lean_server``, an asyncio protocol on aiohttp's C request parser, the default of ``serve``)
and aiohttp's low-level ``web.Server`` (``LoadBalancer.handle``, also behind ``make_app``).

What it does per request:

1. counts the request under its whole epoch second (from the injected clock) for the autoscaler;
2. asks the policy for a replica; with none (a service scaled to zero, or one just starting) it holds the
   request until a replica is READY, up to ``hold_seconds`` and at most ``max_waiting`` requests at once,
   then answers 503 naming ``sky-lite serve status``;
3. forwards method, path, query, headers (minus hop-by-hop ones, plus ``X-Forwarded-*``) and body;
4. on a connection failure (cannot connect, or the connection dropped before a response) tries another
   replica, at most ``MAX_ATTEMPTS`` in all; when every attempt fails it answers 502;
5. relays status, headers (minus hop-by-hop ones) and body unchanged: no decompression, no recompression.

Bodies up to ``BUFFER_LIMIT`` with a known length are read whole and sent in one write; larger or chunked
ones are streamed, so memory per request stays bounded whatever the body size. Replicas are reached through
an ``UpstreamClient`` (``skyserve_lite.lb.upstream``), by default the pooled one.

Everything outside the request path comes in through the constructor: a ``TargetSource`` says which
replicas are READY and which policy to use (an ``LbView``, the store's own type, re-exported here), a
``MetricsSink`` takes the per-second request counts and the load reports, a ``Clock`` tells the time. A
background task (``start`` to ``close``) reads the source every ``refresh_seconds``, flushes the counts of
completed seconds to the sink and hands it a load report (requests in flight per replica, requests held)
when the load changed, or every ``REPORT_HEARTBEAT_SECONDS`` when it did not. While requests are held it
reads the source at once and then every ``HOLD_REFRESH_SECONDS``, so that a replica turning READY is used
within about 0.1 s instead of one ``refresh_seconds`` later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final, Literal, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, istr

from skyserve_lite.clock import Clock
from skyserve_lite.lb.policies import ROUND_ROBIN, InFlight, Policy, make_policy
from skyserve_lite.lb.pooled_upstream import PooledUpstream
from skyserve_lite.lb.settings import DEFAULT_HOLD_SECONDS
from skyserve_lite.lb.upstream import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResetError,
    UpstreamResponse,
)
from skyserve_lite.state.models import LbReport, LbView

__all__ = [
    "BUFFER_LIMIT",
    "DEFAULT_HOLD_SECONDS",
    "DEFAULT_MAX_WAITING",
    "HOLD_REFRESH_SECONDS",
    "HOP_BY_HOP_HEADERS",
    "MAX_ATTEMPTS",
    "REPORT_HEARTBEAT_SECONDS",
    "Forwarded",
    "LbReport",
    "LbView",
    "LoadBalancer",
    "LocalAnswer",
    "MetricsSink",
    "ServerKind",
    "TargetSource",
    "compute_upstream_headers",
    "is_buffered_response",
    "is_report_due",
    "no_replica_message",
    "serve",
    "split_completed_seconds",
    "strip_hop_by_hop",
]

log = logging.getLogger(__name__)

# Three tries cover the usual failure (one replica just died, the next one is fine) without letting a
# request wander across a whole fleet: with 10 replicas of which 9 are dead, a client gets a 502 after 3
# fast connection refusals instead of after 9.
MAX_ATTEMPTS: Final = 3
# 1 MiB: a typical JSON answer (a few KiB) is read whole and sent with a single write, the cheapest path
# aiohttp has; a 5 MiB download is streamed so that 1,000 concurrent ones do not hold 5 GiB.
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

# RFC 9110 section 7.6.1, plus Proxy-Connection, which old clients still send and which means the same.
HOP_BY_HOP_HEADERS: Final = (
    istr("Connection"),
    istr("Keep-Alive"),
    istr("Proxy-Authenticate"),
    istr("Proxy-Authorization"),
    istr("Proxy-Connection"),
    istr("TE"),
    istr("Trailers"),
    istr("Transfer-Encoding"),
    istr("Upgrade"),
)
_CONNECTION = istr("Connection")
_HOST = istr("Host")
# The load balancer already answered "100 Continue" to the client; the replica gets the whole request.
_EXPECT = istr("Expect")
_X_FORWARDED_FOR = istr("X-Forwarded-For")
_X_FORWARDED_HOST = istr("X-Forwarded-Host")
_X_FORWARDED_PROTO = istr("X-Forwarded-Proto")
# Responses that never have a body (RFC 9110 6.4.1); they take the buffered path whatever their headers say.
_BODYLESS_STATUSES: Final = frozenset({204, 304})


@dataclass(frozen=True, slots=True)
class LocalAnswer:
    """A response the load balancer makes itself (503 without a replica, 502 after failed attempts)."""

    status: int
    text: str


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A replica's response to relay; whoever relays it must call ``response.release()`` once."""

    response: UpstreamResponse
    url: str


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


def strip_hop_by_hop(headers: CIMultiDict[str]) -> None:
    """Remove, in place, the hop-by-hop headers and every header named in ``Connection``."""
    if _CONNECTION in headers:
        for value in headers.getall(_CONNECTION):
            for token in value.split(","):
                name = token.strip()
                if name:
                    headers.popall(name, None)
    for name in HOP_BY_HOP_HEADERS:
        if name in headers:
            del headers[name]


def compute_upstream_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], peer: str | None, scheme: str
) -> CIMultiDict[str]:
    """The headers to send to a replica for a request that arrived with ``headers``.

    Hop-by-hop headers and ``Expect`` are dropped. ``Host`` is dropped too, so that the replica sees its
    own address as nginx does by default; the client's Host goes to ``X-Forwarded-Host``.
    ``X-Forwarded-For`` gets ``peer`` appended (an earlier proxy's list is kept); ``X-Forwarded-Host`` and
    ``X-Forwarded-Proto`` say what this hop saw, replacing any value the client sent, because the load
    balancer is the edge: a client must not be able to claim it came in over https.
    """
    out = CIMultiDict(headers)
    strip_hop_by_hop(out)
    host = out.pop(_HOST, None)
    if _EXPECT in out:
        del out[_EXPECT]
    if peer is not None:
        if _X_FORWARDED_FOR in out:
            prior = ", ".join(out.popall(_X_FORWARDED_FOR))
            out[_X_FORWARDED_FOR] = f"{prior}, {peer}"
        else:
            out[_X_FORWARDED_FOR] = peer
    if host is not None:
        out[_X_FORWARDED_HOST] = host
    out[_X_FORWARDED_PROTO] = scheme
    return out


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


class LoadBalancer:
    """Proxies requests for one service to its READY replicas.

    The constructor only stores its arguments; nothing runs before ``start``, which creates the upstream
    client (``upstream``, a factory called inside the event loop: ``PooledUpstream`` unless told otherwise),
    reads the source once (so the first request already has targets) and starts the refresh task.
    ``stop_holding`` answers the held requests (503) and makes later ones without a target fail at once; the
    service's end calls it before waiting for the requests in flight. ``close`` stops holding and the task,
    flushes the completed seconds and closes the client. In between, ``select_target`` and ``forward`` are
    the proxy decisions every server runs per request, and ``handle`` is aiohttp's request handler built on
    them. ``serve`` runs all of them on the lean server or on aiohttp's low-level server; ``make_app`` wraps
    them in an ``aiohttp.web.Application`` for embedding and tests. One ``LoadBalancer`` runs once at a time.

    ``hold_seconds`` (0 or more; 0 answers 503 at once) and ``max_waiting`` bound how long and how many
    requests wait for a READY replica; the hold is measured on the event loop's monotonic time.
    """

    def __init__(
        self,
        service: str,
        source: TargetSource,
        sink: MetricsSink | None,
        clock: Clock,
        refresh_seconds: float = 0.5,
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
        max_waiting: int = DEFAULT_MAX_WAITING,
        upstream: Callable[[], UpstreamClient] = PooledUpstream,
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

    def make_app(self) -> web.Application:
        """The aiohttp application: one catch-all route for every method and path.

        Its startup runs ``start`` and its cleanup runs ``close``. ``serve`` does not use it: it runs
        ``handle`` on aiohttp's low-level server, which skips the router (about 5% of the CPU per request).
        """
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(lambda app: self.start())
        app.on_shutdown.append(lambda app: self._stop_holding_async())
        app.on_cleanup.append(lambda app: self.close())
        return app

    async def start(self) -> None:
        """Create the upstream client, read the source once, start the refresh task."""
        self._source_gone = asyncio.Event()
        self._poke = asyncio.Event()
        self._wake_held = asyncio.Event()
        self._stopping = False
        self._holding = True
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

    async def _stop_holding_async(self) -> None:
        self.stop_holding()

    @property
    def waiting(self) -> int:
        """Requests held right now for a READY replica."""
        return self._waiting

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
        """Read the source, apply what it says, flush completed seconds, report the load. Never raises."""
        try:
            await self._refresh_targets()
        except Exception:  # top of the loop: keep the previous targets and try again next time
            log.exception("load balancer for service %s: reading the targets failed", self.service)
        try:
            await self._flush_counts()
        except Exception:  # top of the loop: the counts were kept and go with the next flush
            log.exception("load balancer for service %s: recording request counts failed", self.service)
        try:
            await self._report_load()
        except Exception:  # top of the loop: the next pass reports again (the last report is still due)
            log.exception("load balancer for service %s: recording the load report failed", self.service)

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
                policy.set_targets(view.ready_urls)
                self._in_flight.set_targets(view.ready_urls)
                self._policy, self._policy_name, self._urls = policy, view.policy, view.ready_urls
                self._rejected_policy = None
                log.info("service %s: policy %s, targets %s", self.service, view.policy, list(self._urls))
                return
        if view.ready_urls != self._urls:
            self._policy.set_targets(view.ready_urls)
            self._in_flight.set_targets(view.ready_urls)
            self._urls = view.ready_urls
            log.info("service %s: targets %s", self.service, list(self._urls))

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
            # Put them back for the next flush (the handler may have added to ``self._counts`` meanwhile).
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

    async def select_target(self) -> str | None:
        """Count the request and choose its replica; None means "answer ``no_replica_answer``" (503).

        The first step of every request, on either server. Without a READY replica it holds the request as
        ``_hold`` says. Valid between ``start`` and ``close``.
        """
        self._count_request()
        url = self._policy.select()
        if url is None:
            url = await self._hold()
        return url

    async def forward(
        self, url: str, method: str, path: str, headers: CIMultiDict[str], body: bytes | aiohttp.StreamReader | None
    ) -> Forwarded | LocalAnswer:
        """Send the request to ``url`` (from ``select_target``), trying other replicas on connection failures.

        ``headers`` come from ``compute_upstream_headers``; a ``bytes`` body or None can be sent again, a
        stream only once. Returns the replica's response (the caller relays it and must ``release`` it) or
        the 502 to answer after ``MAX_ATTEMPTS`` failed attempts or an invalid response. Never raises
        ``UpstreamError``. Shared by both servers, so that retries mean the same on each.
        """
        upstream = self._upstream
        assert upstream is not None, "the load balancer has not started"
        policy = self._policy
        in_flight = self._in_flight
        replayable = not isinstance(body, aiohttp.StreamReader)
        # Tuples: the common case (the first attempt works) allocates nothing for them.
        tried: tuple[str, ...] = ()
        refused: tuple[str, ...] = ()
        last_error = ""
        attempt = 0
        next_url: str | None = url
        while next_url is not None:
            attempt += 1
            url = next_url
            in_flight.start(url)
            try:
                try:
                    response = await upstream.request(url, method, path, headers, body)
                except UpstreamConnectError as exc:
                    refused += (url,)
                    last_error = str(exc)
                    log.warning("service %s: cannot connect to %s: %s", self.service, url, last_error)
                except UpstreamResetError as exc:
                    last_error = str(exc)
                    log.warning("service %s: connection to %s failed: %s", self.service, url, last_error)
                    if not replayable:
                        break
                except UpstreamError as exc:  # e.g. an invalid HTTP response: no retry
                    last_error = str(exc)
                    log.warning("service %s: bad response from %s: %s", self.service, url, last_error)
                    break
                else:
                    return Forwarded(response, url)
            finally:
                in_flight.end(url)
            tried += (url,)
            next_url = _select_retry(policy, tried, refused) if attempt < MAX_ATTEMPTS else None
        return self.bad_gateway_answer(attempt, last_error)

    def no_replica_answer(self) -> LocalAnswer:
        """The 503 for a request that found no READY replica within the hold."""
        return LocalAnswer(503, self._no_replica_text)

    def bad_gateway_answer(self, attempts: int, last_error: str) -> LocalAnswer:
        """The 502 after ``attempts`` failed attempts, naming the last error."""
        return LocalAnswer(502, _bad_gateway_message(self.service, attempts, last_error))

    def log_body_failure(self, url: str, exc: UpstreamError) -> None:
        """Log a response body from ``url`` that broke off while being relayed."""
        log.warning("service %s: the response body from %s broke off: %s", self.service, url, exc)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Proxy one request; the aiohttp handler for every method and path. Valid between start and close."""
        url = await self.select_target()
        if url is None:
            return _local_response(self.no_replica_answer())
        body = await _read_body(request)
        headers = compute_upstream_headers(request.headers, request.remote, request.scheme)
        path = request.raw_path
        if not path.startswith("/"):  # absolute-form target ("GET http://host/x HTTP/1.1")
            path = request.rel_url.raw_path_qs
        result = await self.forward(url, request.method, path, headers, body)
        if isinstance(result, LocalAnswer):
            return _local_response(result)
        return await self._relay(request, result.response, result.url)

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
                url = self._policy.select()
                if url is not None:
                    return url
            return None
        finally:
            self._waiting -= 1

    async def _relay(self, request: web.BaseRequest, upstream: UpstreamResponse, url: str) -> web.StreamResponse:
        """Send ``upstream`` to the client; always releases ``upstream``."""
        try:
            length = upstream.content_length
            if is_buffered_response(upstream.status, length, request.method):
                try:
                    data = await upstream.read()
                except UpstreamError as exc:
                    last_error = str(exc)
                    log.warning("service %s: reading the response of %s failed: %s", self.service, url, last_error)
                    return _local_response(self.bad_gateway_answer(1, last_error))
                response = web.Response(
                    body=data, status=upstream.status, reason=upstream.reason, headers=upstream.headers
                )
                # Content-Length stays as the replica sent it: ``data`` is exactly that many bytes (a HEAD
                # answer keeps the length of the body it did not send).
                strip_hop_by_hop(response.headers)
                return response
            return await self._stream(request, upstream, url)
        finally:
            upstream.release()

    async def _stream(self, request: web.BaseRequest, upstream: UpstreamResponse, url: str) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=upstream.headers)
        strip_hop_by_hop(response.headers)
        try:
            await response.prepare(request)
        except ConnectionError:  # the client went away; aiohttp closes the connection
            return response
        while True:
            try:
                chunk = await upstream.read_chunk(STREAM_CHUNK)
            except UpstreamError as exc:
                # The status line is out: the only honest signal left is to cut the client's connection, so
                # that it sees a truncated body rather than a complete-looking short one.
                self.log_body_failure(url, exc)
                if request.transport is not None:
                    request.transport.abort()
                return response
            if not chunk:
                return response
            try:
                await response.write(chunk)
            except ConnectionError:  # the client went away
                return response


def _local_response(answer: LocalAnswer) -> web.Response:
    return web.Response(status=answer.status, text=answer.text)


async def _read_body(request: web.BaseRequest) -> bytes | aiohttp.StreamReader | None:
    """None without a body, the whole body when it is small and of known length, else the stream."""
    if not request.body_exists:
        return None
    length = request.content_length
    if length is not None and length <= BUFFER_LIMIT:
        return await request.content.read()
    return request.content


def _select_retry(policy: Policy, tried: Collection[str], refused: Collection[str]) -> str | None:
    """The replica for the next attempt: one not tried yet; else one that did accept a connection.

    With one replica whose pooled connection was reset, a second try on a fresh connection can work; with
    one replica that refused the connection, a second try only delays the 502.
    """
    url = policy.select(tried)
    if url is None:
        url = policy.select(refused)
    return url


ServerKind = Literal["lean", "aiohttp"]


async def serve(lb: LoadBalancer, host: str, port: int, stop: asyncio.Event, server: ServerKind = "lean") -> None:
    """Run ``lb`` on ``host:port`` until ``stop`` is set or its source says the service is gone.

    ``server`` picks the HTTP server facing the clients: ``"lean"`` (``skyserve_lite.lb.lean_server``, an
    asyncio protocol on aiohttp's C request parser) or ``"aiohttp"`` (aiohttp's low-level ``web.Server``).
    Both run the same proxy decisions (``select_target``, ``forward``). Raises OSError when the port cannot
    be bound. On return the listening socket is closed, the requests in flight are answered, the counts of
    completed seconds are flushed and the upstream client is closed.
    """
    if server == "lean":
        from skyserve_lite.lb.lean_server import serve_lean  # the lean server imports this module

        await serve_lean(lb, host, port, stop)
        return
    runner = web.ServerRunner(web.Server(lb.handle, access_log=None), handle_signals=False)
    await runner.setup()
    await lb.start()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = ", ".join(f"{address[0]}:{address[1]}" for address in runner.addresses)
        log.info("load balancer for service %s listening on %s", lb.service, bound)
        await wait_until_stopped(lb, stop)
    finally:
        # Stop accepting, answer the held requests and finish the ones in flight first, then close the
        # upstream client they use.
        lb.stop_holding()
        await runner.cleanup()
        await lb.close()


async def wait_until_stopped(lb: LoadBalancer, stop: asyncio.Event) -> None:
    """Return when ``stop`` is set or the service is gone from the store, whichever comes first."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(lb.wait_source_gone())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
