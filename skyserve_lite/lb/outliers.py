"""Passive health of the replicas: a replica that keeps failing is taken out of the rotation for a while.

As Envoy's outlier detection (consecutive failures, an ejection time), in the load balancer's own terms:

* A **failure** is an attempt that got no response head from the replica: no connection, the connection
  reset, an answer that is not HTTP, no head within the upstream timeout. A response head of any status
  is a success: a replica answering 500 is alive, and its readiness probe judges its health.
* After ``max_failures`` failures in a row a replica is **ejected**: no request is sent to it for
  ``cooldown_seconds``. Then it is on **probation**: the next request chosen for it is a **trial**, and
  while that trial runs no other request goes to it. A response head ends the probation (it is healthy
  again); a failed trial ejects it for another cool-down.
* A url that leaves the targets is forgotten: a replica the controller takes out of READY (its readiness
  probe failed) and puts back (the probe passed again) comes back healthy.
* **The last replica is never ejected**: a replica whose failure would leave no other target in the
  rotation stays in it, its failures counted. With every other replica ejected, its requests get the
  replica's own answer or a 502 that says why, rather than a 503 from an empty rotation, and it is taken
  out as soon as another replica is back.

With ``max_failures`` 3 and ``cooldown_seconds`` 30, replicas A and B: A fails at t=1, 2 and 3 and is
ejected until 33; ``release_due(33)`` puts it on probation; the next request chosen for A is its trial
(``begin_trial``); if that trial gets a response head, A is healthy again, if not it is ejected until 63
(its third failure was its last chance: one failure on probation is enough).

Pure: the time comes in as an argument; no I/O, no clock, no logging. Used from one event loop.
"""

from __future__ import annotations

from collections.abc import Collection


class OutlierDetector:
    """Consecutive failures per replica url and the ejections they cause, as the module docstring says.

    ``excluded`` (ejected, or on a trial in flight) and ``probation`` are read on every request, so they
    are plain attributes, empty frozensets while every replica is healthy; ``failures`` is empty then too,
    which is what the request path checks before anything else here.
    """

    def __init__(self, max_failures: int, cooldown_seconds: float) -> None:
        self.max_failures = max_failures
        self.cooldown_seconds = cooldown_seconds
        # Consecutive failures of urls whose last attempt failed (or that are ejected or on probation).
        self.failures: dict[str, int] = {}
        self.excluded: frozenset[str] = frozenset()
        self.probation: frozenset[str] = frozenset()
        self._ejected_until: dict[str, float] = {}
        self._trials: set[str] = set()
        self._targets: frozenset[str] = frozenset()

    @property
    def ejected(self) -> frozenset[str]:
        """Urls ejected now (their cool-down running)."""
        return frozenset(self._ejected_until)

    def set_targets(self, urls: Collection[str]) -> None:
        """The urls in the rotation from now on; whatever was known about other urls is forgotten."""
        self._targets = frozenset(urls)
        self.failures = {url: n for url, n in self.failures.items() if url in self._targets}
        self._ejected_until = {url: t for url, t in self._ejected_until.items() if url in self._targets}
        self._trials &= self._targets
        self.probation &= self._targets
        self._update_excluded()

    def record_success(self, url: str) -> bool:
        """A response head from ``url``: its failures are forgiven. True when that ends an ejection (it was
        on probation or on trial)."""
        self.failures.pop(url, None)
        back = url in self.probation or url in self._trials
        if back:
            self._trials.discard(url)
            self.probation = self.probation - {url}
            self._update_excluded()
        return back

    def record_failure(self, url: str, now: float) -> bool:
        """A failed attempt on ``url`` at ``now``; True when it ejects ``url`` (until ``now`` plus the
        cool-down). Failures of a url that is not a target are ignored: it left the rotation already."""
        if url not in self._targets:
            return False
        count = self.failures[url] = self.failures.get(url, 0) + 1
        on_trial = url in self._trials or url in self.probation
        self._trials.discard(url)
        self.probation = self.probation - {url}
        due = on_trial or (self.max_failures > 0 and count >= self.max_failures)
        ejected = due and url not in self._ejected_until and self._others_in_rotation(url)
        if ejected:
            self._ejected_until[url] = now + self.cooldown_seconds
        self._update_excluded()
        return ejected

    def release_due(self, now: float) -> tuple[str, ...]:
        """Put the urls whose cool-down is over at ``now`` on probation; returns them, sorted."""
        due = sorted(url for url, until in self._ejected_until.items() if until <= now)
        if due:
            for url in due:
                del self._ejected_until[url]
            self.probation = self.probation | frozenset(due)
            self._update_excluded()
        return tuple(due)

    def begin_trial(self, url: str) -> None:
        """``url`` (on probation) gets its trial request now: no other request goes to it until it ends."""
        if url in self.probation:
            self.probation = self.probation - {url}
            self._trials.add(url)
            self._update_excluded()

    def abandon_trial(self, url: str) -> None:
        """The trial request of ``url`` ended without an answer either way (the client went away): the
        next request chosen for it is the trial."""
        if url in self._trials:
            self._trials.discard(url)
            self.probation = self.probation | {url}
            self._update_excluded()

    def _others_in_rotation(self, url: str) -> bool:
        return any(other != url and other not in self.excluded for other in self._targets)

    def _update_excluded(self) -> None:
        self.excluded = frozenset(self._ejected_until) | frozenset(self._trials)
