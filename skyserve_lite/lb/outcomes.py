"""What became of each request the load balancer handled, for whoever counts them.

The load balancer hands every finished attempt to a replica, and every answer it made itself, to its
``OutcomeSink``\\ s as one ``Outcome``, at the single place where that result is known (``lb.proxy``):

* an attempt that got a response: when the response is released (body relayed, client gone, or a
  WebSocket tunnel closed), with the replica's status and the time from sending the request to then;
* an attempt that got no response (could not connect, reset, timed out, invalid answer, or the client
  went away first): at once, with ``status`` None and ``failure`` saying which;
* an answer without a replica (401 or 429 from the guard, 503 when no replica was READY within the hold,
  502 or 504 after every attempt failed): with ``replica`` and ``version`` None and ``attempt`` 0.

What the server answers about a connection rather than a request for the service (400 for bad framing, 408,
417, the 503 at the connection limits) and the identity path are not outcomes.

So a request retried once after a reset gives three outcomes: the failed attempt 1 (status None), then
attempt 2 with the second replica's status; a request whose two attempts both failed gives two failed
attempts and the load balancer's 502.

Sinks are called on the load balancer's event loop, per request, and must be cheap and must not block or
raise: add to plain dicts and ints, and turn them into anything else (files, rows, metric families) on a
timer of their own. No locks are needed: one event loop calls them.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple, Protocol

__all__ = ["STATUS_CLASSES", "Failure", "Outcome", "OutcomeSink", "RecordingSink", "find_status_class"]


class Failure(str, enum.Enum):
    """Why an attempt got no response."""

    CONNECT = "connect"  # the replica could not be reached: nothing was sent
    RESET = "reset"  # the connection broke before the response head
    TIMEOUT = "timeout"  # no response head within the upstream timeout
    INVALID = "invalid"  # the replica's answer could not be parsed
    ABORTED = "aborted"  # the client went away before the replica answered: not the replica's fault


class Outcome(NamedTuple):
    """One finished attempt, or one answer the load balancer made itself. Immutable; a named tuple rather
    than a frozen dataclass because one is made per request: 0.24 us against 0.70 us to build here.

    ``version`` is the service version of the replica at ``replica`` (its url) when the attempt was sent
    (None when the load balancer did not know it, and for answers without a replica). ``status`` is the
    HTTP status the replica or the load balancer answered, None for an attempt without a response (then
    ``failure`` says why). ``seconds`` runs from sending the attempt to its end (see the module docstring);
    for an answer without a replica, from the first attempt or the start of the hold (0 for the guard's).
    ``attempt`` is 1 for a request's first attempt, 2 for its retry, 0 for an answer without a replica.
    """

    version: int | None
    replica: str | None
    status: int | None
    seconds: float
    attempt: int
    failure: Failure | None = None


# Indexed by status // 100. llhttp takes any three-digit status (100 to 999): one from 600 up is a replica
# answering outside HTTP, counted with the server errors ("5xx") by every sink alike.
STATUS_CLASSES: Final = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx", "5xx", "5xx", "5xx", "5xx")


def find_status_class(status: int | None) -> str:
    """The class a status is counted under: ``"2xx"`` for 204, ``"5xx"`` for 503 and for 600 to 999,
    ``"failed"`` for an attempt without a response (None). One table lookup, no string built: it runs per
    request, and the canary counts and the metrics must agree on it."""
    return "failed" if status is None else STATUS_CLASSES[status // 100]


class OutcomeSink(Protocol):
    def record(self, outcome: Outcome) -> None:
        """Take one outcome. Called on the load balancer's event loop once per finished attempt and per
        answer without a replica; must return quickly, never block and never raise (an exception would
        end the request it came from)."""
        ...


class RecordingSink:
    """An ``OutcomeSink`` that keeps every outcome in ``outcomes``, for tests and for trying things out."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
