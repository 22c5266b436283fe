"""Request framing the load balancer must refuse: anything two HTTP implementations could read as different
requests (a request smuggled past the load balancer, or past a proxy in front of it).

Each case is sent over a raw socket to a real load balancer process on 127.0.0.1 (``tests.lb.serve_static``),
whose framing is llhttp's through httptools (``skyserve_lite.lb.http1``; it has no pure-Python fallback, so
every install parses alike): the answer must be 400 with ``Connection: close``, the connection closed, and
nothing of the request, nor of what follows it, sent to the replica.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from skyserve_lite.procs import find_free_port

REPO = Path(__file__).resolve().parents[2]

# A complete request the load balancer's replica would answer, smuggled after an ambiguous body.
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

CASES = [
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"0\r\n\r\n" + SMUGGLED, id="content-length-then-transfer-encoding"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
                 b"0\r\n\r\n" + SMUGGLED, id="transfer-encoding-then-content-length"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 37\r\n\r\n" + SMUGGLED,
                 id="two-content-lengths"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 37\r\nContent-Length: 37\r\n\r\n" + SMUGGLED,
                 id="two-equal-content-lengths"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 37, 37\r\n\r\n" + SMUGGLED,
                 id="a-content-length-list"),
    pytest.param(b"GET /a HTTP/1.1\r\nHost: x\r\nX-Note: one\r\n two\r\n\r\n", id="obs-fold"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 37\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"
                 b"0\r\n\r\n" + SMUGGLED, id="obs-fold-hiding-transfer-encoding"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nX-Note: one\r\n\ttwo\r\n\r\n", id="obs-fold-with-a-tab"),
    pytest.param(b"GET /a HTTP/1.1\nHost: x\r\n\r\n", id="bare-lf-after-the-request-line"),
    pytest.param(b"GET /a HTTP/1.1\r\nHost: x\nX-Note: one\r\n\r\n", id="bare-lf-between-headers"),
    pytest.param(b"GET /a HTTP/1.1\r\nHost: x\r\n\n" + SMUGGLED, id="bare-lf-ending-the-head"),
    pytest.param(b"GET /a HTTP/1.1\nHost: x\n\n", id="bare-lf-throughout"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
                 id="space-before-the-colon"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
                 id="transfer-encoding-not-chunked"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"0\r\n\r\n" + SMUGGLED, id="two-transfer-encodings"),
    # RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing (a 1.0 hop reads the body
    # by Content-Length or the connection's end, not by chunks).
    pytest.param(b"POST /a HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"0\r\n\r\n" + SMUGGLED, id="transfer-encoding-in-http-1.0"),
    # A chunk size that is not hex, or that overflows: where the body ends is anybody's guess.
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
                 + SMUGGLED, id="chunk-size-not-hex"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nab\r\n"
                 + SMUGGLED, id="chunk-size-overflowing-64-bits"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"
                 + SMUGGLED, id="negative-chunk-size"),
]


class _Replica(http.server.BaseHTTPRequestHandler):
    """Answers every request with 200 and records its request line."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Replica.seen.append(self.requestline)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_POST = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def replica() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replica)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _wait_until_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert process.poll() is None, "the load balancer exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the load balancer did not listen within 20 s")


@pytest.fixture(scope="module")
def lb_port(replica: str) -> Iterator[int]:
    port = find_free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.lb.serve_static", str(port), "100", replica],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_listening(port, process)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=20)


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, then read until the load balancer closes the connection (at most 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(data)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
        return received


def test_a_well_framed_request_reaches_the_replica(lb_port: int) -> None:
    before = len(_Replica.seen)
    answer = _exchange(lb_port, b"POST /fine HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")
    assert _Replica.seen[before:] == ["POST /fine HTTP/1.1"]


@pytest.mark.parametrize("request_bytes", CASES)
def test_ambiguous_framing_gets_400_a_close_and_reaches_no_replica(lb_port: int, request_bytes: bytes) -> None:
    before = len(_Replica.seen)

    answer = _exchange(lb_port, request_bytes)  # returns once the load balancer closed the connection

    head, _, text = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"\r\nConnection: close" in head
    assert text.startswith(b"Bad request")
    assert answer.count(b"HTTP/1.1 ") == 1  # one answer: nothing after the refused request was answered
    assert _Replica.seen[before:] == []


def test_pipelined_requests_before_malformed_bytes_are_answered_then_400(lb_port: int) -> None:
    before = len(_Replica.seen)

    answer = _exchange(lb_port, b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
                                b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc" + SMUGGLED)

    first, _, rest = answer.partition(b"\r\n\r\nok")
    assert first.startswith(b"HTTP/1.1 200 ")
    assert rest.startswith(b"HTTP/1.1 400 ") and b"\r\nConnection: close" in rest
    assert _Replica.seen[before:] == ["GET /first HTTP/1.1"]
