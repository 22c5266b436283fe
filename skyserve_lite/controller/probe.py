"""Readiness probes: GET the path (POST ``post_data`` as JSON when given); only HTTP 200 is ready.

Every probe says who it is, ``User-Agent: sky-lite-probe/VERSION`` (unless the task's probe ``headers`` set
one), so a workload can leave probes, one every pass (2 s) per replica, out of its access log.

A probe that refers to a task's secret (``Authorization: Bearer $API_KEY``) keeps the reference everywhere it
is stored or shown; its value is read from the secret store and filled in here, into the request alone
(``fill_probe_secrets``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from skyserve_lite import __version__
from skyserve_lite.controller.plan import ProbeTarget, ReplicaKey
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.errors import StateConflictError
from skyserve_lite.spec.inputs import fill_json_strings
from skyserve_lite.spec.model import ReadinessProbe
from skyserve_lite.spec.parse import REFERENCE_RE

# Reads a secret's value by its digest (``SecretStore.get``); raises ``StateConflictError`` when it is gone.
SecretReader = Callable[[str], str]

PROBE_USER_AGENT = f"sky-lite-probe/{__version__}"


class Prober(Protocol):
    def probe(self, targets: Sequence[ProbeTarget]) -> dict[ReplicaKey, ProbeResult]:
        """Probe every target (concurrently); one result per target, never raises for a failed probe."""
        ...


class HttpProber:
    """Probes over HTTP with aiohttp, all targets of a pass at once. ``read_secret`` gives the values of the
    secrets a probe refers to; without it such a probe fails, saying which secret it lacks."""

    def __init__(self, read_secret: SecretReader | None = None) -> None:
        self._read_secret = read_secret if read_secret is None else self._cached(read_secret)

    @staticmethod
    def _cached(read_secret: SecretReader) -> SecretReader:
        """``read_secret`` read once per digest: a digest names one value for good (the store's names are
        digests of the values), and a probe goes every pass to every replica that needs it."""
        values: dict[str, str] = {}

        def read(digest: str) -> str:
            if digest not in values:
                values[digest] = read_secret(digest)
            return values[digest]

        return read

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[ReplicaKey, ProbeResult]:
        if not targets:
            return {}
        return asyncio.run(self._probe_all(targets))

    async def _probe_all(self, targets: Sequence[ProbeTarget]) -> dict[ReplicaKey, ProbeResult]:
        import aiohttp  # imported here: `sky-lite --help` and the CLI must not pay for it

        connector = aiohttp.TCPConnector(limit=64, force_close=True)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            results = await asyncio.gather(*(self._probe_one(session, t) for t in targets))
        return {(t.service, t.replica_id): r for t, r in zip(targets, results, strict=True)}

    async def _probe_one(self, session: object, target: ProbeTarget) -> ProbeResult:
        import aiohttp

        assert isinstance(session, aiohttp.ClientSession)
        try:
            values = read_probe_secrets(target.probe, self._read_secret)
            probe = fill_probe_secrets(target.probe, values)
        except StateConflictError as exc:
            return ProbeResult(ok=False, detail=str(exc))
        result = await self._send(session, target.url, probe)
        detail = result.detail
        for value in values.values():  # a failure's detail is stored and shown: no secret value in it
            detail = detail.replace(value, "<redacted>") if value else detail
        return result if detail == result.detail else ProbeResult(ok=result.ok, detail=detail)

    async def _send(self, session: object, replica_url: str, probe: ReadinessProbe) -> ProbeResult:
        import aiohttp

        assert isinstance(session, aiohttp.ClientSession)
        url = replica_url.rstrip("/") + probe.path
        headers = compute_probe_headers(probe)
        timeout = aiohttp.ClientTimeout(total=probe.timeout_seconds)
        method = "GET"
        data: bytes | None = None
        if probe.post_data is not None:
            method, data = "POST", probe.post_data.encode()
        try:
            async with session.request(method, url, data=data, headers=headers, timeout=timeout,
                                       allow_redirects=False) as response:
                await response.read()
                return ProbeResult(ok=response.status == 200, detail=f"HTTP {response.status}")
        except asyncio.TimeoutError:
            return ProbeResult(ok=False, detail=f"timed out after {probe.timeout_seconds:g}s")
        except aiohttp.ClientConnectorError as exc:
            return ProbeResult(ok=False, detail=f"cannot connect: {exc.os_error.strerror or exc}")
        except aiohttp.ClientError as exc:
            return ProbeResult(ok=False, detail=f"{type(exc).__name__}: {exc}")


def read_probe_secrets(probe: ReadinessProbe, read_secret: SecretReader | None) -> dict[str, str]:
    """The values of the secrets ``probe`` refers to, by name. Raises ``StateConflictError`` (naming the
    secret, never a value) when one cannot be read."""
    values: dict[str, str] = {}
    for name, digest in probe.secrets:
        if read_secret is None:
            raise StateConflictError(f"the probe refers to the secret {name}, and this controller has no secret "
                                     "store")
        values[name] = read_secret(digest)
    return values


def fill_probe_secrets(probe: ReadinessProbe, values: Mapping[str, str]) -> ReadinessProbe:
    """``probe`` with the secrets' ``values`` filled into the strings of its ``post_data`` and its header
    values: what one request sends, never kept. Raises ``StateConflictError`` (naming the header, never a
    value) when a value cannot go where it is named."""
    if not values:
        return probe

    def fill(text: str) -> str:
        return REFERENCE_RE.sub(lambda m: values.get(m.group("braced") or m.group("bare"), m.group(0)), text)

    headers = tuple((name, fill(value)) for name, value in probe.headers)
    for name, value in headers:
        if any(char in value for char in "\r\n\0"):
            raise StateConflictError(f"the probe header {name} holds a line break or NUL once its secrets are "
                                     "filled in: not sent")
    post_data = probe.post_data
    if post_data is not None:
        post_data = json.dumps(fill_json_strings(json.loads(post_data), fill), sort_keys=True, separators=(",", ":"))
    return dataclasses.replace(probe, post_data=post_data, headers=headers)


def compute_probe_headers(probe: ReadinessProbe) -> dict[str, str]:
    """The headers of a probe request: the task's, plus ``User-Agent`` and (with ``post_data``)
    ``Content-Type: application/json`` where the task sets none of that name, whatever its case."""
    headers = dict(probe.headers)
    given = {key.lower() for key in headers}
    if "user-agent" not in given:
        headers["User-Agent"] = PROBE_USER_AGENT
    if probe.post_data is not None and "content-type" not in given:
        headers["Content-Type"] = "application/json"
    return headers


class FakeProber:
    """Answers from a table: ``results[(service, replica_id)]``; unlisted targets get ``default``."""

    def __init__(self, default: ProbeResult | None = None) -> None:
        self.default = default or ProbeResult(ok=True, detail="HTTP 200")
        self.results: dict[ReplicaKey, ProbeResult] = {}
        # The targets of the latest probes (the newest last). Bounded: a fake that kept every pass's 10,000
        # keys made the benchmark measure the garbage collector walking them.
        self.probed: deque[list[ReplicaKey]] = deque(maxlen=16)

    def set(self, results: Mapping[ReplicaKey, ProbeResult]) -> None:
        self.results.update(results)

    def probe(self, targets: Sequence[ProbeTarget]) -> dict[ReplicaKey, ProbeResult]:
        keys = [(t.service, t.replica_id) for t in targets]
        self.probed.append(keys)
        return {key: self.results.get(key, self.default) for key in keys}
