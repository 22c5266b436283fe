"""The HTTP prober against a real server on 127.0.0.1: only HTTP 200 counts, POST and headers pass."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from skyserve_lite import __version__
from skyserve_lite.controller.plan import ProbeTarget
from skyserve_lite.controller.probe import HttpProber, compute_probe_headers
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.procs import find_free_port
from skyserve_lite.spec.model import ReadinessProbe

SEEN: list[tuple[str, str, str, str]] = []
seen_agents: list[str] = []  # the User-Agent of each request, in order


async def handler(request: web.Request) -> web.Response:
    body = await request.text()
    SEEN.append((request.method, request.path, body, request.headers.get("Authorization", "")))
    seen_agents.append(request.headers.get("User-Agent", ""))
    if request.path == "/slow":
        await asyncio.sleep(2)
    if request.path == "/post-only":
        ok = request.method == "POST" and json.loads(body or "null") == {"prompt": "hi"}
        return web.Response(status=200 if ok else 405)
    if request.path == "/content-type":
        return web.Response(status=200 if request.headers.get("Content-Type") == "text/x-probe" else 415)
    if request.path == "/auth":
        return web.Response(status=200 if request.headers.get("Authorization") == "Bearer t" else 401)
    status = {"/ok": 200, "/unavailable": 503, "/redirect": 302, "/created": 201}.get(request.path, 404)
    return web.Response(status=status)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = find_free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(web.Application())
    runner.app.router.add_route("*", "/{tail:.*}", handler)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def probe(url: str, **fields: object) -> tuple[bool, str]:
    target = ProbeTarget("svc", 1, url, ReadinessProbe(**fields))  # type: ignore[arg-type]
    result = HttpProber().probe([target])[("svc", 1)]
    return result.ok, result.detail


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"path": "/ok"}, (True, "HTTP 200"), id="200-is-ready"),
        pytest.param({"path": "/unavailable"}, (False, "HTTP 503"), id="503-is-not"),
        pytest.param({"path": "/created"}, (False, "HTTP 201"), id="only-200-counts"),
        pytest.param({"path": "/redirect"}, (False, "HTTP 302"), id="redirects-not-followed"),
        pytest.param({"path": "/post-only", "post_data": '{"prompt":"hi"}'}, (True, "HTTP 200"),
                     id="post-data-sent-as-json"),
        pytest.param({"path": "/post-only"}, (False, "HTTP 405"), id="get-without-post-data"),
        pytest.param({"path": "/content-type", "post_data": "{}", "headers": (("content-type", "text/x-probe"),)},
                     (True, "HTTP 200"), id="own-content-type-kept-whatever-its-case"),
        pytest.param({"path": "/auth", "headers": (("Authorization", "Bearer t"),)}, (True, "HTTP 200"),
                     id="headers-sent"),
        pytest.param({"path": "/slow", "timeout_seconds": 0.3}, (False, "timed out after 0.3s"),
                     id="timeout"),
    ],
)
def test_probe_results(server: str, fields: dict[str, object], expected: tuple[bool, str]) -> None:
    assert probe(server, **fields) == expected


def test_refused_connection_is_not_ready() -> None:
    ok, detail = probe(f"http://127.0.0.1:{find_free_port()}", path="/")
    assert not ok
    assert detail.startswith("cannot connect")


def test_many_targets_are_probed_in_one_call(server: str) -> None:
    targets = [ProbeTarget("svc", i, server, ReadinessProbe(path="/ok" if i % 2 else "/unavailable"))
               for i in range(1, 21)]
    results = HttpProber().probe(targets)
    assert [results[("svc", i)].ok for i in range(1, 21)] == [bool(i % 2) for i in range(1, 21)]


@pytest.mark.parametrize(
    ("fields", "agent"),
    [
        pytest.param({"path": "/ok"}, f"sky-lite-probe/{__version__}", id="the-probe-says-who-it-is"),
        pytest.param({"path": "/ok", "post_data": "{}"}, f"sky-lite-probe/{__version__}", id="a-post-too"),
        pytest.param({"path": "/ok", "headers": (("user-agent", "my-checker/2"),)}, "my-checker/2",
                     id="the-tasks-own-kept-whatever-its-case"),
    ],
)
def test_probes_carry_a_user_agent_workloads_can_leave_out_of_their_logs(server: str, fields: dict[str, object],
                                                                         agent: str) -> None:
    seen_agents.clear()
    assert probe(server, **fields) == (True, "HTTP 200")
    assert seen_agents == [agent]


@pytest.mark.parametrize(
    ("fields", "headers"),
    [
        pytest.param({}, {"User-Agent": f"sky-lite-probe/{__version__}"}, id="get"),
        pytest.param({"post_data": "{}"}, {"User-Agent": f"sky-lite-probe/{__version__}",
                                           "Content-Type": "application/json"}, id="post"),
        pytest.param({"post_data": "{}", "headers": (("CONTENT-TYPE", "text/x"), ("User-Agent", "u"))},
                     {"CONTENT-TYPE": "text/x", "User-Agent": "u"}, id="the-tasks-own-win"),
        pytest.param({"headers": (("X-Token", "t"),)}, {"X-Token": "t", "User-Agent": f"sky-lite-probe/{__version__}"},
                     id="others-added-to"),
    ],
)
def test_compute_probe_headers(fields: dict[str, object], headers: dict[str, str]) -> None:
    assert compute_probe_headers(ReadinessProbe(**fields)) == headers  # type: ignore[arg-type]


def test_a_secret_reaches_the_request_only_and_never_a_failures_detail(server: str) -> None:
    written = ReadinessProbe(path="/auth", headers=(("Authorization", "Bearer $TOKEN"),),
                             secrets=(("TOKEN", "d1"),))
    target = ProbeTarget("svc", 1, server, written)
    assert HttpProber(read_secret={"d1": "t"}.__getitem__).probe([target])[("svc", 1)].ok
    assert SEEN[-1][3] == "Bearer t"
    wrong = HttpProber(read_secret={"d1": "nope"}.__getitem__).probe([target])[("svc", 1)]
    assert (wrong.ok, wrong.detail) == (False, "HTTP 401")
    # Without a secret store the probe is not sent, and says which secret it lacks (never a value).
    missing = HttpProber().probe([target])[("svc", 1)]
    assert not missing.ok and "refers to the secret TOKEN" in missing.detail
    assert written.headers == (("Authorization", "Bearer $TOKEN"),)  # the value never was kept


def test_a_secret_in_a_failures_detail_is_redacted() -> None:
    class EchoingProber(HttpProber):
        """A client library whose error repeats what it was asked to send (some do, for a bad header)."""

        async def _send(self, session: object, replica_url: str, probe: ReadinessProbe) -> ProbeResult:
            return ProbeResult(ok=False, detail=f"invalid header value {dict(probe.headers)['X-Key']!r}")

    written = ReadinessProbe(path="/", headers=(("X-Key", "key=$TOKEN"),), secrets=(("TOKEN", "d1"),))
    target = ProbeTarget("svc", 1, "http://127.0.0.1:9/", written)
    result = EchoingProber(read_secret=lambda digest: "s3cr3t").probe([target])[("svc", 1)]
    assert (result.ok, result.detail) == (False, "invalid header value 'key=<redacted>'")


@pytest.mark.parametrize(("value", "sent"), [
    pytest.param("abc", True, id="plain"),
    pytest.param("a\r\nX-Injected: 1", False, id="line-break"),
])
def test_a_secret_with_a_line_break_is_not_sent_as_a_header(value: str, sent: bool) -> None:
    from skyserve_lite.controller.probe import fill_probe_secrets
    from skyserve_lite.errors import StateConflictError

    written = ReadinessProbe(headers=(("X-Key", "k $T"),), post_data='{"k":"$T"}', secrets=(("T", "d"),))
    if sent:
        filled = fill_probe_secrets(written, {"T": value})
        assert filled.headers == (("X-Key", "k abc"),) and filled.post_data == '{"k":"abc"}'
        assert filled.path == written.path
    else:
        with pytest.raises(StateConflictError, match="X-Key holds a line break") as caught:
            fill_probe_secrets(written, {"T": value})
        assert value not in str(caught.value)


def test_a_secret_is_read_once_per_digest_however_many_probes(server: str) -> None:
    reads: list[str] = []

    def read(digest: str) -> str:
        reads.append(digest)
        return "t"

    written = ReadinessProbe(path="/auth", headers=(("Authorization", "Bearer $TOKEN"),), secrets=(("TOKEN", "d1"),))
    prober = HttpProber(read_secret=read)
    for _ in range(3):
        results = prober.probe([ProbeTarget("svc", 1, server, written), ProbeTarget("svc", 2, server, written)])
        assert all(result.ok for result in results.values())
    assert reads == ["d1"]
