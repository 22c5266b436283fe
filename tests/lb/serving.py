"""In-process load balancers and aiohttp replicas on 127.0.0.1, for the server tests."""

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
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """``app`` on a free port of 127.0.0.1; yields its url and stops it on the way out."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _serve_lb_at(lb: LoadBalancer, limits: ConnectionLimits | None) -> AsyncIterator[tuple[str, int]]:
    server = HttpServer(lb, limits)
    await lb.start()
    try:
        yield (await server.start("127.0.0.1", 0))[0]
    finally:
        lb.stop_holding()
        await server.close()
        await lb.close()


@contextlib.asynccontextmanager
async def serve_lb(lb: LoadBalancer, limits: ConnectionLimits | None = None) -> AsyncIterator[str]:
    """Start ``lb`` and its HTTP server (under ``limits``, the defaults when None) on a free port of
    127.0.0.1; yields the server's url; stops holding, closes the server, then ``lb`` on the way out."""
    async with _serve_lb_at(lb, limits) as (host, port):
        yield f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serving(app: web.Application, *, targets_alive: bool = True,
                  limits: ConnectionLimits | None = None) -> AsyncIterator[tuple[str, int]]:
    """``app`` as the only replica behind a load balancer (none with ``targets_alive`` False) serving under
    ``limits`` (the defaults when None); yields the load balancer's (host, port)."""
    async with serve_app(app) as url:
        urls = (url,) if targets_alive else ()
        lb = LoadBalancer("svc", StaticSource(LbView(urls, "round_robin")), None, FakeClock(0.0), hold_seconds=0)
        async with _serve_lb_at(lb, limits) as address:
            yield address
