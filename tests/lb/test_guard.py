"""The load balancer's guard: rate limit arithmetic, prefix matching, bucket keys, bounded memory, API keys in
constant time, the 401 and 429 answers, and where the keys come from (``lb.auth_keys``)."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

from skyserve_lite.api import bind_submission
from skyserve_lite.errors import StateConflictError
from skyserve_lite.lb.auth_keys import StoreGuardSource, read_guard_config
from skyserve_lite.lb.buckets import LocalBuckets
from skyserve_lite.lb.guard import (
    ALLOWED,
    ApiKeys,
    Guard,
    GuardAnswer,
    GuardConfig,
    Limited,
    RateLimiter,
    Unauthorized,
    check_auth,
    compute_answer,
    compute_client_key,
    compute_retry_after,
    normalize_path,
)
from skyserve_lite.spec.inputs import with_inputs
from skyserve_lite.spec.model import RateLimit, RateLimitKey, RateLimitKeyType, Secret, ServiceAuth, ServiceSpec
from skyserve_lite.spec.parse import parse_task, read_task
from skyserve_lite.state.models import ServiceRecord, VersionRecord
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store

OK = "ok"
KEY_1 = "sk-" + "1" * 29
KEY_2 = "sk-" + "2" * 29
NO_HEADERS: CIMultiDict[str] = CIMultiDict()


def run(limiter: RateLimiter, steps: Sequence[tuple[float, object]], path: str = "/v1/chat",
        ip: str = "203.0.113.7") -> None:
    """Send one request per step at its time; each expects ``OK`` or the ``Retry-After`` of a 429."""
    for number, (now, expected) in enumerate(steps, start=1):
        verdict = limiter.decide(path, ip, NO_HEADERS, now)
        got = OK if verdict is ALLOWED else verdict.retry_after_seconds if isinstance(verdict, Limited) else verdict
        assert got == expected, f"request {number} at t={now}: {got!r}, expected {expected!r}"


ARITHMETIC = [
    # rps 4 (one per 0.25 s), burst 9 (tolerance 9 * 0.25 = 2.25): 10 pass at t=0 (tat 0 -> 2.5); the 11th
    # would start at 2.5, 2.5 - 0 - 2.25 = 0.25 s too early: Retry-After 1. At t=0.25 one passes (tat 2.75),
    # the next waits 2.75 - 0.25 - 2.25 = 0.25 s again.
    pytest.param(4, 9, [(0.0, OK)] * 10 + [(0.0, 1), (0.25, OK), (0.25, 1)], id="dstack-example-rps4-burst9"),
    # rps 1, burst 0: one a second. At t=0.5 the wait is 0.5 s (1); at t=1 one passes; another at t=1
    # waits exactly 1.0 s: Retry-After 1, not 2.
    pytest.param(1, 0, [(0.0, OK), (0.5, 1), (1.0, OK), (1.0, 1)], id="one-a-second"),
    # rps 0.5: one per 2 s. At t=0 the wait is 2 s, at t=0.5 1.5 s (2), at t=1.9 0.1 s (1); t=2 passes.
    pytest.param(0.5, 0, [(0.0, OK), (0.0, 2), (0.5, 2), (1.9, 1), (2.0, OK)], id="half-a-second"),
    # dstack's slowest, one a minute: a second later there are 59 s to wait.
    pytest.param(1 / 60, 0, [(0.0, OK), (1.0, 59), (59.5, 1), (60.0, OK)], id="one-a-minute"),
    # rps 3: an interval of 0.333... that adds up to a hair more than 10/3 after ten requests; the slack keeps
    # the 10th (tat 3.0000000000000004 - 9/3 before it) from being refused by rounding.
    pytest.param(3, 9, [(0.0, OK)] * 10 + [(0.0, 1)], id="float-interval"),
    # A refused request uses nothing up: five refusals between 0 and 1 s, and t=1 still passes.
    pytest.param(1, 0, [(0.0, OK), *[(0.1 * n, 1) for n in range(1, 6)], (1.0, OK)], id="refusals-are-free"),
    # rps 1, burst 4: 5 at t=0 (tat 5). At t=2: 5 - 2 = 3 <= 4 passes (tat 6), 6 - 2 = 4 <= 4 passes (tat 7),
    # 7 - 2 - 4 = 1 s to wait.
    pytest.param(1, 4, [(0.0, OK)] * 5 + [(2.0, OK), (2.0, OK), (2.0, 1)], id="partial-refill"),
    # A client that waited long enough has its whole burst back: 3 at t=0, refused, 3 again at t=10.
    pytest.param(2, 2, [(0.0, OK)] * 3 + [(0.0, 1)] + [(10.0, OK)] * 3 + [(10.0, 1)], id="idle-refills"),
]


@pytest.mark.parametrize(("rps", "burst", "steps"), ARITHMETIC)
def test_bucket_arithmetic(rps: float, burst: int, steps: list[tuple[float, object]]) -> None:
    run(RateLimiter([RateLimit(rps=rps, burst=burst)]), steps)


@pytest.mark.parametrize(("wait", "seconds"), [
    (0.001, 1), (0.25, 1), (1.0, 1), (1.0000000001, 1), (1.001, 2), (1.5, 2), (2.0, 2), (59.0, 59), (0.0, 1),
])
def test_retry_after_is_whole_seconds_rounded_up(wait: float, seconds: int) -> None:
    assert compute_retry_after(wait) == seconds


@pytest.mark.parametrize(("target", "path"), [
    ("/v1/chat", "/v1/chat"),
    ("/v1/chat?stream=true&x=/y", "/v1/chat"),
    ("/v1/chat#frag", "/v1/chat"),
    ("/v1/chat/", "/v1/chat/"),
    ("//v1///chat", "/v1/chat"),
    ("/v1/%63hat", "/v1/chat"),
    ("/v1/./chat", "/v1/chat"),
    ("/v1/x/../chat", "/v1/chat"),
    ("/v1/%2e%2e/v1/chat", "/v1/chat"),  # decoded before resolving, as nginx does
    ("/v1%2Fchat", "/v1/chat"),
    ("/../../etc", "/etc"),  # never above the root
    ("/v1/chat/.", "/v1/chat/"),
    ("/v1/..", "/"),
    ("/.well-known/x", "/.well-known/x"),
    ("http://example.com/v1/chat?x", "/v1/chat"),
    ("*", "/"),
    ("", "/"),
    ("/%zz", "/%zz"),  # not an escape: kept
])
def test_paths_are_matched_normalized(target: str, path: str) -> None:
    assert normalize_path(target) == path


@pytest.mark.parametrize("prefix", ["/", "/v1/", "/v1/chat/completions", "/api", "/.well-known/", "/a.b/c-d_e~"])
def test_a_prefix_the_parser_accepts_is_already_normalized(prefix: str) -> None:
    spec = parse_task(f"service:\n  rate_limits: [{{prefix: '{prefix}', rps: 1}}]\nrun: x\n")
    assert spec.service.rate_limits[0].prefix == prefix
    assert normalize_path(prefix) == prefix


LIMITS = [RateLimit(10, "/"), RateLimit(5, "/v1/"), RateLimit(1, "/v1/chat/"), RateLimit(2, "/api")]


@pytest.mark.parametrize(("target", "prefix"), [
    ("/", "/"),
    ("/index.html", "/"),
    ("/v1/models", "/v1/"),
    ("/v1/chat/completions?stream=1", "/v1/chat/"),  # the longest prefix wins
    ("/v1", "/"),  # `/v1/` is not a prefix of `/v1`
    ("/v1/chat", "/v1/"),
    ("/apix", "/api"),  # plain string prefixes, as nginx's prefix locations
    ("//v1//chat/x", "/v1/chat/"),
    ("/v1/%63hat/x", "/v1/chat/"),
    ("/v1/models/../chat/x", "/v1/chat/"),
    ("http://host/v1/chat/x", "/v1/chat/"),
])
def test_the_longest_matching_prefix_decides(target: str, prefix: str) -> None:
    limit = RateLimiter(LIMITS).find_limit(target)
    assert limit is not None and limit.prefix == prefix


def test_a_path_no_prefix_matches_is_not_limited() -> None:
    limiter = RateLimiter([RateLimit(1, "/v1/")])
    assert limiter.find_limit("/health") is None
    assert all(limiter.decide("/health", "203.0.113.7", NO_HEADERS, 0.0) is ALLOWED for _ in range(100))
    assert len(limiter) == 0
    run(limiter, [(0.0, OK), (0.0, 1)], path="/v1/x")


def test_each_prefix_has_its_own_buckets() -> None:
    limiter = RateLimiter([RateLimit(1, "/"), RateLimit(1, "/v1/")])
    run(limiter, [(0.0, OK), (0.0, 1)], path="/v1/x")
    run(limiter, [(0.0, OK), (0.0, 1)], path="/other")


HEADER_LIMIT = RateLimit(1, "/", 0, RateLimitKey(RateLimitKeyType.HEADER, "X-User"))

KEYS = [
    pytest.param(RateLimit(1), [("203.0.113.7", {}), ("203.0.113.8", {})], [OK, OK], id="ip-two-addresses"),
    pytest.param(RateLimit(1), [("203.0.113.7", {}), ("203.0.113.7", {"X-User": "a"})], [OK, 1],
                 id="ip-ignores-headers"),
    pytest.param(RateLimit(1), [("2001:db8:1:2::1", {}), ("2001:db8:1:2:ffff::9", {})], [OK, 1],
                 id="ipv6-same-64-shares"),
    pytest.param(RateLimit(1), [("2001:db8:1:2::1", {}), ("2001:db8:1:3::1", {})], [OK, OK],
                 id="ipv6-other-64"),
    pytest.param(RateLimit(1), [("::ffff:203.0.113.7", {}), ("203.0.113.7", {})], [OK, 1],
                 id="ipv4-mapped-is-ipv4"),
    pytest.param(HEADER_LIMIT, [("203.0.113.7", {"X-User": "a"}), ("203.0.113.7", {"X-User": "b"})], [OK, OK],
                 id="header-two-values"),
    pytest.param(HEADER_LIMIT, [("203.0.113.7", {"X-User": "a"}), ("198.51.100.1", {"x-user": "a"})], [OK, 1],
                 id="header-one-value-two-addresses"),
    # Without the header a request counts by its address: leaving it out escapes nothing...
    pytest.param(HEADER_LIMIT, [("203.0.113.7", {}), ("203.0.113.7", {})], [OK, 1], id="header-missing-by-ip"),
    # ...and anonymous clients do not share one bucket.
    pytest.param(HEADER_LIMIT, [("203.0.113.7", {}), ("198.51.100.1", {})], [OK, OK],
                 id="header-missing-two-addresses"),
    # A header's value that spells an address is not that address's bucket.
    pytest.param(HEADER_LIMIT, [("203.0.113.7", {}), ("198.51.100.1", {"X-User": "203.0.113.7"})], [OK, OK],
                 id="header-value-is-not-an-address"),
    pytest.param(HEADER_LIMIT, [("203.0.113.7", {"X-User": "a"}), ("203.0.113.7", {})], [OK, OK],
                 id="header-and-headerless-apart"),
]


@pytest.mark.parametrize(("limit", "requests", "expected"), KEYS)
def test_what_shares_a_bucket(limit: RateLimit, requests: list[tuple[str, dict[str, str]]],
                              expected: list[object]) -> None:
    limiter = RateLimiter([limit])
    got = []
    for ip, headers in requests:
        verdict = limiter.decide("/", ip, CIMultiDict(headers), 0.0)
        got.append(OK if verdict is ALLOWED else verdict.retry_after_seconds if isinstance(verdict, Limited)
                   else verdict)
    assert got == expected


@pytest.mark.parametrize(("client_ip", "key"), [
    ("203.0.113.7", "203.0.113.7"),
    ("::ffff:203.0.113.7", "203.0.113.7"),
    ("2001:db8:1:2:3:4:5:6", "v6:20010db800010002"),
    ("2001:db8:1:2::", "v6:20010db800010002"),
    ("::1", "v6:0000000000000000"),
    ("fe80::1%eth0", "v6:fe80000000000000"),
    ("not-an-address:x", "not-an-address:x"),
    (None, ""),
])
def test_client_keys(client_ip: str | None, key: str) -> None:
    assert compute_client_key(client_ip) == key


def test_a_header_value_is_kept_as_a_digest() -> None:
    store = LocalBuckets(10)
    limiter = RateLimiter([HEADER_LIMIT], buckets=store)
    secret_value = "Bearer " + KEY_1 * 100
    limiter.decide("/", "203.0.113.7", CIMultiDict({"X-User": secret_value}), 0.0)
    [(index, client)] = store.keys()
    assert index == 0 and isinstance(client, bytes) and len(client) == 16  # 16 bytes, whatever the value's size
    assert KEY_1.encode() not in client


def test_rotating_addresses_cannot_grow_the_buckets_past_the_cap() -> None:
    limiter = RateLimiter([RateLimit(1, burst=5)], max_buckets=100)
    for n in range(10_000):
        limiter.decide("/", f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", NO_HEADERS, 0.0)
        assert len(limiter) <= 100
    assert len(limiter) == 100


def test_a_client_that_keeps_sending_keeps_its_bucket_while_others_rotate() -> None:
    limiter = RateLimiter([RateLimit(1)], max_buckets=10)
    run(limiter, [(0.0, OK), (0.0, 1)], ip="198.51.100.1")
    for n in range(1_000):  # an attacker's fresh addresses; the victim keeps asking in between
        limiter.decide("/", f"10.0.{n >> 8}.{n & 255}", NO_HEADERS, 0.5)
        run(limiter, [(0.5, 1)], ip="198.51.100.1")  # still limited: its bucket was never dropped
    run(limiter, [(1.0, OK)], ip="198.51.100.1")


def test_buckets_that_refilled_are_dropped() -> None:
    # 50 clients at t=0, rps 1, burst 0: each bucket is full again at t=1. At t=2, every decision drops up to
    # 16 of them from the head of the order: after 4 decisions from one client, only its own bucket is left.
    limiter = RateLimiter([RateLimit(1)])
    for n in range(50):
        limiter.decide("/", f"127.0.0.{n + 10}", NO_HEADERS, 0.0)  # keys only: nothing is contacted
    assert len(limiter) == 50
    for second in range(4):
        limiter.decide("/", "198.51.100.1", NO_HEADERS, 2.0 + second)
    assert len(limiter) == 1


# --- API keys --------------------------------------------------------------------------------------

TWO_KEYS = ApiKeys.from_values([("API_KEY", KEY_1), ("OTHER_KEY", KEY_2)])


@pytest.mark.parametrize(("header", "ok"), [
    (f"Bearer {KEY_1}", True),
    (f"Bearer {KEY_2}", True),
    (f"bearer {KEY_1}", True),  # the scheme is case-insensitive (RFC 9110 11.1)
    (f"BEARER {KEY_2}", True),
    (f"  Bearer   {KEY_1}  ", True),
    (f"Bearer {KEY_1.upper()}", False),  # the key is not
    (None, False),
    ("", False),
    ("Bearer", False),
    ("Bearer ", False),
    (KEY_1, False),
    (f"Basic {KEY_1}", False),
    (f"Token {KEY_1}", False),
    (f"Bearer {KEY_1}x", False),
    (f"Bearer {KEY_1[:-1]}", False),
    (f"Bearer {KEY_1} {KEY_2}", False),
    ("Bearer \udcff\udcfe", False),  # bytes that are not UTF-8, as the server decodes them: no error
])
def test_check_auth(header: str | None, ok: bool) -> None:
    assert check_auth(header, TWO_KEYS) is ok


@pytest.mark.parametrize("header", [f"Bearer {KEY_1}", f"Bearer {KEY_2}", "Bearer wrong", "Bearer " + "x" * 500])
def test_every_key_is_compared_in_constant_time(header: str, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ApiKeys.from_values([(f"KEY_{n}", f"{n:02d}" * 10) for n in range(5)] + [("API_KEY", KEY_1),
                                                                                   ("OTHER_KEY", KEY_2)])
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def recording(a: Any, b: Any) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    check_auth(header, keys)
    # Every key, matched or not, and always two 32-byte digests: neither an early exit nor the lengths tell
    # which key came close or how long the keys are.
    assert compared == [(32, 32)] * 7


def test_api_keys_hold_no_value() -> None:
    keys = ApiKeys.from_values([("API_KEY", KEY_1)])
    assert repr(keys) == "ApiKeys(names=('API_KEY',))"
    assert KEY_1 not in repr(keys) and all(KEY_1.encode() not in digest for _, digest in keys.digests)


def test_the_guard_decides_the_limit_then_the_key() -> None:
    guard = Guard(GuardConfig(keys=TWO_KEYS, rate_limits=(RateLimit(1, burst=1),)))
    good = CIMultiDict({"Authorization": f"Bearer {KEY_1}"})
    assert guard.decide("/", "203.0.113.7", NO_HEADERS, 0.0) == Unauthorized(token_sent=False)
    assert guard.decide("/", "203.0.113.7", CIMultiDict({"authorization": "Bearer nope"}), 0.0) == Unauthorized(
        token_sent=True)
    # Guesses count: the burst of 2 is used up by the two refused requests, so even the right key waits.
    assert guard.decide("/", "203.0.113.7", good, 0.0) == Limited(1, "/")
    assert guard.decide("/", "203.0.113.7", good, 1.0) is ALLOWED
    assert Guard().decide("/", "203.0.113.7", NO_HEADERS, 0.0) is ALLOWED  # no config: an open endpoint


def test_configure_keeps_buckets_unless_the_limits_change() -> None:
    limits = (RateLimit(1),)
    guard = Guard(GuardConfig(keys=TWO_KEYS, rate_limits=limits))
    request = ("/", "203.0.113.7", CIMultiDict({"Authorization": f"Bearer {KEY_2}"}))
    assert guard.decide(*request, 0.0) is ALLOWED
    rotated = ApiKeys.from_values([("API_KEY", KEY_2)])
    guard.configure(GuardConfig(keys=rotated, rate_limits=limits))  # a key rotated: same limits
    assert guard.decide(*request, 0.0) == Limited(1, "/")
    guard.configure(GuardConfig(keys=rotated, rate_limits=(RateLimit(2),)))  # new limits start afresh
    assert guard.decide(*request, 0.0) is ALLOWED
    guard.configure(GuardConfig(keys=ApiKeys.from_values([("API_KEY", KEY_1)]), rate_limits=(RateLimit(2),)))
    assert guard.decide(*request, 5.0) == Unauthorized(token_sent=True)  # the old key no longer opens it


@pytest.mark.parametrize(("verdict", "answer"), [
    (Limited(3, "/v1/"), GuardAnswer(429, (("Retry-After", "3"),),
                                     "Too many requests to service svc: retry in 3 s.\n")),
    (Unauthorized(token_sent=False), GuardAnswer(401, (("WWW-Authenticate", 'Bearer realm="svc"'),),
                                                 "Unauthorized: it needs an API key; send Authorization: Bearer KEY "
                                                 "to service svc.\n")),
    (Unauthorized(token_sent=True), GuardAnswer(401, (("WWW-Authenticate",
                                                       'Bearer realm="svc", error="invalid_token"'),),
                                                "Unauthorized: the API key sent is not one of its keys; send "
                                                "Authorization: Bearer KEY to service svc.\n")),
])
def test_answers(verdict: Limited | Unauthorized, answer: GuardAnswer) -> None:
    assert compute_answer(verdict, "svc") == answer


# --- where the keys come from ----------------------------------------------------------------------

def reader(values: dict[str, str]) -> Callable[[str], str]:
    def read(digest: str) -> str:
        if digest not in values:
            raise StateConflictError(f"a secret of this version is missing (digest {digest[:8]}...)")
        return values[digest]
    return read


AUTH = ServiceAuth((("API_KEY", "a" * 32), ("OTHER_KEY", "b" * 32)))


def test_the_keys_are_read_by_digest_and_hashed() -> None:
    limits = (RateLimit(2, "/v1/"),)
    config = read_guard_config(ServiceSpec(auth=AUTH, rate_limits=limits),
                               reader({"a" * 32: KEY_1, "b" * 32: KEY_2}), "service svc version 1")
    assert config.rate_limits == limits and config.keys is not None
    assert config.keys.names == ("API_KEY", "OTHER_KEY")
    assert check_auth(f"Bearer {KEY_1}", config.keys) and check_auth(f"Bearer {KEY_2}", config.keys)
    assert read_guard_config(ServiceSpec(rate_limits=limits), reader({}), "x") == GuardConfig(rate_limits=limits)


@pytest.mark.parametrize(("auth", "values", "message"), [
    (ServiceAuth((("API_KEY", ""),)), {}, "service svc version 1: the key API_KEY of service.auth has no value: "
                                          "submit the version again with --secret API_KEY"),
    (AUTH, {"a" * 32: KEY_1}, "a secret of this version is missing (digest bbbbbbbb...)"),
    (AUTH, {"a" * 32: KEY_1, "b" * 32: "tiny-key"},
     "service svc version 1: the key OTHER_KEY of service.auth must be at least 16 characters"),
])
def test_keys_that_cannot_be_read_are_errors_without_values(auth: ServiceAuth, values: dict[str, str],
                                                            message: str) -> None:
    with pytest.raises(StateConflictError) as caught:
        read_guard_config(ServiceSpec(auth=auth), reader(values), "service svc version 1")
    assert message in str(caught.value)
    assert all(value not in str(caught.value) for value in values.values())


TASK = """\
secrets: {{API_KEY: null, HF_TOKEN: null}}
service:
  replicas: 1
  auth: {{api_keys: [API_KEY]}}
  rate_limits: [{{rps: {rps}}}]
run: serve
"""


class CountingStore:
    """The store, counting the versions read."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.versions_read = 0

    def find_service(self, name: str) -> ServiceRecord | None:
        return self.store.find_service(name)

    def get_version(self, name: str, version: int) -> VersionRecord:
        self.versions_read += 1
        return self.store.get_version(name, version)


def test_the_store_source_follows_the_current_version(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store, secrets = Store.open(home), SecretStore(home)

    def submit(key: str, rps: int, previous: bool) -> None:
        given = (("API_KEY", Secret(key)), ("HF_TOKEN", Secret("hf")))
        task = with_inputs(read_task(TASK.format(rps=rps), "svc.yaml"), (), given, None)
        before = store.get_version("svc", store.get_service("svc").current_version) if previous else None
        bound, inputs = bind_submission(task, before, secrets, keep_secrets=True)
        if previous:
            store.add_version("svc", bound, "rolling", 0.0, inputs=inputs)
        else:
            store.create_service("svc", bound, 30001, 0.0, inputs=inputs)

    submit(KEY_1, 4, previous=False)
    counting = CountingStore(store)
    source = StoreGuardSource.of_home(counting, "svc", home)
    first = source.read()
    assert first is not None and first.keys is not None and first.rate_limits == (RateLimit(4),)
    assert check_auth(f"Bearer {KEY_1}", first.keys)
    assert source.read() is first and counting.versions_read == 1  # the same version: not read again

    submit(KEY_2, 4, previous=True)  # the key rotated
    second = source.read()
    assert second is not None and second.keys is not None and counting.versions_read == 2
    assert check_auth(f"Bearer {KEY_2}", second.keys) and not check_auth(f"Bearer {KEY_1}", second.keys)
    store.close()


def test_the_store_source_says_when_the_service_is_gone(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    assert StoreGuardSource.of_home(store, "svc", tmp_path / "home").read() is None
    store.close()
