"""An in-process load balancer in front of an aiohttp backend on 127.0.0.1, for the server tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.lb.proxy import LoadBalancer
from skyserve_lite.lb.server import HttpServer
from skyserve_lite.lb.settings import ConnectionLimits
from skyserve_lite.state.models import LbView


class StaticSource:
    """The store's view of the service, fixed: these replica urls are READY."""

    def __init__(self, view: LbView) -> None:
        self.view = view

    def read(self) -> LbView:
        return self.view


@contextlib.asynccontextmanager
async def serving(app: web.Application, *, targets_alive: bool = True,
                  limits: ConnectionLimits | None = None) -> AsyncIterator[tuple[str, int]]:
    """``app`` as the only replica behind a load balancer (none with ``targets_alive`` False) serving under
    ``limits`` (the defaults when None); yields the load balancer's (host, port)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        urls = (f"http://{host}:{port}",) if targets_alive else ()
        lb = LoadBalancer("svc", StaticSource(LbView(urls, "round_robin")), None, FakeClock(0.0), hold_seconds=0)
        server = HttpServer(lb, limits)
        await lb.start()
        try:
            yield (await server.start("127.0.0.1", 0))[0]
        finally:
            lb.stop_holding()
            await server.close()
            await lb.close()
    finally:
        await runner.cleanup()
