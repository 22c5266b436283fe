"""A load balancer process over fixed replica urls, for tests that need one under their own resource limits.

    python -m tests.lb.serve_static PORT MAX_CONNECTIONS URL [URL ...]

Runs the real ``LoadBalancer`` on the real ``serve`` with no store: a static source and no sink. It logs as
the entry point does (INFO and up, to stderr) and stops on SIGTERM, closing what ``serve`` closes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from skyserve_lite.clock import SystemClock
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from skyserve_lite.lb.server import serve


class _StaticSource:
    def __init__(self, urls: tuple[str, ...]) -> None:
        self._view = LbView(ready_urls=urls, policy="round_robin")

    def read(self) -> LbView:
        return self._view


async def _run(port: int, max_connections: int, urls: tuple[str, ...]) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    lb = LoadBalancer("svc", _StaticSource(urls), None, SystemClock())
    await serve(lb, "127.0.0.1", port, stop, max_connections)


def main(argv: list[str]) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_run(int(argv[0]), int(argv[1]), tuple(argv[2:])))


if __name__ == "__main__":
    main(sys.argv[1:])
