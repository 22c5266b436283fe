"""What the load balancer decides about a request before it picks a replica: its rate limit, then its API key.

Pure but for the buckets ``RateLimiter`` keeps in memory (time comes in as ``now``): nothing here reads a
socket, the store or the secret store (``lb.auth_keys`` reads the keys), logs, or writes HTTP bytes. The
server calls, per request::

    verdict = guard.decide(path, client_ip, headers, now)   # ALLOWED, Limited or Unauthorized
    if verdict is not ALLOWED:
        answer = compute_answer(verdict, service)             # 429 with Retry-After, 401 with WWW-Authenticate

**Rate limits** (``service.rate_limits``, dstack's fields): the limit whose ``prefix`` is the longest one the
request's path starts with decides, as nginx's prefix locations do in a dstack gateway; a path no prefix
matches is not limited (``prefix: /``, the default, matches every path). Paths are matched as
``normalize_path`` makes them (query cut, %-escapes decoded, ``.``, ``..`` and repeated ``/`` resolved), so
``//v1/%63hat`` cannot slip past the limit on ``/v1/chat``. Each key of a limit has its own bucket:

- ``key: ip``: the client's address as the load balancer's socket sees it (never ``X-Forwarded-For``, which
  the client writes); an IPv6 client by its /64 network, which one host or home is usually given, so that
  rotating through the 2^64 addresses of one's own network does not make fresh buckets;
- ``key: header NAME``: the header's value (kept as a 16-byte digest: a header may hold a credential, and a
  digest is as long for an 8 KiB value as for a short one). A request **without** the header is counted
  by its client address instead, in that limit's buckets: leaving the header out escapes no limit (a
  dstack gateway's nginx does not count a request whose key is empty) and anonymous clients do not share
  one bucket either.

A bucket is the generic cell rate algorithm (GCRA), nginx's ``limit_req ... burst=B nodelay``: one float
per key, the theoretical arrival time ``tat`` of the next request if the client kept exactly to ``rps``.
With ``interval = 1/rps`` and ``tolerance = burst * interval``, a request at ``now`` is allowed when
``max(tat, now) - now <= tolerance`` and then moves ``tat`` to ``max(tat, now) + interval``; otherwise it is
limited, counts for nothing, and may retry after ``max(tat, now) - now - tolerance`` seconds
(``Retry-After``, whole seconds rounded up, at least 1). So a fresh client may send ``burst + 1`` requests
at once, then one per ``interval``: ``rps: 4, burst: 9``: 10 requests at t=0 (tat 0 -> 2.5), the 11th is
limited with 2.5 - 0 - 2.25 = 0.25 s to wait (``Retry-After: 1``), the next is allowed at t=0.25.

Memory is bounded: a bucket whose ``tat`` is past is the same as no bucket (a client that has waited has
its whole burst back), so such buckets are dropped as they reach the head of the least-recently-used
order; and at ``max_buckets`` the least recently used one is dropped whatever its state, as nginx does when
a ``limit_req_zone`` is full. A client rotating through many addresses therefore costs at most
``max_buckets`` entries (about 320 bytes each: the default 50,000 are some 16 MiB); the price, with more
active keys than that, is that the longest-idle ones get a fresh bucket early.

**API keys** (``service.auth``): ``Authorization: Bearer KEY`` with one of the service's keys, compared in
constant time: the token's SHA-256 digest against each key's (``ApiKeys`` holds digests only, never a
value), every key compared, the results or-ed, so neither the time nor an early exit tells which key came
close or how long the keys are. Anything else is 401 with ``WWW-Authenticate: Bearer realm="SERVICE"``
(and ``error="invalid_token"`` when a token was sent, RFC 6750). Limits are decided first, as nginx's
``limit_req`` runs before ``auth_request`` in a dstack gateway: guessing keys is rate limited too.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote, urlsplit

from skyserve_lite.lb.buckets import SLACK, BucketStore, LocalBuckets
from skyserve_lite.spec.model import RateLimit, RateLimitKeyType

__all__ = [
    "ALLOWED",
    "DEFAULT_MAX_BUCKETS",
    "Allowed",
    "ApiKeys",
    "Guard",
    "GuardAnswer",
    "GuardConfig",
    "Limited",
    "RateLimiter",
    "Unauthorized",
    "check_auth",
    "compute_answer",
    "compute_client_key",
    "compute_retry_after",
    "normalize_path",
]

# 50,000 buckets of ~320 bytes (key, float and the order's links, measured) are ~16 MiB, beside the ~100 MiB
# 10,000 connections take; more clients than that active within one refill period are rare for one service.
DEFAULT_MAX_BUCKETS: Final = 50_000
_BEARER: Final = "bearer"
AUTHORIZATION: Final = "Authorization"


@dataclass(frozen=True, slots=True)
class Allowed:
    """Go on: no limit refuses the request and its key (if the service asks for one) is right."""


ALLOWED: Final = Allowed()


@dataclass(frozen=True, slots=True)
class Limited:
    """429: the request's bucket under ``prefix`` is empty; it may be sent again in ``retry_after_seconds``."""

    retry_after_seconds: int
    prefix: str


@dataclass(frozen=True, slots=True)
class Unauthorized:
    """401: no valid key. ``token_sent``: an ``Authorization: Bearer`` token came, and was wrong."""

    token_sent: bool


Verdict = Allowed | Limited | Unauthorized


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The keys of ``service.auth`` as the load balancer holds them: their names and SHA-256 digests, never a
    value (``from_values`` hashes them at once). The repr names the keys only."""

    digests: tuple[tuple[str, bytes], ...] = field(repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.digests)

    @classmethod
    def from_values(cls, values: Iterable[tuple[str, str]]) -> ApiKeys:
        """``(name, value)`` pairs, the values hashed here and dropped."""
        return cls(tuple(sorted((name, _digest(value)) for name, value in values)))

    def __repr__(self) -> str:
        return f"ApiKeys(names={self.names!r})"


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """What one version of a service asks of its requests: keys (None: an open endpoint) and limits."""

    keys: ApiKeys | None = None
    rate_limits: tuple[RateLimit, ...] = ()


@dataclass(frozen=True, slots=True)
class GuardAnswer:
    """The response the load balancer makes itself for a refused request: status, headers, plain text."""

    status: int
    headers: tuple[tuple[str, str], ...]
    text: str


def _digest(text: str) -> bytes:
    # surrogateescape: header values arrive decoded that way, so a non-UTF-8 byte still hashes as itself.
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def check_auth(header_value: str | None, keys: ApiKeys) -> bool:
    """Whether ``header_value`` (the request's ``Authorization``; None when absent) is ``Bearer KEY`` with one
    of ``keys``. The scheme is matched without regard to case (RFC 9110 11.1). Constant time in the keys:
    every key's digest is compared with ``hmac.compare_digest``, none is skipped once one matched."""
    token = _bearer_token(header_value)
    if token is None:
        return False
    sent = _digest(token)
    matched = False
    for _, digest in keys.digests:
        matched |= hmac.compare_digest(sent, digest)
    return matched


def _bearer_token(header_value: str | None) -> str | None:
    """The token of ``Bearer TOKEN``; None for no header, another scheme or no token."""
    if header_value is None:
        return None
    scheme, _, token = header_value.strip().partition(" ")
    token = token.strip(" \t")
    return token if scheme.lower() == _BEARER and token else None


def normalize_path(target: str) -> str:
    """The path of a request target as rate-limit prefixes are matched against it: the query (and any
    fragment) cut, %-escapes decoded, empty and ``.`` segments dropped, ``..`` taking one segment back (never
    above ``/``), a trailing ``/`` kept. Absolute-form targets (``http://host/p``) give their path; ``*``
    and anything else without a path give ``/``. Decoding comes before resolving, as in nginx, so
    ``/a/%2e%2e/b`` is ``/b``."""
    path = target.partition("?")[0].partition("#")[0]
    if not path.startswith("/"):
        path = urlsplit(path).path if "://" in path else ""
        if not path.startswith("/"):
            return "/"
    if "%" in path:
        path = unquote(path, errors="surrogateescape")
    if "//" not in path and "/." not in path:
        return path
    segments: list[str] = []
    parts = path.split("/")[1:]
    for part in parts:
        if part == "..":
            if segments:
                segments.pop()
        elif part not in ("", "."):
            segments.append(part)
    trailing = parts[-1] in ("", ".", "..") and bool(segments)
    return "/" + "/".join(segments) + ("/" if trailing else "")


def compute_client_key(client_ip: str | None) -> str:
    """The bucket key of a client address: an IPv4 address as itself (``::ffff:1.2.3.4`` too), an IPv6 one
    by its /64 network (``2001:db8:1:2::/64``, spelt as the hex of its first 8 bytes, which is cheaper to
    make: ``v6:20010db800010002``), anything unparseable as written (``""`` for None)."""
    if not client_ip:
        return ""
    if ":" not in client_ip:
        return client_ip  # IPv4, as the socket wrote it: already one spelling per address
    try:
        address = ipaddress.IPv6Address(client_ip)
    except ValueError:
        return client_ip
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return "v6:" + address.packed[:8].hex()


def compute_retry_after(wait_seconds: float) -> int:
    """``Retry-After`` for a wait: whole seconds rounded up, at least 1 (``0.25`` -> 1, ``2.0`` -> 2,
    ``2.0000001`` -> 3). Within ``SLACK`` of a whole number counts as that number, so float error in the
    bucket arithmetic does not add a second."""
    return max(1, math.ceil(wait_seconds - SLACK))


@dataclass(frozen=True, slots=True)
class _Rule:
    index: int
    limit: RateLimit
    interval: float
    tolerance: float
    header: str | None  # the header keying the buckets (``key: header NAME``); None: the client's address


class RateLimiter:
    """The buckets of one version's ``rate_limits``; see the module's docstring for the arithmetic.

    Not thread-safe: one load balancer process calls it from its event loop. ``now`` is seconds on a clock
    that never goes back (``time.monotonic()``): a clock stepped back by an hour would hold every bucket
    empty for that hour.
    """

    def __init__(self, limits: Sequence[RateLimit], max_buckets: int = DEFAULT_MAX_BUCKETS,
                 buckets: BucketStore | None = None) -> None:
        self.limits = tuple(limits)
        # Longest prefix first: the first that matches is the longest (prefixes are distinct).
        self._rules = sorted(
            (_Rule(index, limit, 1 / limit.rps, limit.burst / limit.rps,
                   limit.key.header if limit.key.type is RateLimitKeyType.HEADER and limit.key.header else None)
             for index, limit in enumerate(limits)),
            key=lambda rule: -len(rule.limit.prefix))
        # One limit on "/" (the default prefix) decides every request: its path need not be normalized.
        self._only_root = self._rules[0] if len(self._rules) == 1 and self._rules[0].limit.prefix == "/" else None
        # (limit index, client key) -> tat: this process's (``LocalBuckets``) unless the workers of one load
        # balancer share theirs (``lb.buckets.SharedBuckets``).
        self._buckets = buckets if buckets is not None else LocalBuckets(max_buckets)

    def __len__(self) -> int:
        """Buckets held now (for tests and metrics)."""
        return len(self._buckets)

    def find_limit(self, path: str) -> RateLimit | None:
        """The limit that decides for request target ``path``: the longest prefix its normalized path has."""
        rule = self._match(normalize_path(path)) if self._rules else None
        return rule.limit if rule is not None else None

    def _match(self, normalized: str) -> _Rule | None:
        for rule in self._rules:
            if normalized.startswith(rule.limit.prefix):
                return rule
        return None

    def decide(self, path: str, client_ip: str | None, headers: Mapping[str, str], now: float) -> Allowed | Limited:
        """Count one request to ``path`` (the request target as sent) from ``client_ip`` with ``headers``
        (looked up with ``get``: pass a case-insensitive mapping, as the server's are) at ``now``, or refuse
        it. Only allowed requests use up their bucket."""
        rule = self._only_root
        if rule is None:
            if not self._rules:
                return ALLOWED
            rule = self._match(normalize_path(path))
            if rule is None:
                return ALLOWED
        client: str | bytes
        value = headers.get(rule.header) if rule.header is not None else None
        if value is not None:
            client = hashlib.blake2b(value.encode("utf-8", "surrogateescape"), digest_size=16).digest()
        elif client_ip and ":" not in client_ip:
            client = client_ip  # compute_client_key's IPv4 case, inlined: this runs per request
        else:
            client = compute_client_key(client_ip)
        wait = self._buckets.take((rule.index, client), now, rule.interval, rule.tolerance)
        if wait > SLACK:
            return Limited(compute_retry_after(wait), rule.limit.prefix)
        return ALLOWED


class Guard:
    """A service's rate limits and keys, as its current version says (``configure``), deciding requests.

    Not thread-safe (one event loop). ``configure`` keeps the buckets when the limits did not change (a
    key rotated, another version with the same limits) and starts afresh when they did. ``buckets(limits)``
    gives the store for a set of limits (a worker's view of the shared table, ``lb.buckets``); None keeps
    them in this process.
    """

    def __init__(self, config: GuardConfig | None = None, *, max_buckets: int = DEFAULT_MAX_BUCKETS,
                 buckets: Callable[[tuple[RateLimit, ...]], BucketStore] | None = None) -> None:
        self._max_buckets = max_buckets
        self._buckets = buckets
        self._config = GuardConfig()
        self._limiter = RateLimiter((), max_buckets)
        self.configure(config or GuardConfig())

    @property
    def config(self) -> GuardConfig:
        return self._config

    @property
    def limiter(self) -> RateLimiter:
        return self._limiter

    def configure(self, config: GuardConfig) -> None:
        if config.rate_limits != self._limiter.limits:
            store = self._buckets(config.rate_limits) if self._buckets is not None and config.rate_limits else None
            self._limiter = RateLimiter(config.rate_limits, self._max_buckets, store)
        self._config = config

    def decide(self, path: str, client_ip: str | None, headers: Mapping[str, str], now: float) -> Verdict:
        """The rate limit first (``RateLimiter.decide``), then the key (``check_auth`` of the
        ``Authorization`` header) when the service asks for one."""
        limited = self._limiter.decide(path, client_ip, headers, now)
        if limited is not ALLOWED:
            return limited
        keys = self._config.keys
        if keys is None:
            return ALLOWED
        header = headers.get(AUTHORIZATION)
        if check_auth(header, keys):
            return ALLOWED
        return Unauthorized(token_sent=_bearer_token(header) is not None)


def compute_answer(verdict: Limited | Unauthorized, service: str) -> GuardAnswer:
    """The 429 or 401 for a refused request to ``service`` (a DNS label: safe in a quoted realm)."""
    if isinstance(verdict, Limited):
        seconds = verdict.retry_after_seconds
        return GuardAnswer(429, (("Retry-After", str(seconds)),),
                           f"Too many requests to service {service}: retry in {seconds} s.\n")
    challenge = f'Bearer realm="{service}"' + (', error="invalid_token"' if verdict.token_sent else "")
    what = "the API key sent is not one of its keys" if verdict.token_sent else "it needs an API key"
    return GuardAnswer(401, (("WWW-Authenticate", challenge),),
                       f"Unauthorized: {what}; send Authorization: Bearer KEY to service {service}.\n")
