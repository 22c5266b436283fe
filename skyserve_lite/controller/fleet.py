"""The controllers sharing one database, as `controller status` and `serve status` show them.

Each running loop renews its row in ``controllers`` (``controller.leases``); a row renewed within the lease
TTL is a live controller. A row names the address its host's endpoints answer on (``host.json``'s endpoint
host), so the endpoints of a service are that address at the service's port, one per host.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyserve_lite.state.store import ControllerRow


@dataclass(frozen=True)
class ControllerView:
    """One controller sharing the database: its loop id, the address its host's endpoints answer on, the
    services whose leases name it, when it last renewed its row, and whether that was within the lease TTL
    (``live``: it owns what it holds; not live, its services move to the live ones)."""

    loop_id: str
    host: str
    services: tuple[str, ...]
    renewed_at: float
    live: bool


def find_controller_views(rows: Sequence[ControllerRow], now: float, ttl_seconds: float) -> list[ControllerView]:
    """``rows`` as `controller status` shows them: live when renewed within ``ttl_seconds`` (the rule
    ``controller.leases.find_live_controllers`` applies: renewed 29 s ago with a 30 s TTL is live, 30 s is
    not); live ones first, then by host and id."""
    views = [ControllerView(loop_id=row.loop_id, host=row.host, services=row.services, renewed_at=row.renewed_at,
                            live=now - row.renewed_at < ttl_seconds) for row in rows]
    return sorted(views, key=lambda view: (not view.live, view.host, view.loop_id))


def find_endpoints(endpoint: str, port: int, controllers: Sequence[ControllerView]) -> list[tuple[str, bool]]:
    """A service's endpoint on each controller host sharing the database: (url, controller_live), one per
    host in the order ``controllers`` are listed (every host runs a load balancer of every service, at the
    service's port), with whether a controller of that host is live; whether the endpoint answers is
    ``host_endpoints``' question. ``endpoint`` is the service's own url (its scheme is kept). No controller
    row yet: the service's own endpoint, its controller not known to be live. Pure."""
    if not controllers:
        return [(endpoint, False)]
    scheme = endpoint.partition("://")[0] or "http"
    live: dict[str, bool] = {}
    for view in controllers:
        live[view.host] = live.get(view.host, False) or view.live
    return [(f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}", up) for host, up in live.items()]


def list_controller_views(home: Path, now: float | None = None) -> list[ControllerView]:
    """Every controller sharing the database of ``home`` (``Store.list_controller_rows``), live or not, as
    this machine's clock and lease TTL (``SKY_LITE_LEASE_TTL_SECONDS``) see them. Reads only."""
    from skyserve_lite.controller.settings import ControllerSettings
    from skyserve_lite.state.store import Store

    ttl = ControllerSettings.from_env().lease_ttl_seconds
    store = Store.open(home)
    try:
        rows = store.list_controller_rows()
    finally:
        store.close()
    return find_controller_views(rows, time.time() if now is None else now, ttl)
