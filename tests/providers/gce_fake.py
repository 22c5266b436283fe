"""A fake of the Compute Engine REST API on 127.0.0.1, for the GCP provider's tests.

Stateful and small: the endpoints the provider calls (instances bulkInsert/aggregatedList/get/delete and
the serial port, zone operations get/wait, zones list, firewalls get/insert; Cloud Storage's buckets
and objects, multipart and resumable uploads included, for staged snapshots; Secret Manager's secrets
create/list/delete, versions add/list/access and setIamPolicy, for the tasks' secrets), answered the way
Compute Engine answers them (JSON shapes, pagination with ``pageToken``, operations with ``httpErrorStatusCode``
and ``error.errors[].code`` on failure). The provider is pointed at it with an ``api_endpoint`` and
anonymous credentials (or, in another process, a service account key whose token exchange goes to the fake's
``/token``: ``write_service_account_key``) and does not know it is a fake.

Hooks for what a test needs to happen: ``stockout`` (zones with no capacity: bulkInsert's operation fails
with ZONE_RESOURCE_POOL_EXHAUSTED), ``quota`` (QUOTA_EXCEEDED), ``fail_next`` (an HTTP error for the next
calls of a method: 429, 403, 400), ``preempt`` (a spot VM taken back, with the zone operation
``compute.instances.preempted``), ``lag`` (instances a listing does not show yet). ``calls`` counts every
request by method name (``instances.bulkInsert``, ``instances.aggregatedList``, ...).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.providers.gcp_iam_fake import FakeIam

PROJECT_ZONES = {"us-central1": ("us-central1-a", "us-central1-b", "us-central1-c"),
                 "europe-west1": ("europe-west1-b", "europe-west1-c", "europe-west1-d")}
_PREFIX = "/compute/v1/projects/"
TOKEN_PATH = "/token"


@dataclass
class Failure:
    status: int
    reason: str
    message: str
    times: int = 1


@dataclass
class FakeSecret:
    """A Secret Manager secret: its labels, its versions' payloads (version n is ``payloads[n - 1]``) and its
    IAM policy's bindings."""

    labels: dict[str, str]
    payloads: list[bytes] = field(default_factory=list)
    bindings: list[dict[str, Any]] = field(default_factory=list)

    def readers(self) -> list[str]:
        """The members the secret's policy lets read its value."""
        return [m for b in self.bindings if b.get("role") == "roles/secretmanager.secretAccessor"
                for m in b.get("members", [])]


@dataclass
class FakeCompute:
    page_size: int = 500
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (zone, name) -> resource
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[str, dict[str, Any]] = field(default_factory=dict)
    buckets: dict[str, dict[str, bytes]] = field(default_factory=dict)  # Cloud Storage: bucket -> key -> bytes
    uploads: dict[str, tuple[str, str, bytearray]] = field(default_factory=dict)  # resumable: id -> bucket, key
    secrets: dict[str, FakeSecret] = field(default_factory=dict)  # Secret Manager: secret id -> secret
    calls: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (method, body) of each write
    stockout: set[str] = field(default_factory=set)
    quota: set[str] = field(default_factory=set)
    lag: set[str] = field(default_factory=set)  # instance names listings leave out
    fail_next: dict[str, list[Failure]] = field(default_factory=dict)
    iam: FakeIam = field(default_factory=FakeIam)  # a controller VM's service account and its roles
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- hooks ----------------------------------------------------------------------------------------------
    def fail(self, method: str, status: int, reason: str, message: str = "injected", times: int = 1) -> None:
        self.fail_next.setdefault(method, []).append(Failure(status, reason, message, times))

    def preempt(self, zone: str, name: str) -> None:
        """Take a spot VM back the way GCE does with instanceTerminationAction DELETE: the instance goes
        away and a ``compute.instances.preempted`` operation is left in its zone."""
        with self._lock:
            instance = self.instances.pop((zone, name))
            operation = self._operation(zone, "compute.instances.preempted", instance["selfLink"], done=True)
            operation["insertTime"] = "2026-12-01T12:30:00.000-08:00"

    def set_status(self, zone: str, name: str, status: str) -> None:
        self.instances[(zone, name)]["status"] = status

    # --- Cloud Storage (JSON API) ------------------------------------------------------------------------------
    def storage(self, verb: str, path: str, query: dict[str, str], raw: bytes, content_type: str,
                endpoint: str) -> tuple[int, Any, dict[str, str]]:
        """The Cloud Storage calls the stager makes: buckets insert/delete, objects list/insert (multipart and
        resumable)/get/delete. Counted as ``storage.<method>``."""
        with self._lock:
            return self._storage(verb, path, query, raw, content_type, endpoint)

    def _storage(self, verb: str, path: str, query: dict[str, str], raw: bytes, content_type: str,
                 endpoint: str) -> tuple[int, Any, dict[str, str]]:
        parts = path.strip("/").split("/")
        if path == "/storage/v1/b" and verb == "POST":
            self.calls["storage.buckets.insert"] += 1
            name = json.loads(raw)["name"]
            if name in self.buckets:
                return 409, _error(409, "conflict", f"The bucket {name} already exists"), {}
            self.buckets[name] = {}
            return 200, {"kind": "storage#bucket", "name": name, "id": name}, {}
        if parts[:3] == ["upload", "storage", "v1"] and verb in ("POST", "PUT"):
            bucket = parts[4]
            if bucket not in self.buckets:
                return 404, _error(404, "notFound", f"no bucket {bucket}"), {}
            kind = query.get("uploadType")
            if kind == "multipart":
                self.calls["storage.objects.insert"] += 1
                metadata, data = _parse_multipart(raw, content_type)
                self.buckets[bucket][metadata["name"]] = data
                return 200, _object(bucket, metadata["name"], data), {}
            if kind == "resumable" and "upload_id" not in query:
                self.calls["storage.objects.insert"] += 1
                upload_id = str(next(self._ids))
                name = query.get("name") or json.loads(raw or b"{}").get("name")
                self.uploads[upload_id] = (bucket, str(name), bytearray())
                location = f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload_id}"
                return 200, {}, {"Location": location}
            if kind == "resumable":
                bucket, name, received = self.uploads[query["upload_id"]]
                received += raw
                self.buckets[bucket][name] = bytes(received)
                return 200, _object(bucket, name, bytes(received)), {}
        if parts[:3] == ["storage", "v1", "b"] and len(parts) >= 4:
            bucket = parts[3]
            objects = self.buckets.get(bucket)
            if objects is None:
                return 404, _error(404, "notFound", f"no bucket {bucket}"), {}
            if len(parts) == 4 and verb == "DELETE":
                self.calls["storage.buckets.delete"] += 1
                if objects:
                    return 409, _error(409, "conflict", "The bucket you tried to delete is not empty"), {}
                del self.buckets[bucket]
                return 204, None, {}
            if len(parts) == 5 and verb == "GET":
                self.calls["storage.objects.list"] += 1
                keys = sorted(k for k in objects if k.startswith(query.get("prefix", "")))
                start = int(query.get("pageToken") or 0)
                size = int(query.get("maxResults") or 1000)
                answer: dict[str, Any] = {"kind": "storage#objects",
                                          "items": [_object(bucket, k, objects[k]) for k in keys[start:start + size]]}
                if start + size < len(keys):
                    answer["nextPageToken"] = str(start + size)
                return 200, answer, {}
            if len(parts) >= 6:
                key = urllib.parse.unquote("/".join(parts[5:]))
                if key not in objects:
                    return 404, _error(404, "notFound", f"no object {key}"), {}
                if verb == "DELETE":
                    self.calls["storage.objects.delete"] += 1
                    del objects[key]
                    return 204, None, {}
                return 200, objects[key] if query.get("alt") == "media" else _object(bucket, key, objects[key]), {}
        return 404, _error(404, "notFound", f"no such storage endpoint: {verb} {path}"), {}

    # --- Secret Manager (REST v1) ---------------------------------------------------------------------------
    def secret_manager(self, verb: str, path: str, query: dict[str, str], body: dict[str, Any]
                       ) -> tuple[int, Any]:
        """The Secret Manager calls the provider makes, and ``access`` (what ``gcloud secrets versions access``
        calls on an instance). Counted as ``secrets.<method>``; ``fail`` applies by that name."""
        route = _secret_route(verb, path)
        if route is None:
            return 404, _error(404, "notFound", f"no such Secret Manager endpoint: {verb} {path}")
        method, args = route
        with self._lock:
            self.calls[method] += 1
            if verb != "GET":
                self.requests.append((method, body))
            pending = self.fail_next.get(method)
            if pending:
                failure = pending[0]
                failure.times -= 1
                if failure.times <= 0:
                    pending.pop(0)
                return failure.status, _error(failure.status, failure.reason, failure.message)
            project, secret_id = args["project"], args.get("id", "")
            if method == "secrets.create":
                secret_id = query.get("secretId", "")
                if secret_id in self.secrets:
                    return 409, _error(409, "alreadyExists", f"Secret [projects/{project}/secrets/{secret_id}] "
                                                             "already exists.")
                self.secrets[secret_id] = FakeSecret(labels=dict(body.get("labels", {})))
                return 200, _secret(project, secret_id, self.secrets[secret_id])
            if method == "secrets.list":
                wanted = _parse_label_filter(query.get("filter", ""))
                names = sorted(name for name, secret in self.secrets.items()
                               if all(secret.labels.get(k) == v for k, v in wanted.items()))
                start = int(query.get("pageToken") or 0)
                size = int(query.get("pageSize") or 25000)
                answer: dict[str, Any] = {"secrets": [_secret(project, name, self.secrets[name])
                                                      for name in names[start:start + size]]}
                if start + size < len(names):
                    answer["nextPageToken"] = str(start + size)
                return 200, answer
            secret = self.secrets.get(secret_id)
            if secret is None:
                return 404, _error(404, "notFound", f"Secret [projects/{project}/secrets/{secret_id}] not found.")
            return self._secret_call(method, f"projects/{project}/secrets/{secret_id}", secret, args, body)

    def _secret_call(self, method: str, name: str, secret: FakeSecret, args: dict[str, str],
                     body: dict[str, Any]) -> tuple[int, Any]:
        if method == "secrets.delete":
            del self.secrets[args["id"]]
            return 200, {}
        if method == "secrets.versions.list":
            return 200, {"versions": [{"name": f"{name}/versions/{n}", "state": "ENABLED"}
                                      for n in range(1, len(secret.payloads) + 1)]}
        if method == "secrets.addVersion":
            secret.payloads.append(base64.b64decode(body["payload"]["data"]))
            return 200, {"name": f"{name}/versions/{len(secret.payloads)}", "state": "ENABLED"}
        if method == "secrets.setIamPolicy":
            secret.bindings = list(body["policy"].get("bindings", []))
            return 200, {"version": 1, "bindings": secret.bindings, "etag": "BwY="}
        version = args["version"]
        number = len(secret.payloads) if version == "latest" else int(version)
        if not 1 <= number <= len(secret.payloads):
            return 404, _error(404, "notFound", f"{name} has no version {version}")
        return 200, {"name": f"{name}/versions/{number}",
                     "payload": {"data": base64.b64encode(secret.payloads[number - 1]).decode()}}

    # --- the API --------------------------------------------------------------------------------------------
    def handle(self, verb: str, path: str, query: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
        route = _route(verb, path)
        if route is None:
            return 404, _error(404, "notFound", f"no such endpoint: {verb} {path}")
        method, args = route
        with self._lock:
            self.calls[method] += 1
            if verb != "GET":
                self.requests.append((method, body))
            pending = self.fail_next.get(method)
            if pending:
                failure = pending[0]
                failure.times -= 1
                if failure.times <= 0:
                    pending.pop(0)
                return failure.status, _error(failure.status, failure.reason, failure.message)
            return getattr(self, "_" + method.replace(".", "_"))(query, body, **args)  # type: ignore[no-any-return]

    def _instances_bulkInsert(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str
                              ) -> tuple[int, Any]:
        properties = body.get("instanceProperties", {})
        names = list(body.get("perInstanceProperties", {}))
        count = int(body.get("count", len(names)))
        target = f"{_link(project, zone)}/instances"
        spot = properties.get("scheduling", {}).get("provisioningModel") == "SPOT"
        if zone in self.stockout:
            return 200, self._operation(zone, "bulkInsert", target, done=True, error=(
                503, "ZONE_RESOURCE_POOL_EXHAUSTED" if not spot else "STOCKOUT",
                f"The zone '{zone}' does not have enough resources available to fulfill the request."))
        if zone in self.quota:
            return 200, self._operation(zone, "bulkInsert", target, done=True, error=(
                403, "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded. Limit: 8.0 in region."))
        if len(names) != count:
            return 400, _error(400, "invalid", "perInstanceProperties must name every instance")
        for name in names:
            if (zone, name) in self.instances:
                continue  # bulkInsert is idempotent by name: an existing instance is left as it is
            self.instances[(zone, name)] = self._new_instance(project, zone, name, properties)
        return 200, self._operation(zone, "bulkInsert", target, done=True)

    def _instances_insert(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str
                          ) -> tuple[int, Any]:
        name = body["name"]
        target = f"{_link(project, zone)}/instances/{name}"
        if (zone, name) not in self.instances:
            self.instances[(zone, name)] = self._new_instance(project, zone, name, body)
        return 200, self._operation(zone, "insert", target, done=True)

    def _new_instance(self, project: str, zone: str, name: str, properties: dict[str, Any]) -> dict[str, Any]:
        """A RUNNING instance made from ``properties`` (bulkInsert's instanceProperties, or insert's body), with
        a private address, and a public one when it asks for an access config (never contacted)."""
        number = len(self.instances) % 250 + 2
        interface: dict[str, Any] = {"networkIP": f"10.128.0.{number}"}
        if any(i.get("accessConfigs") for i in properties.get("networkInterfaces", [])):
            interface["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "natIP": f"203.0.113.{number}"}]
        return {"kind": "compute#instance", "id": str(next(self._ids)), "name": name, "zone": _link(project, zone),
                "selfLink": f"{_link(project, zone)}/instances/{name}", "status": "RUNNING",
                "machineType": properties.get("machineType", ""), "labels": dict(properties.get("labels", {})),
                "scheduling": properties.get("scheduling", {}), "metadata": properties.get("metadata", {}),
                "networkInterfaces": [interface], "tags": properties.get("tags", {}),
                "disks": properties.get("disks", []), "serviceAccounts": properties.get("serviceAccounts", []),
                "creationTimestamp": "2026-12-01T12:00:00.000-08:00"}

    def _firewalls_delete(self, query: dict[str, str], body: dict[str, Any], project: str, name: str
                          ) -> tuple[int, Any]:
        if self.firewalls.pop(name, None) is None:
            return 404, _error(404, "notFound", f"The resource '{name}' was not found")
        return 200, self._operation(None, "delete", f"{_PREFIX}{project}/global/firewalls/{name}", done=True)

    def _instances_aggregatedList(self, query: dict[str, str], body: dict[str, Any], project: str
                                  ) -> tuple[int, Any]:
        wanted = _parse_label_filter(query.get("filter", ""))
        matching = sorted((key for key, i in self.instances.items()
                           if i["name"] not in self.lag and all(i["labels"].get(k) == v for k, v in wanted.items())))
        start = int(query.get("pageToken") or 0)
        size = min(int(query.get("maxResults") or self.page_size), self.page_size)
        page = matching[start:start + size]
        items: dict[str, Any] = {}
        for zone, name in page:
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(self.instances[(zone, name)])
        answer: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": items}
        if start + size < len(matching):
            answer["nextPageToken"] = str(start + size)
        return 200, answer

    def _instances_get(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str, name: str
                       ) -> tuple[int, Any]:
        instance = self.instances.get((zone, name))
        if instance is None or name in self.lag:
            return 404, _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                                                "was not found")
        return 200, instance

    def _instances_delete(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str, name: str
                          ) -> tuple[int, Any]:
        instance = self.instances.pop((zone, name), None)
        if instance is None:
            return 404, _error(404, "notFound", f"The resource '{name}' was not found")
        return 200, self._operation(zone, "delete", instance["selfLink"], done=True)

    def _instances_getSerialPortOutput(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str,
                                       name: str) -> tuple[int, Any]:
        if (zone, name) not in self.instances:
            return 404, _error(404, "notFound", f"The resource '{name}' was not found")
        return 200, {"kind": "compute#serialPortOutput", "contents": f"serial console of {name}\n", "next": "1"}

    def _zoneOperations_get(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str, name: str
                            ) -> tuple[int, Any]:
        operation = self.operations.get(name)
        return (200, operation) if operation else (404, _error(404, "notFound", f"no operation {name}"))

    _zoneOperations_wait = _zoneOperations_get

    def _zoneOperations_list(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str
                             ) -> tuple[int, Any]:
        wanted = re.findall(r'operationType\s*=\s*"?([\w.]+)"?', query.get("filter", ""))
        items = [o for o in self.operations.values() if o.get("zone", "").endswith(f"/{zone}")
                 and (not wanted or o["operationType"] in wanted)]
        return 200, {"kind": "compute#operationList", "items": items}

    def _zones_list(self, query: dict[str, str], body: dict[str, Any], project: str) -> tuple[int, Any]:
        items = [{"name": zone, "region": f"{_PREFIX}{project}/regions/{region}", "status": "UP"}
                 for region, zones in PROJECT_ZONES.items() for zone in zones]
        match = re.search(r'region\s*=\s*"?([^"\s)]+)"?', query.get("filter", ""))
        if match:
            items = [z for z in items if z["region"].endswith("/" + match.group(1).rsplit("/", 1)[-1])]
        return 200, {"kind": "compute#zoneList", "items": items}

    def _firewalls_get(self, query: dict[str, str], body: dict[str, Any], project: str, name: str
                       ) -> tuple[int, Any]:
        found = self.firewalls.get(name)
        return (200, found) if found else (404, _error(404, "notFound", f"The resource '{name}' was not found"))

    def _firewalls_insert(self, query: dict[str, str], body: dict[str, Any], project: str) -> tuple[int, Any]:
        name = body["name"]
        if name in self.firewalls:
            return 409, _error(409, "alreadyExists", f"The resource '{name}' already exists")
        self.firewalls[name] = dict(body, selfLink=f"{_PREFIX}{project}/global/firewalls/{name}")
        return 200, self._operation(None, "insert", self.firewalls[name]["selfLink"], done=True)

    def _globalOperations_get(self, query: dict[str, str], body: dict[str, Any], project: str, name: str
                              ) -> tuple[int, Any]:
        return self._zoneOperations_get(query, body, project, "", name)

    _globalOperations_wait = _globalOperations_get

    def _operation(self, zone: str | None, kind: str, target: str, done: bool,
                   error: tuple[int, str, str] | None = None) -> dict[str, Any]:
        number = next(self._ids)
        name = f"operation-{number}"
        where = f"{_PREFIX}p/zones/{zone}" if zone else f"{_PREFIX}p/global"
        operation: dict[str, Any] = {"kind": "compute#operation", "id": str(number), "name": name,
                                     "operationType": kind, "targetLink": target,
                                     "status": "DONE" if done else "RUNNING", "progress": 100,
                                     "selfLink": f"{where}/operations/{name}"}
        if zone:
            operation["zone"] = f"{_PREFIX}p/zones/{zone}"
        if error is not None:
            status, code, message = error
            operation |= {"httpErrorStatusCode": status, "httpErrorMessage": message,
                          "error": {"errors": [{"code": code, "message": message}]}}
        self.operations[name] = operation
        return operation


_ROUTES = [
    ("POST", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/bulkInsert", "instances.bulkInsert"),
    ("GET", r"(?P<project>[^/]+)/aggregated/instances", "instances.aggregatedList"),
    ("POST", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances", "instances.insert"),
    ("DELETE", r"(?P<project>[^/]+)/global/firewalls/(?P<name>[^/]+)", "firewalls.delete"),
    ("GET", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/serialPort",
     "instances.getSerialPortOutput"),
    ("GET", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "instances.get"),
    ("DELETE", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "instances.delete"),
    ("GET", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/operations/(?P<name>[^/]+)", "zoneOperations.get"),
    ("POST", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/operations/(?P<name>[^/]+)/wait", "zoneOperations.wait"),
    ("GET", r"(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/operations", "zoneOperations.list"),
    ("GET", r"(?P<project>[^/]+)/zones", "zones.list"),
    ("GET", r"(?P<project>[^/]+)/global/firewalls/(?P<name>[^/]+)", "firewalls.get"),
    ("POST", r"(?P<project>[^/]+)/global/firewalls", "firewalls.insert"),
    ("GET", r"(?P<project>[^/]+)/global/operations/(?P<name>[^/]+)", "globalOperations.get"),
    ("POST", r"(?P<project>[^/]+)/global/operations/(?P<name>[^/]+)/wait", "globalOperations.wait"),
]


_SECRET_ROUTES = [
    ("POST", r"", "secrets.create"),
    ("GET", r"", "secrets.list"),
    ("DELETE", r"/(?P<id>[^/:]+)", "secrets.delete"),
    ("GET", r"/(?P<id>[^/:]+)/versions", "secrets.versions.list"),
    ("POST", r"/(?P<id>[^/:]+):addVersion", "secrets.addVersion"),
    ("POST", r"/(?P<id>[^/:]+):setIamPolicy", "secrets.setIamPolicy"),
    ("GET", r"/(?P<id>[^/:]+)/versions/(?P<version>[^/:]+):access", "secrets.versions.access"),
]


def _secret_route(verb: str, path: str) -> tuple[str, dict[str, str]] | None:
    for route_verb, pattern, method in _SECRET_ROUTES:
        match = re.fullmatch(r"/v1/projects/(?P<project>[^/]+)/secrets" + pattern, path)
        if route_verb == verb and match:
            return method, match.groupdict()
    return None


def _route(verb: str, path: str) -> tuple[str, dict[str, str]] | None:
    if not path.startswith(_PREFIX):
        return None
    rest = path[len(_PREFIX):]
    for route_verb, pattern, method in _ROUTES:
        match = re.fullmatch(pattern, rest)
        if route_verb == verb and match:
            return method, match.groupdict()
    return None


def _secret(project: str, secret_id: str, secret: FakeSecret) -> dict[str, Any]:
    return {"name": f"projects/{project}/secrets/{secret_id}", "labels": secret.labels,
            "replication": {"automatic": {}}, "createTime": "2026-12-01T12:00:00Z"}


def _object(bucket: str, key: str, data: bytes) -> dict[str, Any]:
    return {"kind": "storage#object", "bucket": bucket, "name": key, "size": str(len(data)), "id": f"{bucket}/{key}"}


def _parse_multipart(raw: bytes, content_type: str) -> tuple[dict[str, Any], bytes]:
    """The metadata and the media of a ``multipart/related`` upload."""
    boundary = content_type.split("boundary=", 1)[1].strip('"').encode()
    parts = [p for p in raw.split(b"--" + boundary) if p.strip() not in (b"", b"--")]
    documents = [p.split(b"\r\n\r\n", 1)[1].removesuffix(b"\r\n") for p in parts]
    return json.loads(documents[0]), documents[1]


def _parse_label_filter(text: str) -> dict[str, str]:
    return dict(re.findall(r'labels\.([\w-]+)\s*=\s*"?([\w-]*)"?', text))


def _link(project: str, zone: str) -> str:
    return f"https://www.googleapis.com{_PREFIX}{project}/zones/{zone}"


def _error(status: int, reason: str, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}}


@contextmanager
def serve_fake_compute(fake: FakeCompute | None = None) -> Iterator[tuple[FakeCompute, str]]:
    """Run ``fake`` on a free 127.0.0.1 port; yield it and its endpoint (``http://127.0.0.1:PORT``)."""
    state = fake or FakeCompute()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, verb: str) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parsed.query))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers: dict[str, str] = {}
            if parsed.path == TOKEN_PATH:  # google-auth's token exchange for a service account key
                state.calls["oauth2.token"] += 1
                status, answer = 200, {"access_token": "fake-token", "expires_in": 3600, "token_type": "Bearer"}
            elif (iam := state.iam.answer(verb, parsed.path, raw)) is not None:
                status, answer = iam
            elif parsed.path.startswith(("/storage/", "/upload/storage/")):
                status, answer, headers = state.storage(verb, parsed.path, query, raw,
                                                        self.headers.get("Content-Type", ""), endpoint)
            elif _secret_route(verb, urllib.parse.unquote(parsed.path)) is not None:
                status, answer = state.secret_manager(verb, urllib.parse.unquote(parsed.path), query,
                                                      json.loads(raw) if raw.strip() else {})
            else:
                body = json.loads(raw) if raw.strip() else {}
                status, answer = state.handle(verb, urllib.parse.unquote(parsed.path), query, body)
            data = answer if isinstance(answer, bytes) else b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream" if isinstance(answer, bytes)
                             else "application/json")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def do_DELETE(self) -> None:
            self._answer("DELETE")

        def do_PUT(self) -> None:
            self._answer("PUT")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state, endpoint
    finally:
        server.shutdown()
        server.server_close()


def write_service_account_key(path: Path, endpoint: str, project: str = "p") -> Path:
    """A service account key file whose token exchange goes to the fake (``token_uri``): what
    ``GOOGLE_APPLICATION_CREDENTIALS`` names for a controller in another process. The RSA key is made here."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({"type": "service_account", "project_id": project, "private_key_id": "1",
                                "private_key": pem, "client_email": f"sky-lite@{project}.iam.gserviceaccount.com",
                                "client_id": "1", "token_uri": f"{endpoint}{TOKEN_PATH}"}))
    path.chmod(0o600)
    return path
