"""The client-facing server: HTTP/1.1 on a plain asyncio protocol, framed by aiohttp's request parser.

``serve`` runs a ``LoadBalancer`` (``skyserve_lite.lb.proxy``) on it. The server does per request only what
the HTTP side needs (no request or response objects) and leaves every proxy decision to the load balancer:
``select_target``, ``forward``, and the answers it makes itself (503, 502).

Connections are accepted by a ``Listener`` (``skyserve_lite.lb.listener``): at most ``max_connections`` at
once, and a connection beyond that gets 503 with ``Connection: close`` at once; at the open-file limit
accepting pauses instead of failing in a loop, and open connections go on being served.

Per connection:

* keep-alive, HTTP/1.0 and 1.1; pipelined requests are answered one at a time, in order. At most
  ``MAX_PIPELINED`` parsed requests wait; beyond that reading from the client pauses.
* request bodies: up to ``BUFFER_LIMIT`` with a Content-Length they are read whole (one write to the
  replica); larger or chunked ones go to the replica as a stream, reading from the client paused whenever
  ``READ_LIMIT`` is buffered.
* ``Expect: 100-continue`` is answered "100 Continue" once a replica was chosen, right before the body is
  read (a 503 goes out instead, and the connection closes); any other expectation gets 417 and a close.
* a request the parser rejects gets 400 and a close, after the requests parsed before it are answered
  (requests that came in the same socket read as the malformed bytes are lost with them: the parser
  raises for the whole read, as on aiohttp's server). So does an HTTP/1.0 request with Transfer-Encoding,
  which the parsers accept and RFC 9112 calls faulty framing (``_has_faulty_framing``).
* responses: the head and a buffered body go out in one ``transport.write``; a streamed body is written
  chunk by chunk, waiting while the socket's write buffer is above ``WRITE_HIGH_WATER`` (the replica's
  side then pauses too: its reader stops taking bytes). A body of unknown length goes out chunked to
  HTTP/1.1 clients and ends with the connection for HTTP/1.0 ones.
* a connection whose request body was not read to its end (a 503 before reading, a replica that answered
  early) is closed after the response: the rest of the body cannot be told from a next request.
* idle connections are closed after ``KEEPALIVE_SECONDS``.

The server adds no headers of its own to relayed responses (no Server, no Date: the replica's are kept),
except ``Connection: close`` or ``keep-alive`` where the connection's fate needs saying.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import ssl
from collections.abc import Callable
from typing import Final

import aiohttp
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError
from aiohttp.http_parser import HttpRequestParser, RawRequestMessage
from aiohttp.streams import EmptyStreamReader
from multidict import CIMultiDictProxy, istr

from skyserve_lite.lb.listener import Listener
from skyserve_lite.lb.proxy import (
    BUFFER_LIMIT,
    HOP_BY_HOP_HEADERS,
    STREAM_CHUNK,
    LoadBalancer,
    LocalAnswer,
    compute_upstream_headers,
    is_buffered_response,
)
from skyserve_lite.lb.settings import DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS_VARIABLE
from skyserve_lite.lb.upstream import UpstreamError, UpstreamResponse

__all__ = [
    "KEEPALIVE_SECONDS",
    "MAX_PIPELINED",
    "READ_LIMIT",
    "SHUTDOWN_SECONDS",
    "WRITE_HIGH_WATER",
    "HttpServer",
    "render_local_answer",
    "render_response_head",
    "serve",
    "too_many_connections_message",
]

log = logging.getLogger(__name__)

# Request body buffered per connection before reading from the client pauses: aiohttp's own default, as
# on the upstream side. A chunked 5 MiB upload then holds at most about 128 KiB in the load balancer.
READ_LIMIT: Final = 64 * 1024
# Parsed requests waiting behind the one being answered. Clients that pipeline send a handful (wrk's
# pipelining scripts use 16); 16 heads of a few hundred bytes each are nothing, and a client sending
# thousands is paused instead of filling memory.
MAX_PIPELINED: Final = 16
# The socket's write buffer above which a streamed body waits (asyncio's default is 64 KiB): 256 KiB is
# one STREAM_CHUNK, so a fast client never waits and a slow one holds one chunk plus what the kernel holds.
WRITE_HIGH_WATER: Final = 256 * 1024
# nginx's and aiohttp's server default (75 s): clients and their pools are tuned to it.
KEEPALIVE_SECONDS: Final = 75.0
# How long closing the server waits for requests in flight before cutting them: aiohttp's default too.
SHUTDOWN_SECONDS: Final = 60.0

_EXPECT = istr("Expect")
_CONTENT_LENGTH = istr("Content-Length")
_CONNECTION = istr("Connection")
_TRANSFER_ENCODING = istr("Transfer-Encoding")
_HOP_BY_HOP_LOWER: Final = frozenset(name.lower() for name in HOP_BY_HOP_HEADERS)
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK: Final = b"0\r\n\r\n"


def _reason(status: int, reason: str | None) -> str:
    if reason:
        return reason
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def render_response_head(status: int, reason: str | None, headers: CIMultiDictProxy[str], extra: str = "") -> bytes:
    """The status line and ``headers`` minus hop-by-hop ones, then ``extra`` (whole header lines), as bytes.

    Header values arrived as bytes decoded with surrogateescape; encoding them back gives the very bytes
    the replica sent.
    """
    drop = _HOP_BY_HOP_LOWER
    if _CONNECTION in headers:
        listed = {token.strip().lower() for value in headers.getall(_CONNECTION) for token in value.split(",")}
        drop = drop | listed
    parts = [f"HTTP/1.1 {status} {_reason(status, reason)}\r\n"]
    parts.extend(f"{name}: {value}\r\n" for name, value in headers.items() if name.lower() not in drop)
    parts.append(extra)
    parts.append("\r\n")
    return "".join(parts).encode("utf-8", "surrogateescape")


def too_many_connections_message(service: str, max_connections: int) -> str:
    """The 503 body for a connection beyond ``max_connections``: what is wrong and which setting it is."""
    return (
        f"Service unavailable: the load balancer for service {service} has {max_connections} client "
        f"connections open, its limit ({MAX_CONNECTIONS_VARIABLE}). Try again later.\n"
    )


def render_local_answer(answer: LocalAnswer, keep_alive: bool, head_only: bool) -> bytes:
    """A whole response for an answer the load balancer makes itself, as plain UTF-8 text."""
    body = answer.text.encode()
    head = (
        f"HTTP/1.1 {answer.status} {_reason(answer.status, None)}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        f"{'' if keep_alive else 'Connection: close' + chr(13) + chr(10)}\r\n"
    ).encode()
    return head if head_only else head + body


class _ClientConnection(BaseProtocol):
    """One client connection: parses requests as bytes arrive and answers them in order on one task.

    ``BaseProtocol`` supplies the flow control the parser and its body readers expect: their
    ``pause_reading``/``resume_reading`` pause the socket and let the parser keep an unparsed tail.
    """

    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop, release: Callable[[], None]) -> None:
        super().__init__(loop)
        self._server = server
        self._lb = server.lb
        self._release = release
        # ``_parser`` is BaseProtocol's (it pauses the parser); ``_requests`` is the same object, typed.
        self._requests = HttpRequestParser(self, loop, READ_LIMIT, max_msg_queue_size=MAX_PIPELINED)
        self._parser = self._requests
        self._queue: collections.deque[tuple[RawRequestMessage, aiohttp.StreamReader]] = collections.deque()
        self._bad_request: HttpProcessingError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._body: aiohttp.StreamReader | None = None
        self._peer: str | None = None
        self._scheme = "http"  # X-Forwarded-Proto: "https" on a TLS connection
        self._lost = False
        self.closing = False
        self.busy = False
        self.idle_since = loop.time()

    # -- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None
        self._scheme = "https" if transport.get_extra_info("sslcontext") is not None else "http"
        self._server.connections.add(self)
        self._task = self._loop.create_task(self._run())

    def data_received(self, data: bytes) -> None:
        if self._bad_request is not None or self._lost:
            return
        try:
            messages, _, _ = self._requests.feed_data(data)
        except HttpProcessingError as exc:
            self._bad_request = exc
            self._pause_reading_for_buffer()
            self._wake()
            return
        if not messages:
            return
        faulty = next((index for index, (message, _) in enumerate(messages) if _has_faulty_framing(message)), None)
        if faulty is not None:
            # Answered as the parser's own refusals are: the requests before it, then 400 and a close.
            messages = messages[:faulty]
            self._bad_request = BadHttpMessage("Transfer-Encoding in an HTTP/1.0 request")
            self._pause_reading_for_buffer()
        queue = self._queue
        queue.extend(messages)
        if len(queue) >= MAX_PIPELINED and not self._buffer_paused:
            self._pause_reading_for_buffer()
        self._wake()

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._lost = True
        self._server.connections.discard(self)
        self._release()
        # A body being read (by the relay to a replica) or queued must end, not wait for bytes forever.
        error = ConnectionResetError("the client closed the connection")
        bodies = [self._body, *(payload for _, payload in self._queue)]
        for body in bodies:
            if body is not None and not body.is_eof():
                body.set_exception(error)
        self._queue.clear()
        self._wake()

    # -- the request loop ----------------------------------------------------------------------------------

    def close_when_idle(self) -> None:
        """Close now when no request is being answered, else right after the current response."""
        self.closing = True
        if not self.busy and not self._queue and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None:
            transport.write(data)

    async def _run(self) -> None:
        """Answer queued requests in order until the connection ends. Never raises."""
        try:
            while not self._lost:
                if not self._queue:
                    if self._bad_request is not None:
                        self._write(
                            render_local_answer(LocalAnswer(400, _bad_request_text(self._bad_request)), False, False)
                        )
                        break
                    if self.closing:
                        break
                    self.idle_since = self._loop.time()
                    self._waiter = self._loop.create_future()
                    await self._waiter
                    continue
                message, payload = self._queue.popleft()
                self._requests.message_consumed()
                if self._buffer_paused and self._bad_request is None:
                    self._resume_pipelined()
                self.busy = True
                try:
                    keep_alive = await self._answer(message, payload)
                finally:
                    self.busy = False
                    self._body = None
                if not keep_alive:
                    break
        except Exception:  # top of the connection's loop: log with context, drop this connection only
            log.exception("load balancer for service %s: answering a request failed", self._lb.service)
            self.abort()
            return
        if self.transport is not None:
            self.transport.close()  # after what is buffered has been sent

    def _resume_pipelined(self) -> None:
        # Let the parser emit the requests it held back, then read again unless the queue refilled.
        self.data_received(b"")
        if len(self._queue) < MAX_PIPELINED and self._bad_request is None:
            self._resume_reading_for_buffer()

    async def _answer(self, message: RawRequestMessage, payload: aiohttp.StreamReader) -> bool:
        """Answer one request; returns whether the connection stays open for the next one."""
        lb = self._lb
        method = message.method
        head_only = method == "HEAD"
        has_body = type(payload) is not EmptyStreamReader
        keep_alive = not message.should_close and not message.upgrade and not self.closing
        expect = message.headers.get(_EXPECT)
        if expect is not None and expect.lower() != "100-continue":
            answer = LocalAnswer(417, f"Unsupported expectation: {expect!r}; only 100-continue is.\n")
            self._write(render_local_answer(answer, False, head_only))
            return False
        url = await lb.select_target()
        if url is None:
            keep_alive = keep_alive and (not has_body or payload.is_eof())
            self._write(render_local_answer(lb.no_replica_answer(), keep_alive, head_only))
            return keep_alive
        body: bytes | aiohttp.StreamReader | None = None
        if has_body:
            self._body = payload
            if expect is not None and message.version >= (1, 1):
                self._write(_CONTINUE)
            length = message.headers.get(_CONTENT_LENGTH)
            if not message.chunked and length is not None and int(length) <= BUFFER_LIMIT:
                try:
                    body = await payload.read()
                except (OSError, HttpProcessingError):
                    return False  # the client went away, or sent a broken body: nobody to answer
            else:
                body = payload
        headers = compute_upstream_headers(message.headers, self._peer, self._scheme)
        path = message.path
        if not path.startswith("/"):  # absolute-form target ("GET http://host/x HTTP/1.1")
            path = message.url.raw_path_qs
        result = await lb.forward(url, method, path, headers, body)
        keep_alive = keep_alive and (not has_body or payload.is_eof()) and not self._lost
        if isinstance(result, LocalAnswer):
            self._write(render_local_answer(result, keep_alive, head_only))
            return keep_alive
        return await self._relay(message, result.response, result.url, keep_alive)

    async def _relay(self, message: RawRequestMessage, response: UpstreamResponse, url: str, keep_alive: bool) -> bool:
        """Send the replica's ``response`` to the client; always releases it. Returns whether to keep alive."""
        try:
            status = response.status
            length = response.content_length
            if is_buffered_response(status, length, message.method):
                try:
                    data = await response.read()
                except UpstreamError as exc:
                    last_error = str(exc)
                    log.warning("service %s: reading the response of %s failed: %s", self._lb.service, url, last_error)
                    answer = self._lb.bad_gateway_answer(1, last_error)
                    self._write(render_local_answer(answer, keep_alive, message.method == "HEAD"))
                    return keep_alive
                # Content-Length stays as the replica sent it: ``data`` is exactly that many bytes (a HEAD
                # answer keeps the length of the body it did not send).
                self._write(
                    render_response_head(
                        status, response.reason, response.headers, _connection_line(message, keep_alive)
                    )
                    + data
                )
                return keep_alive
            return await self._stream(message, response, url, keep_alive)
        finally:
            response.release()

    async def _stream(self, message: RawRequestMessage, response: UpstreamResponse, url: str, keep_alive: bool) -> bool:
        chunked = response.content_length is None and message.version >= (1, 1)
        if response.content_length is None and not chunked:
            keep_alive = False  # an HTTP/1.0 client learns where the body ends by the connection's end
        extra = _connection_line(message, keep_alive) + ("Transfer-Encoding: chunked\r\n" if chunked else "")
        self._write(render_response_head(response.status, response.reason, response.headers, extra))
        while True:
            try:
                chunk = await response.read_chunk(STREAM_CHUNK)
            except UpstreamError as exc:
                # The status line is out: the only honest signal left is to cut the client's connection, so
                # that it sees a truncated body rather than a complete-looking short one.
                self._lb.log_body_failure(url, exc)
                self.abort()
                return False
            if not chunk:
                break
            if self.transport is None:
                return False  # the client went away
            self._write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            if self._paused:
                try:
                    await self._drain_helper()
                except ConnectionError:
                    return False
        if chunked:
            self._write(_LAST_CHUNK)
        return keep_alive


def _connection_line(message: RawRequestMessage, keep_alive: bool) -> str:
    if not keep_alive:
        return "Connection: close\r\n"
    # HTTP/1.1 keeps alive unless told; an HTTP/1.0 client that asked for keep-alive must hear it granted.
    return "" if message.version >= (1, 1) else "Connection: keep-alive\r\n"


def _has_faulty_framing(message: RawRequestMessage) -> bool:
    """What both of aiohttp's parsers accept and RFC 9112 (6.1) says is faulty framing: Transfer-Encoding in an
    HTTP/1.0 request. A 1.0 hop in front of the load balancer reads that body by its Content-Length or up to
    the connection's end, not by chunks, so the two would disagree on where the next request starts. (What
    the parsers refuse themselves, Content-Length with Transfer-Encoding, two Content-Lengths, obs-fold, a
    bare LF in the head: tests/lb/test_request_framing.py.)"""
    return message.version < (1, 1) and _TRANSFER_ENCODING in message.headers


def _bad_request_text(exc: HttpProcessingError) -> str:
    return f"Bad request: {exc.message}\n"


class HttpServer:
    """The listening sockets and the connections, for one ``LoadBalancer`` that has been started.

    ``start`` binds and listens; ``close`` stops listening, closes idle connections, lets requests in
    flight finish for up to ``shutdown_seconds`` and then cuts what is left. At most ``max_connections``
    client connections are open at once; the next one gets 503 and is closed (``Listener``). A connection
    accepted while ``ssl_context()`` gives a context is served over TLS with it (``lb.tls``). Not reusable
    after ``close``.
    """

    def __init__(
        self,
        lb: LoadBalancer,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        keepalive_seconds: float = KEEPALIVE_SECONDS,
        shutdown_seconds: float = SHUTDOWN_SECONDS,
        ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
    ) -> None:
        self.lb = lb
        self.connections: set[_ClientConnection] = set()
        self._max_connections = max_connections
        self._keepalive_seconds = keepalive_seconds
        self._shutdown_seconds = shutdown_seconds
        self._ssl_context = ssl_context
        self._listener: Listener | None = None
        self._sweep: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Listen on ``host:port``; returns the bound addresses (host, port). Raises OSError when it cannot."""
        loop = asyncio.get_running_loop()
        refusal = render_local_answer(
            LocalAnswer(503, too_many_connections_message(self.lb.service, self._max_connections)), False, False
        )
        listener = Listener(
            lambda release: _ClientConnection(self, loop, release),
            refusal,
            f"load balancer for service {self.lb.service}",
            self._max_connections,
            ssl_context=self._ssl_context,
        )
        addresses = listener.start(host, port)
        self._listener = listener
        self._sweep = loop.call_later(self._keepalive_seconds / 4, self._sweep_idle)
        return addresses

    async def close(self) -> None:
        """Stop listening and end every connection, as the class docstring says. Idempotent."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        listener, self._listener = self._listener, None
        if listener is None:
            return
        listener.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._shutdown_seconds
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort()

    def _sweep_idle(self) -> None:
        """Close connections idle for ``keepalive_seconds``; runs every quarter of that while listening."""
        loop = asyncio.get_running_loop()
        oldest = loop.time() - self._keepalive_seconds
        for connection in list(self.connections):
            if not connection.busy and connection.idle_since < oldest:
                connection.close_when_idle()
        self._sweep = loop.call_later(self._keepalive_seconds / 4, self._sweep_idle)


async def serve(
    lb: LoadBalancer,
    host: str,
    port: int,
    stop: asyncio.Event,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
) -> None:
    """Run ``lb`` on ``host:port`` until ``stop`` is set or its source says the service is gone; over TLS
    for the connections accepted while ``ssl_context()`` gives a context.

    Raises OSError when the port cannot be bound. On return the listening sockets are closed, the requests
    in flight are answered, the counts of completed seconds are flushed and the upstream client is closed.
    """
    server = HttpServer(lb, max_connections, ssl_context=ssl_context)
    await lb.start()
    try:
        addresses = await server.start(host, port)
        bound = ", ".join(f"{address[0]}:{address[1]}" for address in addresses)
        log.info(
            "load balancer for service %s listening on %s%s (at most %d client connections)",
            lb.service,
            bound,
            " over HTTPS" if ssl_context() is not None else "",
            max_connections,
        )
        await _wait_until_stopped(lb, stop)
    finally:
        # Stop accepting, answer the held requests and finish the ones in flight first, then close the
        # upstream client they use.
        lb.stop_holding()
        await server.close()
        await lb.close()


async def _wait_until_stopped(lb: LoadBalancer, stop: asyncio.Event) -> None:
    """Return when ``stop`` is set or the service is gone from the store, whichever comes first."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(lb.wait_source_gone())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
