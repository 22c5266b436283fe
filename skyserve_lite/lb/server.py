"""The load balancer: one aiohttp server per service that proxies every request to a READY replica.

What it does per request:

1. counts the request under its whole epoch second (from the injected clock) for the autoscaler;
2. asks the policy for a replica; with none it answers 503 naming ``sky-lite serve status``;
3. forwards method, path, query, headers (minus hop-by-hop ones, plus ``X-Forwarded-*``) and body;
4. on a connection failure (cannot connect, or the connection dropped before a response) tries another
   replica, at most ``MAX_ATTEMPTS`` in all; when every attempt fails it answers 502;
5. relays status, headers (minus hop-by-hop ones) and body unchanged: no decompression, no recompression.

Bodies up to ``BUFFER_LIMIT`` with a known length are read whole and sent in one write; larger or chunked
ones are streamed, so memory per request stays bounded whatever the body size.

Everything outside the request path comes in through the constructor: a ``TargetSource`` says which
replicas are READY and which policy to use (an ``LbView``, the store's own type, re-exported here), a
``MetricsSink`` takes the per-second request counts, a
``Clock`` tells the time. A background task (``start`` to ``close``) reads the source every
``refresh_seconds`` and flushes the counts of completed seconds to the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Final, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from skyserve_lite.clock import Clock
from skyserve_lite.lb.policies import ROUND_ROBIN, Policy, make_policy
from skyserve_lite.state.models import LbView

__all__ = [
    "BUFFER_LIMIT",
    "HOP_BY_HOP_HEADERS",
    "MAX_ATTEMPTS",
    "LbView",
    "LoadBalancer",
    "MetricsSink",
    "TargetSource",
    "compute_upstream_headers",
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
# A replica on another machine that silently drops packets would hold a request for the kernel's SYN retry
# time (about 2 minutes); 5 s is far above a healthy connect (< 1 ms locally, < 100 ms across a region).
CONNECT_TIMEOUT_SECONDS: Final = 5.0
# Idle pooled connections are closed after 4 s. Common replica servers close idle keep-alive connections
# after 5 s (uvicorn, gunicorn use 2-5 s); closing ours first avoids sending a request down a connection
# the replica is closing at that very moment. Under load a connection is never idle that long.
POOL_KEEPALIVE_SECONDS: Final = 4.0
# Counts the sink refused are kept for a retry on the next flush, but not forever: the autoscaler looks at
# the last minutes, and 600 one-second keys are a few KiB.
MAX_UNFLUSHED_SECONDS: Final = 600

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
# aiohttp's client adds these when absent; a proxy must not: an added "Accept-Encoding: gzip" would make the
# replica compress a body for a client that never asked for it (and nothing here decompresses).
_NO_AUTO_HEADERS: Final = CIMultiDict(
    (istr(name), None) for name in ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
)
# Responses that never have a body (RFC 9110 6.4.1); they take the buffered path whatever their headers say.
_BODYLESS_STATUSES: Final = frozenset({204, 304})

# Connection failures after which nothing reached the replica: always safe to try the next one.
# ServerTimeoutError can only be a connect timeout here: the session sets no read or total timeout.
_CONNECT_ERRORS: Final = (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError)
# The connection broke before a response: the replica may have seen a part of the request.
_RESET_ERRORS: Final = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class _ProxyClientRequest(aiohttp.ClientRequest):
    """A client request that adds none of aiohttp's default headers.

    Same effect as ``skip_auto_headers=_NO_AUTO_HEADERS`` on the session, which rebuilds that set and copies
    the headers on every request: 12 us against 5 us per request here, about 3% of the proxy's CPU.
    """

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        # aiohttp reads the set again later, to skip the default Content-Type of a body: up to 3.11 as the
        # attribute ``skip_auto_headers``, since then as ``_skip_auto_headers`` behind a read-only property of
        # the old name (where the instance-dict entry below is simply never looked at).
        self._skip_auto_headers = _NO_AUTO_HEADERS
        vars(self)["skip_auto_headers"] = _NO_AUTO_HEADERS


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

        Called from a worker thread, never concurrently with itself; may block. On an exception the
        counts are handed over again (merged with newer ones) on the next flush.
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


def no_replica_message(service: str) -> str:
    """The 503 body: says what is wrong and which command tells why."""
    return f"No ready replica for service {service}. Run 'sky-lite serve status {service}' to see why.\n"


def _bad_gateway_message(service: str, attempts: int, last_error: str) -> str:
    return (
        f"Bad gateway: {attempts} attempt(s) to reach a ready replica of service {service} failed; "
        f"last error: {last_error}. Run 'sky-lite serve status {service}' to see the replicas.\n"
    )


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class LoadBalancer:
    """Proxies requests for one service to its READY replicas.

    The constructor only stores its arguments; nothing runs before ``start``, which creates the HTTP client
    session, reads the source once (so the first request already has targets) and starts the refresh task.
    ``close`` stops the task, flushes the completed seconds and closes the session. ``handle`` is the request
    handler in between. ``serve`` runs all three on aiohttp's low-level server; ``make_app`` wraps them in an
    ``aiohttp.web.Application`` for embedding and tests. One ``LoadBalancer`` runs once at a time.
    """

    def __init__(
        self,
        service: str,
        source: TargetSource,
        sink: MetricsSink | None,
        clock: Clock,
        refresh_seconds: float = 0.5,
    ) -> None:
        self.service = service
        self._source = source
        self._sink = sink
        self._clock = clock
        self._refresh_seconds = refresh_seconds
        self._policy_name = ROUND_ROBIN
        self._policy: Policy = make_policy(ROUND_ROBIN)
        self._urls: tuple[str, ...] = ()
        self._rejected_policy: str | None = None
        self._counts: dict[int, int] = {}
        self._session: aiohttp.ClientSession | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._source_gone: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None
        self._no_replica_text = no_replica_message(service)

    def make_app(self) -> web.Application:
        """The aiohttp application: one catch-all route for every method and path.

        Its startup runs ``start`` and its cleanup runs ``close``. ``serve`` does not use it: it runs
        ``handle`` on aiohttp's low-level server, which skips the router (about 5% of the CPU per request).
        """
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(lambda app: self.start())
        app.on_cleanup.append(lambda app: self.close())
        return app

    async def start(self) -> None:
        """Create the client session, read the source once, start the refresh task."""
        self._source_gone = asyncio.Event()
        self._stopping = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=POOL_KEEPALIVE_SECONDS)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            request_class=_ProxyClientRequest,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS),
        )
        # One pass before the site starts listening, so that the first request already has targets.
        await self._refresh_pass()
        self._refresh_task = asyncio.create_task(self._refresh_loop(), name=f"lb-refresh-{self.service}")

    async def close(self) -> None:
        """Stop the refresh task, flush the completed seconds, close the client session. Idempotent."""
        if self._refresh_task is not None:
            # Ask the loop to stop instead of cancelling it: a cancelled flush cannot tell whether its worker
            # thread wrote the counts, and guessing wrong would lose or double them.
            assert self._stopping is not None
            self._stopping.set()
            await self._refresh_task
            self._refresh_task = None
        try:
            await self._flush_counts()
        except Exception:  # the last flush; nothing is left to retry it
            log.exception("load balancer for service %s: final flush of request counts failed", self.service)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def wait_source_gone(self) -> None:
        """Return once the source said the service no longer exists. Only valid after ``start``."""
        assert self._source_gone is not None, "the load balancer has not started"
        await self._source_gone.wait()

    async def _refresh_loop(self) -> None:
        stopping, gone = self._stopping, self._source_gone
        assert stopping is not None and gone is not None
        while not gone.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._refresh_seconds)
            if stopping.is_set():
                return
            await self._refresh_pass()

    async def _refresh_pass(self) -> None:
        """Read the source, apply what it says, flush completed seconds. Never raises."""
        try:
            await self._refresh_targets()
        except Exception:  # top of the loop: keep the previous targets and try again next time
            log.exception("load balancer for service %s: reading the targets failed", self.service)
        try:
            await self._flush_counts()
        except Exception:  # top of the loop: the counts were kept and go with the next flush
            log.exception("load balancer for service %s: recording request counts failed", self.service)

    async def _refresh_targets(self) -> None:
        view = await asyncio.to_thread(self._source.read)
        if view is None:
            log.info("service %s no longer exists; the load balancer stops", self.service)
            assert self._source_gone is not None
            self._source_gone.set()
            return
        self._apply_view(view)

    def _apply_view(self, view: LbView) -> None:
        if view.policy != self._policy_name:
            try:
                policy = make_policy(view.policy)
            except ValueError as exc:
                if view.policy != self._rejected_policy:
                    log.warning("service %s: %s; keeping %s", self.service, exc, self._policy_name)
                    self._rejected_policy = view.policy
            else:
                # Requests in flight keep the policy they started with and report their end to it, so the
                # new policy's in-flight counts start from 0.
                policy.set_targets(view.ready_urls)
                self._policy, self._policy_name, self._urls = policy, view.policy, view.ready_urls
                self._rejected_policy = None
                log.info("service %s: policy %s, targets %s", self.service, view.policy, list(self._urls))
                return
        if view.ready_urls != self._urls:
            self._policy.set_targets(view.ready_urls)
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

    def _count_request(self) -> None:
        # Every request counts, including those answered 503: a service scaled to zero replicas must
        # still show demand to the autoscaler, or it would never scale up again.
        second = int(self._clock.now())
        counts = self._counts
        counts[second] = counts.get(second, 0) + 1

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Proxy one request; the aiohttp handler for every method and path. Valid between start and close."""
        self._count_request()
        policy = self._policy
        url = policy.select()
        if url is None:
            return web.Response(status=503, text=self._no_replica_text)
        session = self._session
        assert session is not None

        body = await _read_body(request)
        # A buffered (or absent) body can be sent again; a streamed one is consumed by the first attempt.
        replayable = not isinstance(body, aiohttp.StreamReader)
        headers = compute_upstream_headers(request.headers, request.remote, request.scheme)
        path = request.raw_path
        if not path.startswith("/"):  # absolute-form target ("GET http://host/x HTTP/1.1")
            path = request.rel_url.raw_path_qs
        method = request.method

        # Tuples: the common case (the first attempt works) allocates nothing for them.
        tried: tuple[str, ...] = ()
        refused: tuple[str, ...] = ()
        last_error = ""
        attempt = 0
        while url is not None:
            attempt += 1
            policy.on_start(url)
            try:
                try:
                    upstream = await session.request(
                        method,
                        URL(url.rstrip("/") + path, encoded=True),
                        headers=headers,
                        data=body,
                        allow_redirects=False,
                    )
                except _CONNECT_ERRORS as exc:
                    refused += (url,)
                    last_error = _describe(exc)
                    log.warning("service %s: cannot connect to %s: %s", self.service, url, last_error)
                except _RESET_ERRORS as exc:
                    last_error = _describe(exc)
                    log.warning("service %s: connection to %s failed: %s", self.service, url, last_error)
                    if not replayable:
                        break
                except aiohttp.ClientError as exc:  # e.g. an invalid HTTP response: no retry
                    last_error = _describe(exc)
                    log.warning("service %s: bad response from %s: %s", self.service, url, last_error)
                    break
                else:
                    return await self._relay(request, upstream, url)
            finally:
                policy.on_end(url)
            tried += (url,)
            url = _select_retry(policy, tried, refused) if attempt < MAX_ATTEMPTS else None
        return web.Response(status=502, text=_bad_gateway_message(self.service, attempt, last_error))

    async def _relay(self, request: web.BaseRequest, upstream: aiohttp.ClientResponse, url: str) -> web.StreamResponse:
        """Send ``upstream`` to the client; always releases ``upstream``."""
        try:
            length = upstream.content_length
            if (
                (length is not None and length <= BUFFER_LIMIT)
                or upstream.status in _BODYLESS_STATUSES
                or request.method == "HEAD"
            ):
                try:
                    data = await upstream.read()
                except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                    last_error = _describe(exc)
                    log.warning("service %s: reading the response of %s failed: %s", self.service, url, last_error)
                    return web.Response(status=502, text=_bad_gateway_message(self.service, 1, last_error))
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

    async def _stream(self, request: web.BaseRequest, upstream: aiohttp.ClientResponse, url: str) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=upstream.headers)
        strip_hop_by_hop(response.headers)
        try:
            await response.prepare(request)
        except ConnectionError:  # the client went away; aiohttp closes the connection
            return response
        content = upstream.content
        while True:
            try:
                chunk = await content.read(STREAM_CHUNK)
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                # The status line is out: the only honest signal left is to cut the client's connection, so
                # that it sees a truncated body rather than a complete-looking short one.
                log.warning("service %s: the response body from %s broke off: %s", self.service, url, _describe(exc))
                if request.transport is not None:
                    request.transport.abort()
                return response
            if not chunk:
                return response
            try:
                await response.write(chunk)
            except ConnectionError:  # the client went away
                return response


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


async def serve(lb: LoadBalancer, host: str, port: int, stop: asyncio.Event) -> None:
    """Run ``lb`` on ``host:port`` until ``stop`` is set or its source says the service is gone.

    Raises OSError when the port cannot be bound. On return the listening socket is closed, the counts of
    completed seconds are flushed and the client session is closed.
    """
    runner = web.ServerRunner(web.Server(lb.handle, access_log=None), handle_signals=False)
    await runner.setup()
    await lb.start()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = ", ".join(f"{address[0]}:{address[1]}" for address in runner.addresses)
        log.info("load balancer for service %s listening on %s", lb.service, bound)
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(lb.wait_source_gone())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
    finally:
        # Stop accepting and finish the requests in flight first, then close the client session they use.
        await runner.cleanup()
        await lb.close()
