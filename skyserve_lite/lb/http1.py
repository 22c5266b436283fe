"""HTTP/1.1 framing for the load balancer on llhttp (``httptools``, the parser uvicorn uses): the requests
of clients (``RequestParser``, for ``server``) and the responses of replicas (``ResponseParser``, for
``pooled_upstream``).

``RequestParser.feed`` takes the bytes of one socket read and returns a ``Feed``: the requests whose heads
completed in it, each with its body stream (None when it has none), the refusal of malformed bytes if any,
and, after a WebSocket handshake, the bytes that follow it. Bodies are fed into an ``aiohttp.StreamReader``
(aiohttp's public stream class) as they arrive, which asks the connection to pause and resume reading from
the socket around its buffer limit.

What is refused (``Feed.error``, then the server answers 400 and closes): whatever llhttp refuses in its
strict mode, which covers the request smuggling cases (Content-Length with Transfer-Encoding, two
Content-Lengths, a Content-Length list, a Transfer-Encoding not ending in chunked, obs-fold, a bare LF, a
space before the colon, a bad chunk size: tests/lb/test_request_framing.py), and Transfer-Encoding in an
HTTP/1.0 request, which llhttp accepts and RFC 9112 (6.1) calls faulty framing: a 1.0 hop in front of the
load balancer reads that body by its Content-Length or up to the connection's end, not by chunks, so the
two would disagree on where the next request starts.

A request head (request line and headers) larger than ``MAX_HEAD_BYTES`` is refused too, and a replica's
response head larger than that is an invalid response: llhttp itself keeps no head, but httptools gathers
each header and the target until they are whole, so without a bound one endless header would take the
process's memory. The bound is checked per socket read, so a head may pass it by up to one read (256 KiB).

The requests whose heads completed before the malformed bytes are kept, except the one the bytes belong to;
one whose body was already being relayed gets ``ConnectionAbortedError`` from its stream. After a request
that ends the connection (``Connection: close``, HTTP/1.0 without keep-alive) or asks for a protocol switch,
nothing more is parsed: its answer is the connection's last, or the bytes after it belong to the tunnel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any, Final, NamedTuple, Protocol, TypeVar, overload

import aiohttp
import httptools

from skyserve_lite.lb.records import tuple_maker

__all__ = [
    "HOP_BY_HOP_HEADERS",
    "HOP_BY_HOP_NAMES",
    "MAX_HEAD_BYTES",
    "Feed",
    "FlowControl",
    "RawHeaders",
    "RequestHead",
    "RequestParser",
    "ResponseFeed",
    "ResponseHead",
    "ResponseParser",
    "compute_origin_form",
    "new_stream",
]

# The headers meant for one hop of a connection only (RFC 9110 7.6.1), never relayed, plus the names a
# message's Connection header lists; "Proxy-Connection", "Trailers" and "Keep-Alive" are what old clients
# send.
HOP_BY_HOP_HEADERS: Final = (
    "Connection",
    "Keep-Alive",
    "Proxy-Authenticate",
    "Proxy-Authorization",
    "Proxy-Connection",
    "TE",
    "Trailer",
    "Trailers",
    "Transfer-Encoding",
    "Upgrade",
)
# The same, lowercase bytes, as headers are compared (``RawHeaders``).
HOP_BY_HOP_NAMES: Final = frozenset(name.lower().encode() for name in HOP_BY_HOP_HEADERS)
_VERSIONS: Final = {"1.1": (1, 1), "1.0": (1, 0)}
# The headers whose values the parsers read (lowercase), the rest are only kept.
_REQUEST_FIELDS: Final = frozenset({b"content-length", b"transfer-encoding", b"upgrade", b"connection", b"expect"})
_RESPONSE_FIELDS: Final = HOP_BY_HOP_NAMES | {b"content-length"}
# A request or response head larger than this is refused. nginx's default is 4 buffers of 8 KiB for a
# request's headers; 64 KiB leaves room for the large cookies and tokens some clients send.
MAX_HEAD_BYTES: Final = 64 * 1024


class FlowControl(Protocol):
    """What an ``aiohttp.StreamReader`` calls on the protocol it is given: reading from the socket pauses
    while the stream holds more than twice its limit and resumes once it holds less than the limit."""

    @property
    def connected(self) -> bool: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self, resume_parser: bool = True) -> None: ...


def new_stream(protocol: FlowControl, loop: asyncio.AbstractEventLoop, limit: int) -> aiohttp.StreamReader:
    """An ``aiohttp.StreamReader`` over ``protocol``. Its annotation asks for aiohttp's ``BaseProtocol``, of
    which it calls only what ``FlowControl`` names (tests/lb/test_aiohttp_pin.py holds it to that)."""
    return aiohttp.StreamReader(protocol, limit, loop=loop)  # type: ignore[arg-type]


_T = TypeVar("_T")


class RawHeaders(Mapping[str, str]):
    """Headers as they came, ``raw``: (name, value) pairs of bytes in order, repeats kept. As a mapping,
    names are looked up without regard to case and values decoded with surrogateescape (encoding one back
    gives the very bytes), the first of repeated names answering; ``getall`` gives every value.

    Nothing is decoded or indexed until asked: the load balancer relays headers as bytes and looks up one
    or two per request (``lb.proxy.render_upstream_headers``, ``lb.server.render_response_head``).
    """

    __slots__ = ("_listed", "hop_by_hop", "raw")

    def __init__(
        self, raw: list[tuple[bytes, bytes]], listed: frozenset[bytes] | None = None, hop_by_hop: bool = True
    ) -> None:
        self.raw = raw
        # The names ``Connection`` lists, when the parser has found them already (it reads that header).
        self._listed = listed
        # False only when it is known that no name is one of ``HOP_BY_HOP_NAMES`` (so none is listed either):
        # the headers may then be relayed whole, without looking at each.
        self.hop_by_hop = hop_by_hop

    @overload
    def get(self, name: str, /) -> str | None: ...

    @overload
    def get(self, name: str, default: str | _T, /) -> str | _T: ...

    def get(self, name: str, default: object = None, /) -> object:
        key = name.lower().encode("utf-8", "surrogateescape")
        for raw_name, value in self.raw:
            if raw_name.lower() == key:
                return value.decode("utf-8", "surrogateescape")
        return default

    def getall(self, name: str) -> list[str]:
        key = name.lower().encode("utf-8", "surrogateescape")
        return [value.decode("utf-8", "surrogateescape") for raw_name, value in self.raw if raw_name.lower() == key]

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        return (name.decode("utf-8", "surrogateescape") for name, _ in self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def connection_tokens(self) -> frozenset[bytes]:
        """The names listed in ``Connection`` headers, lowercase: the ones meant for this hop only."""
        listed = self._listed
        if listed is None:
            listed = _NOTHING_LISTED
            for name, value in self.raw:
                if name.lower() == b"connection":
                    listed = add_connection_tokens(listed, value)
            self._listed = listed
        return listed

    def pairs(self) -> list[tuple[str, str]]:
        """Every (name, value), decoded, in order."""
        return [(name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
                for name, value in self.raw]

    def __repr__(self) -> str:
        return f"RawHeaders({self.raw!r})"


_NOTHING_LISTED: Final[frozenset[bytes]] = frozenset()


def add_connection_tokens(listed: frozenset[bytes], value: bytes) -> frozenset[bytes]:
    """``listed`` and the names a ``Connection`` header's ``value`` lists (lowercase, without blanks)."""
    return listed.union(token.strip().lower() for token in value.split(b",") if token.strip())


class RequestHead(NamedTuple):
    """A request's line and headers as they came."""

    method: str
    target: str  # the request target as sent: "/path?query", or the absolute form "http://host/path"
    version: tuple[int, int]
    headers: RawHeaders
    keep_alive: bool  # the client lets the connection stay open after the answer (RFC 9112 9.3)
    upgrade: bool  # Connection: Upgrade with an Upgrade header
    websocket: bool  # an upgrade to "websocket" without a body: the parser switched to a tunnel
    chunked: bool  # the body is chunked (else it is Content-Length long)
    content_length: int | None
    expect: str | None  # the Expect header's value


class Feed(NamedTuple):
    """What one ``RequestParser.feed`` found; see the module docstring."""

    requests: list[tuple[RequestHead, aiohttp.StreamReader | None]]
    error: str | None = None
    tunnel: bytes | None = None  # set after a WebSocket handshake: the bytes that came after it


class _Stop(Exception):
    """Raised in a callback to stop llhttp: a refusal of ours, or nothing more to parse."""


def compute_origin_form(target: str) -> str:
    """The path and query of a request target: itself in origin form ("/a?b"), else the absolute form's
    path and query ("http://host/a?b" -> "/a?b"; "/" when it has no path)."""
    if target.startswith("/"):
        return target
    # Its path and query are None where the target has none, whatever httptools' stub says (bytes): read
    # untyped, then typed as they are, so that compiled code (mypyc) checks the right thing.
    url: Any = httptools.parse_url(target.encode("utf-8", "surrogateescape"))
    raw_path: bytes | None = url.path
    query: bytes | None = url.query
    path = (raw_path or b"/").decode("utf-8", "surrogateescape")
    return f"{path}?{query.decode('utf-8', 'surrogateescape')}" if query is not None else path


class _HeadBound:
    """Counts the bytes of the head being parsed, by whole socket reads: a read that began inside the head
    and left it unfinished was all head; the read a head began in counts as nothing (it is at most one).

    The parsers set the attributes themselves (per request: a call costs more than the work): before each
    read ``began_here = False``; when a message begins ``in_head = began_here = True`` and ``bytes = 0``;
    when its head is whole ``in_head = False``; after the read, while ``in_head``, ``is_over(len(read))``.
    """

    __slots__ = ("began_here", "bytes", "in_head")

    def __init__(self) -> None:
        self.in_head = False
        self.began_here = False
        self.bytes = 0

    def is_over(self, read: int) -> bool:
        """After a read of ``read`` bytes that left a head unfinished: whether it passed ``MAX_HEAD_BYTES``."""
        if not self.began_here:
            self.bytes += read
        return self.bytes > MAX_HEAD_BYTES


class RequestParser:
    """Parses one client connection's bytes into requests (see the module docstring). ``protocol`` is what
    the body streams pause and resume: it needs ``pause_reading``, ``resume_reading`` and ``connected``."""

    def __init__(self, protocol: FlowControl, loop: asyncio.AbstractEventLoop, read_limit: int) -> None:
        self._protocol = protocol
        self._loop = loop
        self._read_limit = read_limit
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._found: list[tuple[RequestHead, aiohttp.StreamReader | None]] = []
        self._head: RequestHead | None = None  # the message being parsed, once its head is whole
        self._body: aiohttp.StreamReader | None = None
        self._complete = True  # the last message has ended
        self._refusal: str | None = None
        self._heads = _HeadBound()
        self.done = False  # nothing more is parsed (a refusal, a last request, a protocol switch)

    def feed(self, data: bytes) -> Feed:
        """Parse ``data``; see ``Feed``. After ``done`` every call returns an empty ``Feed``."""
        if self.done:
            return Feed([])
        found: list[tuple[RequestHead, aiohttp.StreamReader | None]] = []
        self._found = found
        heads = self._heads
        heads.began_here = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as switch:
            self.done = True
            head = self._head
            if head is not None and head.websocket:
                return Feed(found, tunnel=data[switch.args[0] :])
            return Feed(found)  # another protocol (or CONNECT): the server closes after answering it
        except httptools.HttpParserError as exc:
            if self._refusal is None and self.done:  # a request that ended the connection: the rest is ignored
                return Feed(found)
            self.done = True
            refusal = self._refusal or str(exc) or type(exc).__name__
            if not self._complete:
                self._fail_message_in_progress(found, refusal)
            return Feed(found, error=refusal)
        if heads.in_head and heads.is_over(len(data)):
            self.done = True
            return Feed(found, error=f"request head larger than {MAX_HEAD_BYTES} bytes")
        return _new_feed((found, None, None))

    def _fail_message_in_progress(
        self, found: list[tuple[RequestHead, aiohttp.StreamReader | None]], refusal: str
    ) -> None:
        head, body = self._head, self._body
        if found and found[-1][0] is head:
            found.pop()  # its head came with the malformed bytes: it is never answered
        elif body is not None and not body.is_eof():
            body.set_exception(ConnectionAbortedError(f"the request body was malformed: {refusal}"))

    # -- llhttp's callbacks ----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head = None
        self._body = None
        self._complete = False
        heads = self._heads
        heads.in_head = heads.began_here = True
        heads.bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._heads.in_head = False
        parser = self._parser
        raw = self._headers
        chunked = False
        length_value = upgrade_value = expect = None
        listed = _NOTHING_LISTED
        for name, value in raw:
            lower = name.lower()
            if lower not in _REQUEST_FIELDS:
                continue  # most headers: one set lookup, not five comparisons
            if lower == b"content-length":
                length_value = length_value or value  # llhttp refuses a second one
            elif lower == b"transfer-encoding":
                chunked = True  # llhttp refuses a request whose last coding is not chunked
            elif lower == b"upgrade":
                upgrade_value = value if upgrade_value is None else upgrade_value
            elif lower == b"connection":
                listed = add_connection_tokens(listed, value)
            elif lower == b"expect":
                expect = value if expect is None else expect
        version = _VERSIONS.get(parser.get_http_version(), (1, 0))
        if chunked and version < (1, 1):
            self._refusal = "Transfer-Encoding in an HTTP/1.0 request"
            raise _Stop
        length = int(length_value) if length_value is not None else None  # llhttp checked: digits
        has_body = chunked or bool(length)
        upgrade = upgrade_value is not None and b"upgrade" in listed and parser.should_upgrade()
        websocket = upgrade and not has_body and upgrade_value is not None and (
            upgrade_value.strip().lower() == b"websocket")
        head = _new_request_head((
            parser.get_method().decode("ascii"),
            self._url.decode("utf-8", "surrogateescape"),
            version,
            RawHeaders(raw, listed),
            parser.should_keep_alive(),
            upgrade,
            websocket,
            chunked,
            length,
            expect.decode("utf-8", "surrogateescape") if expect is not None else None,
        ))
        body = None
        if has_body:
            body = new_stream(self._protocol, self._loop, self._read_limit)
        self._head, self._body = head, body
        self._found.append((head, body))

    def on_body(self, data: bytes) -> None:
        body = self._body
        if body is not None:
            body.feed_data(data)

    def on_message_complete(self) -> None:
        self._complete = True
        body = self._body
        if body is not None:
            body.feed_eof()
        head = self._head
        if head is not None and not head.keep_alive and not head.upgrade:
            # Its answer is the connection's last: llhttp would refuse bytes after it, and they are not ours
            # to answer anyway.
            self.done = True
            raise _Stop


class ResponseHead(NamedTuple):
    """A replica's status line and headers as they came (the reason decoded with surrogateescape)."""

    status: int
    reason: str
    headers: RawHeaders
    keep_alive: bool  # the replica lets the connection be used again once the body is read
    content_length: int | None  # the Content-Length header, when it has one


class ResponseFeed(NamedTuple):
    """What one ``ResponseParser.feed`` found: the final response's head and body once the head is whole
    (informational answers are skipped), an error, and after a 101 the bytes that followed it. The body is
    ``bytes`` when it came whole in the same read as the head, as a small answer does, else a stream."""

    response: tuple[ResponseHead, aiohttp.StreamReader | bytes] | None = None
    error: str | None = None
    tunnel: bytes | None = None


_new_feed: Final = tuple_maker(Feed)
_new_request_head: Final = tuple_maker(RequestHead)
_new_response_feed: Final = tuple_maker(ResponseFeed)
_new_response_head: Final = tuple_maker(ResponseHead)
_NO_RESPONSE: Final = ResponseFeed()
_BODYLESS_STATUSES: Final = frozenset({204, 304})
_HEAD_END: Final = b"\r\n\r\n"


class ResponseParser:
    """Parses the responses of one connection to a replica, one request at a time.

    ``begin`` before each request says whether its response has a body (not for HEAD) and whether a 101 may
    switch protocols; ``feed`` takes the bytes read; ``feed_eof`` the connection's end. A body not whole in
    the read that brought its head goes to an ``aiohttp.StreamReader`` over ``protocol`` (one whole in it is
    handed over as bytes: 0.3 us against 2.5 us to make, fill and read a stream). llhttp frames
    Content-Length, chunked and bodies that end with the connection, and knows 1xx, 204 and 304 have none;
    a HEAD answer's head is fed on its own (it is whole at the first empty line), since llhttp would take
    the body its Content-Length announces.
    ``reusable`` says whether the connection may carry another request: the response was whole, the
    replica keeps the connection, and no byte came that nobody asked for.
    """

    def __init__(self, protocol: FlowControl, loop: asyncio.AbstractEventLoop, read_limit: int) -> None:
        self._protocol = protocol
        self._loop = loop
        self._read_limit = read_limit
        self._parser = httptools.HttpResponseParser(self)
        self._fresh = True  # llhttp is between messages
        self._has_body = True
        self._upgrade = False
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: ResponseHead | None = None  # the final response's, once whole
        self._response_has_body = False
        self._chunks: list[bytes] = []  # its body until it is handed over
        self._body: aiohttp.StreamReader | None = None  # its body after, when not whole by then
        self._found: tuple[ResponseHead, aiohttp.StreamReader | bytes] | None = None  # what was handed over
        self._head_buffer = b""
        self._body_until_eof = False
        self._heads = _HeadBound()
        self.active = False  # a request is waiting for (the rest of) its response
        self.complete = False  # the final response ended
        self.keep_alive = False
        self.stray = False  # bytes came that belong to no response asked for

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.stray

    def begin(self, has_body: bool, upgrade: bool) -> None:
        if not self._fresh:
            self._parser = httptools.HttpResponseParser(self)  # llhttp still expects a HEAD answer's body
            self._fresh = True
        self._has_body = has_body
        self._upgrade = upgrade
        self._head = None
        self._chunks = []
        self._found = None
        self._body = None
        self._head_buffer = b""
        self.active = True
        self.complete = False
        self.keep_alive = False

    def finish(self) -> None:
        """The response is done with (released); bytes from now on belong to no request."""
        self.active = False

    def feed(self, data: bytes) -> ResponseFeed:
        if not self.active or self.complete:
            self.stray = self.stray or bool(data)
            return _NO_RESPONSE
        if not self._has_body:
            return self._feed_head_only(data)
        return self._feed(data)

    def _feed(self, data: bytes) -> ResponseFeed:
        heads = self._heads
        heads.began_here = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as switch:
            self._fresh = False
            head = self._head
            if head is None or head.status != 101 or not self._upgrade:
                status = f"{head.status} {head.reason}" if head is not None else "a protocol switch"
                return ResponseFeed(error=f"unexpected response from the replica: {status}")
            return ResponseFeed(self._hand_over(), tunnel=data[switch.args[0] :])
        except httptools.HttpParserError as exc:
            self._fresh = False
            if self.stray:
                return ResponseFeed(self._hand_over())
            head = self._head
            if head is not None and head.status == 101:
                return ResponseFeed(error=f"unexpected response from the replica: 101 {head.reason}")
            return ResponseFeed(error=f"invalid response from the replica: {exc or type(exc).__name__}")
        head = self._head
        if head is not None and head.status == 101:
            # llhttp switches only when the 101 names what it switches to (Connection and Upgrade).
            return ResponseFeed(error=f"unexpected response from the replica: 101 {head.reason}")
        if heads.in_head and heads.is_over(len(data)):
            return ResponseFeed(error=f"invalid response from the replica: a head larger than {MAX_HEAD_BYTES} bytes")
        return _new_response_feed((self._hand_over(), None, None))

    def _hand_over(self) -> tuple[ResponseHead, aiohttp.StreamReader | bytes] | None:
        """The response to hand over once its head is whole: the body as bytes when it is whole too (or there
        is none), else a stream holding what came so far and taking the rest."""
        head = self._head
        if head is None or self._found is not None:
            return self._found
        if self.complete or not self._response_has_body:
            self._found = (head, b"".join(self._chunks))
        else:
            body = self._body = new_stream(self._protocol, self._loop, self._read_limit)
            for chunk in self._chunks:
                body.feed_data(chunk)
            self._found = (head, body)
        self._chunks = []
        return self._found

    def _feed_head_only(self, data: bytes) -> ResponseFeed:
        buffer = self._head_buffer + data
        while True:
            end = buffer.find(_HEAD_END)
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    return ResponseFeed(
                        error=f"invalid response from the replica: a head larger than {MAX_HEAD_BYTES} bytes"
                    )
                self._head_buffer = buffer
                return ResponseFeed()
            head, buffer = buffer[: end + 4], buffer[end + 4 :]
            self._head_buffer = b""
            feed = self._feed(head)
            if feed.error is not None:
                return feed
            if feed.response is not None:
                self.complete = True
                self._fresh = False
                self.stray = self.stray or bool(buffer)
                return feed

    def feed_eof(self) -> str | None:
        """The connection ended: end a body that ends with it; the error when the response is cut short."""
        if not self.active or self.complete:
            return None
        if self._head is None:
            return "the replica closed the connection before a complete response head"
        body = self._body
        if body is not None and not body.is_eof() and not self.keep_alive and self._body_until_eof:
            self.complete = True
            body.feed_eof()
            return None
        return "the response body broke off: connection lost"

    # -- llhttp's callbacks ----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._fresh = False
        if self._head is not None:
            self.stray = True  # a second response to one request
            raise _Stop
        self._reason = b""
        self._headers = []
        heads = self._heads
        heads.in_head = heads.began_here = True
        heads.bytes = 0

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._heads.in_head = False
        parser = self._parser
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            return  # informational: the final response follows on the same connection
        length_value = None
        framed = False  # a Content-Length or Transfer-Encoding says where the body ends
        listed = _NOTHING_LISTED
        hop_by_hop = False
        for name, value in self._headers:
            lower = name.lower()
            if lower not in _RESPONSE_FIELDS:
                continue
            if lower == b"content-length":
                framed = True
                length_value = length_value or value
                continue
            hop_by_hop = True
            if lower == b"transfer-encoding":
                framed = True
            elif lower == b"connection":
                listed = add_connection_tokens(listed, value)
        length = int(length_value) if length_value is not None and length_value.isdigit() else None
        self.keep_alive = parser.should_keep_alive()
        reason = self._reason.decode("utf-8", "surrogateescape")
        self._head = _new_response_head((status, reason, RawHeaders(self._headers, listed, hop_by_hop), self.keep_alive,
                                          length))
        has_body = self._response_has_body = self._has_body and status not in _BODYLESS_STATUSES and status != 101
        self._body_until_eof = has_body and not framed

    def on_body(self, data: bytes) -> None:
        body = self._body
        if body is not None:
            body.feed_data(data)
        else:
            self._chunks.append(data)

    def on_message_complete(self) -> None:
        self._fresh = True
        if self._head is None:
            return  # an informational answer
        self.complete = True
        body = self._body
        if body is not None and not body.is_eof():
            body.feed_eof()
