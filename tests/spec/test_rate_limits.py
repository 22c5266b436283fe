"""`service.rate_limits`: dstack's `{prefix, rps, burst, key}`, one clear message per field, a service setting
(replicas are reused when a limit changes)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.config import find_config_changes, find_service_changes
from skyserve_lite.spec.model import RateLimit, RateLimitKey, RateLimitKeyType
from skyserve_lite.spec.parse import parse_task

SOURCE = "svc.yaml"
IP = RateLimitKey()


def header(name: str) -> RateLimitKey:
    return RateLimitKey(RateLimitKeyType.HEADER, name)


def task(limits: Any) -> str:
    return yaml.safe_dump({"service": {"replicas": 1, "rate_limits": limits}, "run": "serve"}, sort_keys=False)


ACCEPTED = [
    # dstack's example: a strict limit on /api/auth/, a looser one for the rest.
    pytest.param([{"prefix": "/api/auth/", "rps": 1}, {"rps": 4, "burst": 9}],
                 (RateLimit(1.0, "/api/auth/"), RateLimit(4.0, "/", 9)), id="dstack-example"),
    pytest.param([{"rps": 4, "burst": 9, "key": {"type": "header", "header": "Authorization"}}],
                 (RateLimit(4.0, "/", 9, header("Authorization")),), id="dstack-header-key"),
    pytest.param([{"rps": 2, "key": {"type": "ip_address"}}], (RateLimit(2.0, "/", 0, IP),), id="dstack-ip-key"),
    pytest.param([{"rps": 2, "key": "ip"}], (RateLimit(2.0),), id="short-ip"),
    pytest.param([{"rps": 2, "key": "ip_address"}], (RateLimit(2.0),), id="short-ip-address"),
    pytest.param([{"rps": 2, "key": "header X-API-Key"}], (RateLimit(2.0, key=header("X-API-Key")),),
                 id="short-header"),
    pytest.param([{"rps": 0.5, "prefix": "/v1/chat/completions"}], (RateLimit(0.5, "/v1/chat/completions"),),
                 id="fractional-rps"),
    pytest.param([{"rps": 1 / 60}], (RateLimit(1 / 60),), id="one-a-minute"),
    pytest.param([{"rps": 1, "prefix": "/.well-known/"}], (RateLimit(1.0, "/.well-known/"),), id="dot-in-a-name"),
    pytest.param([], (), id="empty-list"),
]


@pytest.mark.parametrize(("limits", "expected"), ACCEPTED)
def test_rate_limits_are_read(limits: Any, expected: tuple[RateLimit, ...]) -> None:
    assert parse_task(task(limits), SOURCE).service.rate_limits == expected


def test_no_rate_limits_limit_nothing() -> None:
    assert parse_task("service: {replicas: 1}\nrun: x\n").service.rate_limits == ()


_R = "service.rate_limits"
REFUSED = [
    pytest.param({"rps": 1}, _R, "must be a list of limits ({prefix, rps, burst, key}), got a mapping",
                 id="not-a-list"),
    pytest.param(["rps: 1"], f"{_R}[0]", "this field must be a mapping, got a string", id="item-string"),
    pytest.param([{"prefix": "/"}], f"{_R}[0].rps", "missing; the most requests a second each client may send",
                 id="rps-missing"),
    pytest.param([{"rps": "10"}], f"{_R}[0].rps", "must be a number, got a string ('10')", id="rps-string"),
    pytest.param([{"rps": 0}], f"{_R}[0].rps", "must be greater than 0, got 0", id="rps-zero"),
    pytest.param([{"rps": 0.01}], f"{_R}[0].rps", "must be at least 1/60 (one request a minute), got 0.01",
                 id="rps-below-one-a-minute"),
    pytest.param([{"rps": 1, "burst": -1}], f"{_R}[0].burst", "must be at least 0, got -1", id="burst-negative"),
    pytest.param([{"rps": 1, "burst": 2.5}], f"{_R}[0].burst", "must be an integer, got a number (2.5)",
                 id="burst-fraction"),
    pytest.param([{"rps": 1, "prefix": "api/"}], f"{_R}[0].prefix", "must start with '/', got 'api/'",
                 id="prefix-relative"),
    pytest.param([{"rps": 1, "prefix": "/a b"}], f"{_R}[0].prefix", "not a path as the load balancer matches it",
                 id="prefix-space"),
    pytest.param([{"rps": 1, "prefix": "/v1?x=1"}], f"{_R}[0].prefix", "no query", id="prefix-query"),
    pytest.param([{"rps": 1, "prefix": "/v1/%63hat"}], f"{_R}[0].prefix", "%-escapes", id="prefix-escape"),
    pytest.param([{"rps": 1, "prefix": "/v1//chat"}], f"{_R}[0].prefix", "'//'", id="prefix-double-slash"),
    pytest.param([{"rps": 1, "prefix": "/v1/../chat"}], f"{_R}[0].prefix", "'..' segments", id="prefix-dotdot"),
    pytest.param([{"rps": 1, "prefix": "/v1/."}], f"{_R}[0].prefix", "'.' or '..' segments", id="prefix-dot-end"),
    pytest.param([{"rps": 1, "prefix": "/v1\\chat"}], f"{_R}[0].prefix", "backslashes", id="prefix-backslash"),
    pytest.param([{"rps": 1, "prefix": 5}], f"{_R}[0].prefix", "must be a string, got a number (5)",
                 id="prefix-number"),
    pytest.param([{"rps": 1, "prefix": "/v1/"}, {"rps": 2, "prefix": "/v1/"}], f"{_R}[1].prefix",
                 "'/v1/' is the prefix of service.rate_limits[0] too: one limit per prefix", id="prefix-twice"),
    pytest.param([{"rps": 1}, {"rps": 2}], f"{_R}[1].prefix", "'/' is the prefix of service.rate_limits[0] too",
                 id="default-prefix-twice"),
    pytest.param([{"rps": 1, "key": "client"}], f"{_R}[0].key", "must be 'ip' or 'header NAME'", id="key-unknown"),
    pytest.param([{"rps": 1, "key": "header"}], f"{_R}[0].key", "must be 'ip' or 'header NAME'",
                 id="key-header-without-name"),
    pytest.param([{"rps": 1, "key": "header X:Y"}], f"{_R}[0].key", "'X:Y' is not a valid HTTP header name",
                 id="key-bad-header"),
    pytest.param([{"rps": 1, "key": {"header": "X-A"}}], f"{_R}[0].key.type", "missing; ip_address or header",
                 id="key-type-missing"),
    pytest.param([{"rps": 1, "key": {"type": "cookie"}}], f"{_R}[0].key.type",
                 "unknown value 'cookie'; expected one of: ip_address, header", id="key-type-unknown"),
    pytest.param([{"rps": 1, "key": {"type": "header"}}], f"{_R}[0].key.header", "missing; the header whose value",
                 id="key-header-missing"),
    pytest.param([{"rps": 1, "key": {"type": "ip_address", "header": "X-A"}}], f"{_R}[0].key.header",
                 "only with type: header", id="key-ip-with-header"),
    pytest.param([{"rps": 1, "key": {"type": "header", "header": "X A"}}], f"{_R}[0].key.header",
                 "'X A' is not a valid HTTP header name", id="key-header-space"),
    pytest.param([{"rps": 1, "period": "1s"}], f"{_R}[0].period",
                 "unknown field; expected one of: prefix, rps, burst, key", id="unknown-field"),
]


@pytest.mark.parametrize(("limits", "path", "problem"), REFUSED)
def test_rate_limits_are_refused_naming_the_field(limits: Any, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(task(limits), SOURCE)
    assert (caught.value.path, caught.value.source) == (path, SOURCE)
    assert problem in caught.value.problem
    assert "\n" not in str(caught.value)


CHANGES = [
    pytest.param([{"rps": 4, "burst": 9}], [{"rps": 2, "burst": 9}], ["service.rate_limits./.rps: 4.0 -> 2.0"],
                 id="rps"),
    pytest.param([{"rps": 4}], [{"rps": 4, "key": "header X-User"}],
                 ["service.rate_limits./.key: ip_address -> header X-User"], id="key"),
    pytest.param([], [{"rps": 1, "prefix": "/v1/"}],
                 ["service.rate_limits./v1/.burst: (unset) -> 0", "service.rate_limits./v1/.key: (unset) -> ip_address",
                  "service.rate_limits./v1/.rps: (unset) -> 1.0"], id="added"),
    pytest.param([{"rps": 1, "prefix": "/a"}, {"rps": 2}], [{"rps": 2}, {"rps": 1, "prefix": "/a"}], [],
                 id="reordered-is-no-change"),
]


@pytest.mark.parametrize(("old", "new", "changes"), CHANGES)
def test_a_rate_limit_change_is_a_service_change_that_reuses_replicas(old: Any, new: Any, changes: list[str]) -> None:
    before, after = parse_task(task(old)), parse_task(task(new))
    assert [change.describe() for change in find_service_changes(before, after)] == changes
    assert find_config_changes(before, after) == ()
