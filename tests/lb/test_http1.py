"""lb/http1.py on its own: bytes in, requests and responses (or refusals) out, with a flow control that records."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp
import pytest

from skyserve_lite.lb.http1 import MAX_HEAD_BYTES, RequestParser, ResponseParser, compute_origin_form

from .recording_flow import RecordingFlow


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


GET = b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n"


# (reads, as the socket gave them) -> (method target keep_alive websocket body) of each request, the refusal,
# whether nothing more is parsed
REQUEST_CASES: dict[str, tuple[Sequence[bytes], list[tuple[str, str, bool, bool, bytes | None]], str | None, bool]] = {
    "one get": ([GET], [("GET", "/a?b=1", True, False, None)], None, False),
    "a head split across reads": ([b"GET /a?b=1 HT", b"TP/1.1\r\nHo", b"st: x\r\n\r\n"],
                                  [("GET", "/a?b=1", True, False, None)], None, False),
    "pipelined in one read": ([GET + b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" + GET],
                              [("GET", "/a?b=1", True, False, None), ("POST", "/p", True, False, b"abc"),
                               ("GET", "/a?b=1", True, False, None)], None, False),
    "chunked body": ([b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"],
                     [("POST", "/c", True, False, b"abcde")], None, False),
    "http/1.0 without keep-alive is the last": ([b"GET /a HTTP/1.0\r\n\r\n" + GET],
                                                [("GET", "/a", False, False, None)], None, True),
    "connection close is the last, the rest ignored": ([b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n"
                                                        b"GARBAGE\r\n\r\n"],
                                                       [("GET", "/a", False, False, None)], None, True),
    "a websocket handshake switches": ([b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                                        b"Upgrade: websocket\r\n\r\n"],
                                       [("GET", "/ws", True, True, None)], None, True),
    "another upgrade ends the parsing": ([b"GET /h HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                                          b"Upgrade: h2c\r\n\r\n" + GET],
                                         [("GET", "/h", True, False, None)], None, True),
    "a request before malformed bytes is kept": ([GET + b"POST /p HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\nx"],
                                                 [("GET", "/a?b=1", True, False, None)],
                                                 "Invalid character in Content-Length", True),
    "a head whose body is malformed is dropped": ([b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"],
                                                  [], "Invalid character in chunk size", True),
    "transfer-encoding in http/1.0": ([b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"],
                                      [], "Transfer-Encoding in an HTTP/1.0 request", True),
}


@pytest.mark.parametrize(("reads", "expected", "error", "done"), REQUEST_CASES.values(), ids=REQUEST_CASES.keys())
def test_requests_as_parsed(reads: Sequence[bytes], expected: list[tuple[str, str, bool, bool, bytes | None]],
                            error: str | None, done: bool) -> None:
    async def run() -> None:
        parser = RequestParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        found, errors = [], []
        for read in reads:
            feed = parser.feed(read)
            found += feed.requests
            errors += [feed.error] if feed.error is not None else []
        got = []
        for head, body in found:
            content = await body.read() if body is not None else None
            got.append((head.method, head.target, head.keep_alive, head.websocket, content))
        assert got == expected
        assert errors == ([error] if error is not None else [])
        assert parser.done is done

    _run(run)


def test_the_bytes_after_a_websocket_handshake_are_the_tunnels() -> None:
    async def run() -> None:
        parser = RequestParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        feed = parser.feed(b"GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05hello")
        assert feed.tunnel == b"\x81\x05hello"
        assert parser.feed(b"more").requests == []  # nothing is parsed after the switch

    _run(run)


def test_a_body_already_handed_over_fails_when_its_bytes_are_malformed() -> None:
    async def run() -> None:
        parser = RequestParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        feed = parser.feed(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        (_, body), = feed.requests
        assert body is not None
        assert parser.feed(b"zz\r\n").error is not None
        with pytest.raises(ConnectionAbortedError):
            await body.read()

    _run(run)


def test_a_large_body_pauses_reading_until_it_is_read() -> None:
    async def run() -> None:
        flow = RecordingFlow()
        parser = RequestParser(flow, asyncio.get_running_loop(), 100)
        feed = parser.feed(b"POST /p HTTP/1.1\r\nContent-Length: 300\r\n\r\n" + b"a" * 250)
        (_, body), = feed.requests
        assert body is not None
        assert flow.calls == ["pause"]
        assert await body.read(250) == b"a" * 250
        assert flow.calls[-1] == "resume"

    _run(run)


@pytest.mark.parametrize(("target", "expected"), [
    ("/a?b=1", "/a?b=1"),
    ("http://host:8080/a/b?c=d", "/a/b?c=d"),
    ("http://host", "/"),
    ("http://host/p", "/p"),
])
def test_origin_form(target: str, expected: str) -> None:
    assert compute_origin_form(target) == expected


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def _body_of(whole_or_stream: bytes | aiohttp.StreamReader) -> bytes:
    return whole_or_stream if isinstance(whole_or_stream, bytes) else await whole_or_stream.read()

# (reads, response has a body) -> status, body, whether the connection may carry another request
RESPONSE_CASES: dict[str, tuple[Sequence[bytes], bool, int, bytes, bool]] = {
    "length": ([OK], True, 200, b"ok", True),
    "split reads": ([b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 2\r\n\r\no", b"k"], True, 200, b"ok", True),
    "chunked": ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"], True, 200, b"ok", True),
    "informational first": ([b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK], True, 200, b"ok", True),
    "head: the head alone": ([b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"], False, 200, b"", True),
    "head after an informational": ([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"],
                                    False, 200, b"", True),
    "head with bytes after it": ([b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nstray"], False, 200, b"", False),
    "204": ([b"HTTP/1.1 204 No Content\r\n\r\n"], True, 204, b"", True),
    "connection close": ([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"], True, 200, b"ok",
                         False),
    "a second response to one request": ([OK + OK], True, 200, b"ok", False),
}


@pytest.mark.parametrize(("reads", "has_body", "status", "body", "reusable"), RESPONSE_CASES.values(),
                         ids=RESPONSE_CASES.keys())
def test_responses_as_parsed(reads: Sequence[bytes], has_body: bool, status: int, body: bytes, reusable: bool) -> None:
    async def run() -> None:
        parser = ResponseParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        for _ in range(2):  # the same parser for the next request when the first left it reusable
            parser.begin(has_body, upgrade=False)
            found = None
            for data in reads:
                feed = parser.feed(data)
                assert feed.error is None
                found = found or feed.response
            assert found is not None
            head, whole_or_stream = found
            assert (head.status, await _body_of(whole_or_stream)) == (status, body)
            assert parser.reusable is reusable
            parser.finish()
            if not reusable:
                break

    _run(run)


def test_a_body_until_the_connection_ends_ends_with_it_and_a_short_one_is_an_error() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        parser = ResponseParser(RecordingFlow(), loop, 2**16)
        parser.begin(True, upgrade=False)
        found = parser.feed(b"HTTP/1.1 200 OK\r\n\r\nuntil the end").response
        assert found is not None and isinstance(found[1], aiohttp.StreamReader)  # not whole until the end
        assert parser.feed_eof() is None
        assert await found[1].read() == b"until the end"
        assert not parser.reusable

        parser = ResponseParser(RecordingFlow(), loop, 2**16)
        parser.begin(True, upgrade=False)
        assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").response is not None
        assert parser.feed_eof() == "the response body broke off: connection lost"

    _run(run)


@pytest.mark.parametrize(("data", "upgrade", "error"), [
    (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nframes", True, None),
    (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", False,
     "unexpected response from the replica: 101 Switching Protocols"),
    (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", True,
     "unexpected response from the replica: 101 Switching Protocols"),
    (b"HTTP/1.1 2000 Nope\r\n\r\n", False, "invalid response from the replica: "),  # then llhttp's words
], ids=["asked-for", "not-asked-for", "naming-no-protocol", "invalid"])
def test_protocol_switches_and_invalid_answers(data: bytes, upgrade: bool, error: str | None) -> None:
    async def run() -> None:
        parser = ResponseParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        parser.begin(True, upgrade=upgrade)
        feed = parser.feed(data)
        assert (feed.error is None) if error is None else (feed.error or "").startswith(error)
        if error is None:
            assert feed.response is not None and feed.response[0].status == 101
            assert feed.tunnel == b"frames"

    _run(run)


def _trickle(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize(("header_bytes", "refused"), [(60 * 1024, False), (MAX_HEAD_BYTES + 8 * 1024, True)],
                         ids=["60-KiB-head", "over-the-bound"])
def test_a_request_head_larger_than_the_bound_is_refused(header_bytes: int, refused: bool) -> None:
    async def run() -> None:
        parser = RequestParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        data = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * header_bytes + b"\r\n\r\n"
        feeds = [parser.feed(read) for read in _trickle(data, 4096)]
        errors = [feed.error for feed in feeds if feed.error is not None]
        assert errors == ([f"request head larger than {MAX_HEAD_BYTES} bytes"] if refused else [])
        assert sum(len(feed.requests) for feed in feeds) == (0 if refused else 1)

    _run(run)


@pytest.mark.parametrize("has_body", [True, False], ids=["get", "head"])
def test_a_response_head_larger_than_the_bound_is_invalid(has_body: bool) -> None:
    async def run() -> None:
        parser = ResponseParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        parser.begin(has_body, upgrade=False)
        data = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 8 * 1024) + b"\r\nContent-Length: 0\r\n\r\n"
        errors = [feed.error for feed in map(parser.feed, _trickle(data, 4096)) if feed.error is not None]
        assert errors[:1] == [f"invalid response from the replica: a head larger than {MAX_HEAD_BYTES} bytes"]

    _run(run)


def test_a_body_whole_with_its_head_comes_as_bytes_and_one_still_arriving_as_a_stream() -> None:
    async def run() -> None:
        parser = ResponseParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        parser.begin(True, upgrade=False)
        found = parser.feed(OK).response
        assert found is not None and found[1] == b"ok"
        parser.finish()
        parser.begin(True, upgrade=False)
        split = parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab").response
        assert split is not None and isinstance(split[1], aiohttp.StreamReader)
        parser.feed(b"cde")
        assert await split[1].read() == b"abcde"
        assert parser.reusable

    _run(run)
