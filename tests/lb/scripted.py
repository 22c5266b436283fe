"""A scripted raw HTTP backend on 127.0.0.1 for tests that need answers no real server gives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

CLOSE = b""  # in a script: close the connection instead of answering


@dataclass
class ScriptedBackend:
    """Answers the n-th request it reads (over all connections) with ``answers[n]``, the last one repeated.

    An answer of ``CLOSE`` closes the connection without a byte; an answer ending in ``b"<close>"`` is sent
    without those 7 bytes and the connection is closed after it.
    """

    answers: Sequence[bytes]
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
                if answer == CLOSE:
                    return
                closing = answer.endswith(b"<close>")
                writer.write(answer.removesuffix(b"<close>"))
                await writer.drain()
                if closing:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def scripted_backend(*answers: bytes) -> AsyncIterator[ScriptedBackend]:
    backend = ScriptedBackend(answers)
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend.url = f"http://127.0.0.1:{port}"
    try:
        yield backend
    finally:
        server.close()
        await server.wait_closed()
