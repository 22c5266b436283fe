"""A service's endpoint on every controller host sharing the database, and whether it is live: `serve status`.

Every host runs a load balancer of every service at the service's port (``controller.lb_runner``), so a
service's endpoints are each host's address at that port (``controller.fleet.find_endpoints``). An endpoint
is **live** when it answered ``GET /.sky-lite/identity`` (``endpoint_identity``) as this service of this
state during this status: what a user putting DNS or a network load balancer in front wants to know, since
that is where requests sent to it are served. It is not the same as its host's controller being live
(``controller_live``, renewed within the lease TTL): load balancers read the ready replicas from the database
and hold no state, so those of a host whose loop stopped (`controller stop`, a killed loop, cron not there
yet) serve on; and a host whose controller renews may have no load balancer answering for the service yet.

The endpoints are asked from where the status is made (this machine, or the controller host the CLI talks
to, which shares a network with the other hosts). A host that is gone drops packets rather than refusing
them, and each of its endpoints would cost the whole 1 s timeout (1,000 services: 31 s at 32 at once), so
each host's first endpoint is asked first, and a host that did not answer it within the timeout has its
other endpoints taken as not live without being asked: one such host costs the command 1 s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from skyserve_lite.api import ServiceView
    from skyserve_lite.controller.fleet import ControllerView
    from skyserve_lite.endpoint_identity import EndpointIdentity

# Endpoints asked at once, and how long each may take: as ``api.check_endpoints`` asks a service's own.
ASKED_AT_ONCE = 32
ASK_TIMEOUT_SECONDS = 1.0


@dataclass(frozen=True)
class EndpointView:
    """One endpoint of a service: ``url`` (a host's address at the service's port), ``live`` (it answered as
    this service of this state during this status) and ``controller_live`` (its host's controller renewed
    its row within the lease TTL)."""

    url: str
    live: bool
    controller_live: bool

    def to_json(self) -> dict[str, object]:
        return {"url": self.url, "live": self.live, "controller_live": self.controller_live}


Ask = Callable[[str], "EndpointIdentity | str"]


def is_unreachable(answer: EndpointIdentity | str) -> bool:
    """True for an answer saying the endpoint's host sent nothing back within the timeout (``TimeoutError``:
    packets dropped, a host gone), as opposed to one that refused the connection at once or answered."""
    from skyserve_lite.endpoint_identity import TimedOut

    return isinstance(answer, TimedOut)


def find_first_asks(urls: Iterable[str]) -> dict[str, str]:
    """Each host's first endpoint among ``urls``, by host: asked before the others of its host."""
    first: dict[str, str] = {}
    for url in urls:
        first.setdefault(urlsplit(url).hostname or "", url)
    return first


def ask_endpoints(urls: Sequence[str], ask: Ask) -> dict[str, EndpointIdentity | str]:
    """Every url of ``urls`` asked (``ASKED_AT_ONCE`` at a time), each host's first one first; the urls of
    a host whose first did not answer within the timeout get that host's answer without being asked."""
    from concurrent.futures import ThreadPoolExecutor

    if not urls:
        return {}
    first = find_first_asks(urls)
    with ThreadPoolExecutor(max_workers=min(ASKED_AT_ONCE, len(urls))) as pool:
        answers = dict(zip(first.values(), pool.map(ask, first.values()), strict=True))
        gone = {host for host, url in first.items() if is_unreachable(answers[url])}
        rest = [url for url in dict.fromkeys(urls) if url not in answers and urlsplit(url).hostname not in gone]
        answers.update(zip(rest, pool.map(ask, rest), strict=True))
    for url in urls:
        if url not in answers:
            answers[url] = answers[first[urlsplit(url).hostname or ""]]
    return answers


def check_host_endpoints(views: Sequence[ServiceView], controllers: Sequence[ControllerView],
                         ask: Ask | None = None) -> list[ServiceView]:
    """``views`` with ``endpoints`` set: each service's endpoint on every host (``find_endpoints``), live
    when it answered as that service of the view's controller id. ``ask`` defaults to
    ``endpoint_identity.read_endpoint_identity`` with a 1 s timeout.

    Without any controller row (none has ever run on this database) nothing is asked: load balancers are
    started by controllers only, so none can answer; and the status then loads no HTTP client (nor ssl,
    which ``http.client`` imports)."""
    from skyserve_lite.controller.fleet import find_endpoints

    found = {view.service.name: find_endpoints(view.service.endpoint, view.service.lb_port, controllers)
             for view in views}
    if not controllers:
        return [dataclasses.replace(view, endpoints=tuple(
            EndpointView(url, False, controller_live) for url, controller_live in found[view.service.name]))
            for view in views]
    from skyserve_lite.endpoint_identity import find_identity_problem, read_endpoint_identity

    answers = ask_endpoints([url for endpoints in found.values() for url, _ in endpoints],
                            ask or (lambda url: read_endpoint_identity(url, timeout_seconds=ASK_TIMEOUT_SECONDS)))
    return [dataclasses.replace(view, endpoints=tuple(
        EndpointView(url, find_identity_problem(answers[url], view.service.name, view.controller_id, url) is None,
                     controller_live) for url, controller_live in found[view.service.name])) for view in views]


def find_endpoint_views(views: Sequence[ServiceView], controllers: Sequence[ControllerView]
                        ) -> Mapping[str, tuple[EndpointView, ...]]:
    """Each view's ``endpoints``; for a view without (from a controller host of an older sky-lite, which
    does not ask them), its endpoints as ``find_endpoints`` lists them, live as their host's controller."""
    from skyserve_lite.controller.fleet import find_endpoints

    return {view.service.name: view.endpoints or tuple(
        EndpointView(url, up, up) for url, up in find_endpoints(view.service.endpoint, view.service.lb_port,
                                                                  controllers)) for view in views}
