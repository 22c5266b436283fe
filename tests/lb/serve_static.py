"""A load balancer process over fixed replica urls, for tests that need one under their own resource limits.

    python -m tests.lb.serve_static PORT URL [URL ...]

Runs the real ``LoadBalancer`` on the real ``serve`` with no store: a static source and no sink. As the
entry point does, it reads the ``SKY_LITE_LB_*`` settings from the environment, raises its open-file limit
to the hard limit, and logs (INFO and up, to stderr); it stops on SIGTERM, closing what ``serve`` closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from skyserve_lite.clock import SystemClock
from skyserve_lite.lb.__main__ import start_limits, upstream_factory
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from skyserve_lite.lb.server import serve
from skyserve_lite.lb.settings import ConnectionLimits, LbSettings


class _StaticSource:
    def __init__(self, urls: tuple[str, ...]) -> None:
        self._view = LbView(ready_urls=urls, policy="round_robin")

    def read(self) -> LbView:
        return self._view


async def _run(port: int, urls: tuple[str, ...], settings: LbSettings, limits: ConnectionLimits) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    lb = LoadBalancer(
        "svc",
        _StaticSource(urls),
        None,
        SystemClock(),
        hold_seconds=settings.hold_seconds,
        upstream=upstream_factory(settings),
        eject_after_failures=settings.eject_after_failures,
        eject_seconds=settings.eject_seconds,
    )
    await serve(lb, "127.0.0.1", port, stop, limits)


def main(argv: list[str]) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = LbSettings.from_env(os.environ)
    limits = start_limits(settings)
    asyncio.run(_run(int(argv[0]), tuple(argv[1:]), settings, limits))


if __name__ == "__main__":
    main(sys.argv[1:])
