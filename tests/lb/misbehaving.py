"""A replica on 127.0.0.1 that misbehaves on cue, by request path, for the load balancer's failure tests.

    /ok        200 "ok"
    /slow      200 "slow" after 0.3 s
    /hang      no answer for a minute (the load balancer's upstream timeout ends it first)
    /reset     the connection is reset before any byte of an answer
    /stream    200 with a chunked body of 20 chunks, 50 ms apart

HTTP/1.1 with keep-alive on plain asyncio streams, so that a reset is a real reset and a hang a real hang.
It counts what it saw: requests per path, and connections that ended while a request was unanswered.
Answers name the replica: "slow from 127.0.0.1:PORT".

In a process of its own (for a test that kills it)::

    python -m tests.lb.misbehaving PORT     # prints "ready" once listening, serves until killed
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final

HANG_SECONDS: Final = 60.0
SLOW_SECONDS: Final = 0.3
STREAM_CHUNKS: Final = 20
STREAM_INTERVAL: Final = 0.05


def _answer(status: str, body: bytes) -> bytes:
    return b"HTTP/1.1 %b\r\nContent-Length: %d\r\n\r\n%b" % (status.encode(), len(body), body)


@dataclass
class MisbehavingReplica:
    url: str = ""
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    # Requests whose connection ended before the replica answered them (the load balancer gave up on them).
    abandoned: int = 0
    _connections: set[asyncio.StreamWriter] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode().partition("?")[0]
                self.requests[path] += 1
                if not await self._respond(path, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _respond(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is done with."""
        if path == "/reset":
            sock = writer.get_extra_info("socket")
            # SO_LINGER 0: closing sends RST, not FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.transport.abort()
            return False
        if path in ("/hang", "/slow"):
            seconds = HANG_SECONDS if path == "/hang" else SLOW_SECONDS
            gone = asyncio.ensure_future(reader.read(1))  # b"" once the load balancer closes the connection
            try:
                await asyncio.wait_for(asyncio.shield(gone), seconds)
            except asyncio.TimeoutError:
                gone.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await gone  # the reader is free again only once the read has ended
            else:
                self.abandoned += 1
                return False
        if path == "/stream":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for index in range(STREAM_CHUNKS):
                chunk = b"chunk %d;" % index
                writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                await writer.drain()
                await asyncio.sleep(STREAM_INTERVAL)
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(_answer("200 OK", f"{path.strip('/')} from {self.url.removeprefix('http://')}".encode()))
        await writer.drain()
        return True

    def close_connections(self) -> None:
        for writer in list(self._connections):
            writer.transport.abort()


@contextlib.asynccontextmanager
async def misbehaving_replica(port: int = 0) -> AsyncIterator[MisbehavingReplica]:
    replica = MisbehavingReplica()
    server = await asyncio.start_server(replica.handle, "127.0.0.1", port)
    replica.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield replica
    finally:
        server.close()
        replica.close_connections()
        await server.wait_closed()


async def _serve_forever(port: int) -> None:
    async with misbehaving_replica(port):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve_forever(int(sys.argv[1])))
