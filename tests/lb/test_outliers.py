"""Passive health as a pure rule (``lb.outliers``) and which failed attempts may be sent again
(``proxy.is_retryable``): tables, no I/O. The same rules over real processes are in ``test_retries.py``."""

from __future__ import annotations

import pytest

from skyserve_lite.lb.outliers import OutlierDetector
from skyserve_lite.lb.proxy import is_retryable
from skyserve_lite.lb.upstream import UpstreamConnectError, UpstreamError, UpstreamResetError, UpstreamTimeoutError

A, B, C = "http://a", "http://b", "http://c"

# Steps: (time, action, url) with action "fail" / "ok" / "release" / "trial" / "abandon" / "targets:<urls>";
# after each step the expected (excluded, probation). 3 failures eject for 30 s.
_SCENARIOS: dict[str, list[tuple[float, str, str, set[str], set[str]]]] = {
    "three failures in a row eject": [
        (1, "fail", A, set(), set()),
        (2, "fail", A, set(), set()),
        (3, "fail", A, {A}, set()),
    ],
    "a success in between forgives": [
        (1, "fail", A, set(), set()),
        (2, "fail", A, set(), set()),
        (3, "ok", A, set(), set()),
        (4, "fail", A, set(), set()),
        (5, "fail", A, set(), set()),
    ],
    "after the cool-down a trial; its success brings it back": [
        (1, "fail", A, set(), set()),
        (2, "fail", A, set(), set()),
        (3, "fail", A, {A}, set()),
        (32.9, "release", "", {A}, set()),
        (33, "release", "", set(), {A}),
        (34, "trial", A, {A}, set()),
        (35, "ok", A, set(), set()),
        (36, "fail", A, set(), set()),  # counting from zero again
    ],
    "a failed trial ejects again at once": [
        (1, "fail", A, set(), set()),
        (2, "fail", A, set(), set()),
        (3, "fail", A, {A}, set()),
        (33, "release", "", set(), {A}),
        (34, "trial", A, {A}, set()),
        (35, "fail", A, {A}, set()),
        (64.9, "release", "", {A}, set()),
        (65, "release", "", set(), {A}),
    ],
    "an abandoned trial leaves it on probation": [
        (1, "fail", A, set(), set()),
        (2, "fail", A, set(), set()),
        (3, "fail", A, {A}, set()),
        (33, "release", "", set(), {A}),
        (34, "trial", A, {A}, set()),
        (35, "abandon", A, set(), {A}),
    ],
    "the last replica in the rotation is never ejected": [
        (1, "fail", A, set(), set()),
        (2, "fail", A, set(), set()),
        (3, "fail", A, {A}, set()),
        (4, "fail", B, {A}, set()),
        (5, "fail", B, {A}, set()),
        (6, "fail", B, {A, B}, set()),
        (7, "fail", C, {A, B}, set()),
        (8, "fail", C, {A, B}, set()),
        (9, "fail", C, {A, B}, set()),  # C would leave no replica: it stays, its failures counted
        (10, "fail", C, {A, B}, set()),
        (33, "release", "", {B}, {A}),
        (34, "fail", C, {B, C}, {A}),  # A is in the rotation again (on probation): C may go
    ],
    "leaving the targets forgets; coming back is healthy": [
        (1, "fail", A, set(), set()),
        (2, "fail", A, set(), set()),
        (3, "fail", A, {A}, set()),
        (4, "targets", f"{B},{C}", set(), set()),
        (5, "targets", f"{A},{B},{C}", set(), set()),
        (6, "fail", A, set(), set()),
    ],
    "failures of a url that is no target are ignored": [
        (1, "fail", "http://gone", set(), set()),
        (2, "fail", "http://gone", set(), set()),
        (3, "fail", "http://gone", set(), set()),
    ],
}


@pytest.mark.parametrize("steps", list(_SCENARIOS.values()), ids=list(_SCENARIOS))
def test_outlier_detector_scenarios(steps: list[tuple[float, str, str, set[str], set[str]]]) -> None:
    detector = OutlierDetector(max_failures=3, cooldown_seconds=30)
    detector.set_targets([A, B, C])
    for now, action, url, excluded, probation in steps:
        if action == "fail":
            detector.record_failure(url, now)
        elif action == "ok":
            detector.record_success(url)
        elif action == "release":
            detector.release_due(now)
        elif action == "trial":
            detector.begin_trial(url)
        elif action == "abandon":
            detector.abandon_trial(url)
        elif action == "targets":
            detector.set_targets(url.split(","))
        assert (set(detector.excluded), set(detector.probation)) == (excluded, probation), (now, action, url)


def test_outlier_detector_says_when_it_ejects_and_when_a_replica_is_back() -> None:
    detector = OutlierDetector(max_failures=2, cooldown_seconds=10)
    detector.set_targets([A, B])
    assert [detector.record_failure(A, t) for t in (1, 2, 3)] == [False, True, False]
    assert detector.release_due(11.9) == ()
    assert detector.release_due(12) == (A,)
    assert not detector.record_success(B)
    detector.begin_trial(A)
    assert detector.record_success(A)
    assert detector.failures == {}


def test_outlier_detection_off_never_ejects() -> None:
    detector = OutlierDetector(max_failures=0, cooldown_seconds=10)
    detector.set_targets([A, B])
    assert not any(detector.record_failure(A, t) for t in range(100))
    assert detector.excluded == frozenset()


# error, method, body replayable -> may be sent again
_RETRY_CASES = [
    (UpstreamConnectError("refused"), "POST", False, True),
    (UpstreamConnectError("refused"), "GET", True, True),
    (UpstreamResetError("reset"), "GET", True, True),
    (UpstreamResetError("reset"), "HEAD", True, True),
    (UpstreamResetError("reset"), "PUT", True, True),
    (UpstreamResetError("reset"), "DELETE", True, True),
    (UpstreamResetError("reset"), "OPTIONS", True, True),
    (UpstreamResetError("reset"), "POST", True, False),
    (UpstreamResetError("reset"), "PATCH", True, False),
    (UpstreamResetError("reset"), "PUT", False, False),
    (UpstreamTimeoutError("slow"), "GET", True, False),
    (UpstreamError("invalid"), "GET", True, False),
]


@pytest.mark.parametrize(("error", "method", "replayable", "expected"), _RETRY_CASES)
def test_is_retryable_table(error: UpstreamError, method: str, replayable: bool, expected: bool) -> None:
    assert is_retryable(error, method, replayable) is expected


def test_a_replica_on_trial_gets_one_request_whatever_was_chosen_before() -> None:
    """Two requests both choose the replica on probation (the second reads its body meanwhile): the first
    begins its trial, and the second goes elsewhere, so the trial is one request, as promised."""
    import asyncio
    from collections.abc import Callable

    import aiohttp

    from skyserve_lite.clock import FakeClock
    from skyserve_lite.lb.proxy import Forwarded, LoadBalancer
    from skyserve_lite.lb.upstream import PendingResponse, ResponseCallbacks, UpstreamClient, UpstreamResponse
    from skyserve_lite.state.models import LbView

    A, B = "http://127.0.0.1:9/a", "http://127.0.0.1:9/b"  # nothing is contacted: the upstream is a fake

    class Source:
        def read(self) -> LbView:
            return LbView((A, B), "round_robin")

    sent: list[str] = []
    trial_answer: asyncio.Future[None] | None = None

    class Upstream:
        async def request(self, url: str, method: str, path: str, headers: bytes,
                          body: bytes | aiohttp.StreamReader | None, upgrade: bool = False,
                          content_length: int | None = None) -> UpstreamResponse:
            sent.append(url)
            if url == A:
                assert trial_answer is not None
                await trial_answer  # the trial takes its time
            # Only where requests went counts here; a POST reset is not retried, so nothing goes anywhere else.
            raise UpstreamResetError("reset")

        def send_now(self, url: str, method: str, path: str, headers: bytes, body: bytes | None,
                     callbacks: ResponseCallbacks) -> PendingResponse | None:
            return None  # every request waits: the trial's timing is ``request``'s

        async def close(self) -> None:
            pass

    async def run() -> None:
        nonlocal trial_answer
        trial_answer = asyncio.get_running_loop().create_future()
        make: Callable[[], UpstreamClient] = Upstream
        lb = LoadBalancer("svc", Source(), None, FakeClock(0.0), upstream=make, eject_after_failures=3)
        await lb.start()
        try:
            outliers = lb._outliers
            outliers.failures = {A: 3}
            outliers.probation = frozenset({A})
            # Both requests were given A (select_target's choice while A was on probation).
            one = asyncio.ensure_future(lb.forward(A, "POST", "/", b"", b"x"))
            await asyncio.sleep(0)  # the first request begins A's trial
            other = await asyncio.wait_for(lb.forward(A, "POST", "/", b"", b"y"), 5)
            assert not isinstance(other, Forwarded)
            trial_answer.set_result(None)
            await one
        finally:
            await lb.close()

    asyncio.run(run())
    assert sent == [A, B]  # before the fix: [A, A], the second request on the first one's trial
