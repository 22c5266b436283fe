"""A fake of Compute Engine's catalog listings on 127.0.0.1: ``machineTypes.aggregatedList`` and
``acceleratorTypes.aggregatedList``, answered in the API's JSON shapes (items keyed by ``zones/<zone>``,
camelCase fields, accelerator types' ``zone`` a URL as the real API gives it) and paginated with
``pageToken`` at ``page_size`` items a page, whatever ``maxResults`` asks. ``requests`` records each
request's path and query, so a test can see the pages were walked."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from skyserve_lite.catalog.build_gcp import GcpAcceleratorType, GcpMachineType

_PREFIX = "/compute/v1/projects/"


@dataclass
class FakeCatalogApi:
    machine_types: Sequence[GcpMachineType]
    accelerator_types: Sequence[GcpAcceleratorType]
    page_size: int = 200
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, Any]:
        self.requests.append((path, query))
        if not path.startswith(_PREFIX):
            return 404, _error(f"no such endpoint: {path}")
        project, _, listing = path[len(_PREFIX):].partition("/")
        if listing == "aggregated/machineTypes":
            items = [(m.zone, _machine_json(project, m)) for m in self.machine_types]
            return 200, self._page("compute#machineTypeAggregatedList", "machineTypes", items, query)
        if listing == "aggregated/acceleratorTypes":
            items = [(a.zone, _accelerator_json(project, a)) for a in self.accelerator_types]
            return 200, self._page("compute#acceleratorTypeAggregatedList", "acceleratorTypes", items, query)
        return 404, _error(f"no such endpoint: {path}")

    def _page(self, kind: str, key: str, items: list[tuple[str, dict[str, Any]]], query: dict[str, str]
              ) -> dict[str, Any]:
        start = int(query.get("pageToken") or 0)
        size = min(int(query.get("maxResults") or self.page_size), self.page_size)
        grouped: dict[str, Any] = {}
        for zone, item in items[start:start + size]:
            grouped.setdefault(f"zones/{zone}", {key: []})[key].append(item)
        answer: dict[str, Any] = {"kind": kind, "id": "projects/p/aggregated", "items": grouped}
        if start + size < len(items):
            answer["nextPageToken"] = str(start + size)
        return answer


def _machine_json(project: str, machine: GcpMachineType) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "compute#machineType", "name": machine.name, "zone": machine.zone, "guestCpus": machine.guest_cpus,
        "memoryMb": machine.memory_mb, "isSharedCpu": machine.is_shared_cpu, "architecture": machine.architecture,
        "selfLink": f"https://www.googleapis.com{_PREFIX}{project}/zones/{machine.zone}/machineTypes/{machine.name}",
    }
    if machine.accelerators:
        body["accelerators"] = [{"guestAcceleratorType": kind, "guestAcceleratorCount": count}
                                for kind, count in machine.accelerators]
    return body


def _accelerator_json(project: str, accelerator: GcpAcceleratorType) -> dict[str, Any]:
    zone_link = f"https://www.googleapis.com{_PREFIX}{project}/zones/{accelerator.zone}"
    return {"kind": "compute#acceleratorType", "name": accelerator.name, "zone": zone_link,
            "maximumCardsPerInstance": accelerator.maximum_cards_per_instance,
            "selfLink": f"{zone_link}/acceleratorTypes/{accelerator.name}"}


def _error(message: str) -> dict[str, Any]:
    return {"error": {"code": 404, "message": message, "errors": [{"reason": "notFound", "message": message}]}}


@contextmanager
def serve_catalog_api(api: FakeCatalogApi) -> Iterator[str]:
    """Run ``api`` on a free 127.0.0.1 port; yield its endpoint (``http://127.0.0.1:PORT``)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            status, answer = api.answer(parsed.path, dict(urllib.parse.parse_qsl(parsed.query)))
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
