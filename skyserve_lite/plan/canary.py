"""Canary rollouts, decided: the settings, the judge over per-version counts, and one step per pass.

A canary update gives the new version a share of the traffic in steps (10% then 50%, say), bakes each step
for ``bake_seconds`` and judges it on what the load balancer saw of each version in that window; it passes
to the next step, is promoted (100%, the old replicas drain as in a rolling update) after the last, or is
rolled back. Nothing here reads a clock or a store: the step and its window start are values the controller
stores, so a controller that restarts mid-canary continues from them.

Worked numbers (target 4 replicas, steps 10 and 50, bake 2m, limit 2%, at least 50 requests):
- step 1: ceil(4 x 10%) = 1 new replica is launched; once it is READY it takes 10% of the requests for 2m.
  160 requests reached it, 12 answered 5xx: 7.5% > 2% while the old version answered 0.4%: rolled back,
  ``version 4 rolled back: 5xx 7.5% (12/160) over 2m at 10%, limit 2%``.
- had 2 of those 160 failed (1.3%), step 2 launches ceil(4 x 50%) = 2 new replicas in all (one more),
  then 50%; passing that, 100%: the new version goes to 4 replicas and the 4 old ones drain as in rolling.
- only 30 requests in a window: too few to judge (< 50), the bake is extended by one window, up to
  ``max_extensions`` times; then the rollout pauses until a person runs `serve rollout NAME promote|abort`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

DEFAULT_STEPS = (10, 50)
DEFAULT_BAKE_SECONDS = 120.0
DEFAULT_MAX_ERROR_RATE = 0.02
# Under 50 requests one error is already 2%: a window that small cannot tell a 2% limit from noise.
DEFAULT_MIN_REQUESTS = 50
# Three more windows (8 minutes in all at a 2m bake) before a person is asked to decide.
DEFAULT_MAX_EXTENSIONS = 3
# The longest window a step may be judged over, extensions included: the per-version counts are kept 62
# minutes (``state.history.REQUEST_COUNTS_KEEP_SECONDS``), so a 30m bake extended 3 times (2h) would be
# judged on its last hour only while its reason says "over 2h".
MAX_WINDOW_SECONDS = 3600.0


@dataclass(frozen=True)
class CanarySettings:
    """How a canary update proceeds: traffic ``steps`` in percent (each above the last, below 100), the bake
    window of each step, the error rate above which the new version is rolled back, the requests a window
    needs before it is judged, and how many times a window too small is extended before a person decides."""

    steps: tuple[int, ...] = DEFAULT_STEPS
    bake_seconds: float = DEFAULT_BAKE_SECONDS
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    min_requests: int = DEFAULT_MIN_REQUESTS
    max_extensions: int = DEFAULT_MAX_EXTENSIONS

    def to_json(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "bake_seconds": self.bake_seconds, "max_error_rate": self.max_error_rate,
                "min_requests": self.min_requests, "max_extensions": self.max_extensions}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CanarySettings:
        """The settings ``to_json`` gave; a field missing takes its default."""
        return cls(steps=tuple(int(s) for s in data.get("steps", DEFAULT_STEPS)),
                   bake_seconds=float(data.get("bake_seconds", DEFAULT_BAKE_SECONDS)),
                   max_error_rate=float(data.get("max_error_rate", DEFAULT_MAX_ERROR_RATE)),
                   min_requests=int(data.get("min_requests", DEFAULT_MIN_REQUESTS)),
                   max_extensions=int(data.get("max_extensions", DEFAULT_MAX_EXTENSIONS)))


def find_settings_problem(settings: CanarySettings) -> tuple[str, str] | None:
    """(field, problem) of the first invalid setting, or None. The CLI and the spec parser name the field
    their own way (``--steps``, ``service.canary.steps``)."""
    steps = settings.steps
    if not steps:
        return "steps", "needs at least one step, e.g. 10,50"
    if any(not 0 < s < 100 for s in steps):
        return "steps", f"each step is a percentage above 0 and below 100 (100 is the promotion), not {list(steps)}"
    if any(b <= a for a, b in itertools.pairwise(steps)):
        return "steps", f"steps must increase, not {list(steps)}"
    if not settings.bake_seconds > 0 or math.isinf(settings.bake_seconds):
        return "bake", f"must be a positive duration, not {settings.bake_seconds:g}s"
    longest = settings.bake_seconds * (1 + max(0, settings.max_extensions))
    if longest > MAX_WINDOW_SECONDS:
        return "bake", (f"{format_seconds(settings.bake_seconds)} extended up to {settings.max_extensions} times "
                        f"is a window of {format_seconds(longest)}: at most 60m (the counts it is judged on are "
                        "kept an hour)")
    if not 0 <= settings.max_error_rate < 1:
        return "max_error_rate", f"must be a fraction from 0 to below 1 (0.02 is 2%), not {settings.max_error_rate:g}"
    if settings.min_requests < 1:
        return "min_requests", f"must be at least 1, not {settings.min_requests}"
    if settings.max_extensions < 0:
        return "max_extensions", f"must be 0 or more, not {settings.max_extensions}"
    return None


def find_canary_settings(section: CanarySettings | None, given: CanarySettings | None = None, *,
                         steps: tuple[int, ...] | None = None, bake_seconds: float | None = None,
                         max_error_rate: float | None = None) -> CanarySettings:
    """The settings a canary (or an update watched with `--auto-rollback`) runs with, the one rule the CLI, the
    API, the dry run and the controller share: each of the flags ``steps``, ``bake_seconds``,
    ``max_error_rate`` given over ``given`` (settings an API caller decided whole: the CLI passes its flags
    read over the section), else over ``section`` (the task's `service.canary`), else over the defaults.
    A section of bake 5m with ``--steps 20`` runs steps (20,) baked 5m; ``given`` replaces the section whole
    (its bake, not the section's, even where it kept the default 2m). Not checked (``find_settings_problem``)."""
    settings = given if given is not None else section if section is not None else CanarySettings()
    if steps is not None:
        settings = replace(settings, steps=steps)
    if bake_seconds is not None:
        settings = replace(settings, bake_seconds=bake_seconds)
    if max_error_rate is not None:
        settings = replace(settings, max_error_rate=max_error_rate)
    return settings


# --- the judge ---------------------------------------------------------------------------------------------

STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "failed")  # "failed": no answer at all (refused, reset, timeout)


@dataclass(frozen=True)
class VersionCounts:
    """What the load balancer saw of one version over a window: requests by the class of their outcome."""

    requests: int = 0
    errors_5xx: int = 0
    failed: int = 0  # attempts that got no answer from the replica

    @property
    def errors(self) -> int:
        return self.errors_5xx + self.failed

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @classmethod
    def of_classes(cls, by_class: dict[str, int]) -> VersionCounts:
        return cls(requests=sum(by_class.values()), errors_5xx=by_class.get("5xx", 0), failed=by_class.get("failed", 0))


def compute_counts(counts: Mapping[int, Mapping[str, int]], version: int) -> tuple[VersionCounts, VersionCounts]:
    """(the new version's, every other version's summed) counts of the window."""
    old: dict[str, int] = {}
    for other, by_class in counts.items():
        if other != version:
            for status_class, n in by_class.items():
                old[status_class] = old.get(status_class, 0) + n
    return VersionCounts.of_classes(dict(counts.get(version, {}))), VersionCounts.of_classes(old)


class VerdictKind(str, Enum):
    PASS = "pass"  # the step is good: go on
    FAIL = "fail"  # roll back
    EXTEND = "extend"  # not enough to judge yet: bake one more window
    PAUSE = "pause"  # still not enough after every extension: a person decides


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    reason: str


def format_percent(fraction: float) -> str:
    """0.075 -> "7.5%", 0.02 -> "2%"."""
    text = f"{fraction * 100:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + "%"


def format_seconds(seconds: float) -> str:
    """120 -> "2m", 90 -> "90s", 3600 -> "60m"."""
    whole = round(seconds)
    return f"{whole // 60}m" if whole >= 60 and whole % 60 == 0 else f"{whole}s"


def judge_canary(version: int, new: VersionCounts, old: VersionCounts, readiness_failures: int,
                 settings: CanarySettings, percent: int, window_seconds: float, extensions: int,
                 where: str | None = None) -> Verdict:
    """The verdict on one bake window of ``version`` at ``percent`` of the traffic.

    Fails on any readiness failure of its replicas, or when its error rate (5xx answers and failed attempts
    over its requests) is above ``max_error_rate`` while the old version's own rate is not. When both are
    above the limit and the new one is not worse than the old by more than the limit, the backend is failing
    everywhere: nothing is blamed on the new version, the window is inconclusive, as a window with fewer
    than ``min_requests`` requests is. An inconclusive window is extended ``max_extensions`` times, then the
    rollout pauses for a person. ``where`` names the window in the reasons instead of ``at {percent}%``.
    """
    at = where or f"at {percent}%"
    if readiness_failures:
        noun = "replica" if readiness_failures == 1 else "replicas"
        return Verdict(VerdictKind.FAIL, f"version {version} rolled back: {readiness_failures} {noun} failed "
                                         f"before becoming ready {at}")
    limit = settings.max_error_rate
    over = format_seconds(window_seconds)
    inconclusive: str | None = None
    if new.requests < settings.min_requests:
        inconclusive = (f"version {version}: {new.requests} requests over {over} {at}, "
                        f"fewer than the {settings.min_requests} needed to judge")
    elif new.error_rate > limit:
        measured = f"{format_percent(new.error_rate)} ({new.errors}/{new.requests})"
        baseline_failing = old.requests >= settings.min_requests and old.error_rate > limit
        if not (baseline_failing and new.error_rate <= old.error_rate + limit):
            return Verdict(VerdictKind.FAIL, f"version {version} rolled back: 5xx {measured} over {over} {at}, "
                                             f"limit {format_percent(limit)}")
        inconclusive = (f"version {version}: 5xx {measured} over {over} {at}, but the old version answers "
                        f"{format_percent(old.error_rate)} ({old.errors}/{old.requests}) too: not blamed on it")
    if inconclusive is None:
        return Verdict(VerdictKind.PASS, f"version {version} passed {at}: 5xx {format_percent(new.error_rate)} "
                                         f"({new.errors}/{new.requests}) over {over}, limit {format_percent(limit)}")
    if extensions < settings.max_extensions:
        return Verdict(VerdictKind.EXTEND, f"{inconclusive}; baking {format_seconds(settings.bake_seconds)} more "
                                           f"({extensions + 1} of {settings.max_extensions})")
    times = f"{settings.max_extensions} extension" + ("" if settings.max_extensions == 1 else "s")
    return Verdict(VerdictKind.PAUSE, f"{inconclusive}; paused after {times}: "
                                      "`serve rollout NAME promote` or `abort`")


# --- the steps ---------------------------------------------------------------------------------------------


class CanaryPhase(str, Enum):
    STEPPING = "stepping"  # at ``step``: launching its replicas, then baking
    PROMOTED = "promoted"  # 100%: the old replicas drain as in a rolling update
    ROLLED_BACK = "rolled_back"  # traffic back on the old version; the new replicas drain
    NOTHING_TO_JUDGE = "nothing_to_judge"  # every replica reused: the new version runs the old config
    WATCHING = "watching"  # a rolling or blue-green update with --auto-rollback (``plan_watch_step``)


@dataclass(frozen=True)
class CanaryState:
    """A canary rollout as stored: the step it is at (an index into ``settings.steps``), when that step's bake
    window started (None: its replicas are not all READY yet), how many times the window was extended,
    whether a person paused it, and the last verdict."""

    version: int
    settings: CanarySettings = field(default_factory=CanarySettings)
    phase: CanaryPhase = CanaryPhase.STEPPING
    step: int = 0
    window_start: float | None = None
    extensions: int = 0
    paused: bool = False
    verdict: str | None = None

    @property
    def percent(self) -> int:
        """The new version's share of the traffic once its replicas for the step are READY."""
        if self.phase is CanaryPhase.ROLLED_BACK:
            return 0
        if self.phase is not CanaryPhase.STEPPING:  # a watched update has no split
            return 100
        return self.settings.steps[self.step]

    @property
    def is_done(self) -> bool:
        return self.phase not in (CanaryPhase.STEPPING, CanaryPhase.WATCHING)

    @property
    def window_seconds(self) -> float:
        """The bake window of the step as planned, a whole bake longer per extension (2m extended twice: 6m)."""
        return self.settings.bake_seconds * (1 + self.extensions)


@dataclass(frozen=True)
class CanaryStart:
    """The rollout a submitted version starts with: a canary (``watch`` False, 0% until its first step's
    replicas are READY) or the watch of a rolling or blue-green update with `--auto-rollback` (100%, the
    mode's own traffic). Stored with the version in the same transaction (``Store.add_version``): a crash
    between two writes would start the rollout from the task's `service.canary` and lose the flags."""

    settings: CanarySettings
    watch: bool = False

    def state_of(self, version: int) -> CanaryState:
        return CanaryState(version, self.settings, phase=CanaryPhase.WATCHING if self.watch else
                           CanaryPhase.STEPPING)

    @property
    def percent(self) -> int:
        return 100 if self.watch else 0


class CanaryAction(str, Enum):
    WAIT_READY = "wait_ready"  # the step's new replicas are launching; traffic as at the step before
    START_BAKE = "start_bake"  # they are READY: the split moves to the step's share, the window starts
    BAKE = "bake"  # inside the window
    EXTEND = "extend"
    ADVANCE = "advance"
    PROMOTE = "promote"
    ROLL_BACK = "roll_back"
    PAUSED = "paused"
    DONE = "done"


class Command(str, Enum):
    """What a person asked (`serve rollout NAME ...`)."""

    PROMOTE = "promote"
    ABORT = "abort"
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True)
class CanaryInputs:
    """What one pass knows of a canary rollout: the replicas of each side, the counts of the window."""

    target: int  # the replicas the service wants in all
    new_ready: int  # READY replicas of the new version
    readiness_failures: int  # new-version replicas that failed before becoming READY
    new_counts: VersionCounts = VersionCounts()
    old_counts: VersionCounts = VersionCounts()
    config_changed: bool = True  # False: every replica is reused, the new version runs the old config
    command: Command | None = None


@dataclass(frozen=True)
class CanaryDecision:
    action: CanaryAction
    state: CanaryState  # to store (the same value when nothing changed)
    new_replicas: int  # replicas of the new version wanted now
    percent: int  # the new version's share of the traffic now (0: old only; 100: new only)
    message: str | None = None  # an event, when something was decided


def compute_step_replicas(target: int, percent: int) -> int:
    """Replicas of the new version for ``percent`` of ``target``: rounded up, at least one (10% of 4 is
    0.4, one replica; 50% of 5 is 2.5, three)."""
    return max(1, math.ceil(target * percent / 100)) if percent < 100 else target


def plan_canary_step(state: CanaryState, inputs: CanaryInputs, now: float) -> CanaryDecision:
    """The next step of a canary rollout: one decision per pass; the returned state is stored.

    Before a step's window starts the new version keeps the share of the step before (0 at the first), so a
    replica still starting is never sent the new share. A readiness failure rolls back at once; the window
    is judged only once it is over (``judge_canary``). A person's command comes first: promote and abort
    act at once, pause holds the split where it is, resume continues with a fresh window (from this pass
    when the step's replicas are READY, so the share never drops).
    """
    version = state.version
    settings = state.settings
    if state.is_done:
        return _decided(CanaryAction.DONE, state, inputs.target)
    if not inputs.config_changed:
        done = replace(state, phase=CanaryPhase.NOTHING_TO_JUDGE, verdict="every replica reused: nothing to judge")
        return _decided(CanaryAction.DONE, done, inputs.target,
                        f"version {version} reuses every replica (same replica config): nothing to judge, it is "
                        "current at once")
    command = inputs.command
    if command is Command.PROMOTE:
        return _promote(state, inputs, "promoted by an operator")
    if command is Command.ABORT:
        return _roll_back(state, inputs, f"version {version} rolled back: aborted by an operator "
                                         f"at {state.percent}%")
    if command is Command.PAUSE and not state.paused:
        paused = replace(state, paused=True)
        return _stepping(CanaryAction.PAUSED, paused, inputs, f"version {version} paused at {state.percent}%")
    if command is Command.RESUME and state.paused:
        # The fresh window starts in this very pass when the step's replicas are READY: restarting it a pass
        # later would hand the share of the step before (0% at the first step, 10% at a 50% one) for that
        # pass, so a resume would take the new version out of traffic that a pause held.
        ready = inputs.new_ready >= compute_step_replicas(inputs.target, state.percent)
        resumed = replace(state, paused=False, window_start=now if ready else None, extensions=0)
        fresh = f"; a fresh window of {format_seconds(settings.bake_seconds)}" if ready else ""
        return _stepping(CanaryAction.START_BAKE if ready else CanaryAction.WAIT_READY, resumed, inputs,
                         f"version {version} resumed at {state.percent}%{fresh}")
    if inputs.readiness_failures:
        verdict = judge_canary(version, inputs.new_counts, inputs.old_counts, inputs.readiness_failures, settings,
                               state.percent, 0.0, state.extensions)
        return _roll_back(state, inputs, verdict.reason)
    if state.paused:
        return _stepping(CanaryAction.PAUSED, state, inputs)
    wanted = compute_step_replicas(inputs.target, state.percent)
    if state.window_start is None:
        if inputs.new_ready < wanted:
            return _stepping(CanaryAction.WAIT_READY, state, inputs)
        started = replace(state, window_start=now)
        return _stepping(CanaryAction.START_BAKE, started, inputs,
                         f"version {version} takes {state.percent}% of the traffic for "
                         f"{format_seconds(settings.bake_seconds)}")
    # The window as planned (an extended one is a whole bake longer per extension), not as measured: a
    # pass that comes 1 s late should not make "over 2m" read "over 121s".
    window = state.window_seconds
    if now - state.window_start < window:
        return _stepping(CanaryAction.BAKE, state, inputs)
    verdict = judge_canary(version, inputs.new_counts, inputs.old_counts, 0, settings, state.percent, window,
                           state.extensions)
    if verdict.kind is VerdictKind.FAIL:
        return _roll_back(state, inputs, verdict.reason)
    if verdict.kind is VerdictKind.EXTEND:
        return _stepping(CanaryAction.EXTEND, replace(state, extensions=state.extensions + 1,
                                                      verdict=verdict.reason), inputs, verdict.reason)
    if verdict.kind is VerdictKind.PAUSE:
        return _stepping(CanaryAction.PAUSED, replace(state, paused=True, verdict=verdict.reason), inputs,
                         verdict.reason)
    if state.step + 1 >= len(settings.steps):
        return _promote(state, inputs, verdict.reason)
    advanced = replace(state, step=state.step + 1, window_start=None, extensions=0, verdict=verdict.reason)
    return _stepping(CanaryAction.ADVANCE, advanced, inputs,
                     f"{verdict.reason}; next: {settings.steps[state.step + 1]}%")


def _stepping(action: CanaryAction, state: CanaryState, inputs: CanaryInputs,
              message: str | None = None) -> CanaryDecision:
    """A decision within a step: the step's replicas, and its share once its window started (before, the
    share of the step before it)."""
    steps = state.settings.steps
    wanted = compute_step_replicas(inputs.target, steps[state.step])
    started = state.window_start is not None
    percent = steps[state.step] if started else (steps[state.step - 1] if state.step else 0)
    return CanaryDecision(action, state, wanted, percent, message)


def _promote(state: CanaryState, inputs: CanaryInputs, why: str) -> CanaryDecision:
    promoted = replace(state, phase=CanaryPhase.PROMOTED, paused=False, verdict=why)
    return CanaryDecision(CanaryAction.PROMOTE, promoted, inputs.target, 100,
                          f"version {state.version} promoted to 100%: {why}")


def _roll_back(state: CanaryState, inputs: CanaryInputs, reason: str) -> CanaryDecision:
    rolled = replace(state, phase=CanaryPhase.ROLLED_BACK, paused=False, verdict=reason)
    return CanaryDecision(CanaryAction.ROLL_BACK, rolled, 0, 0, reason)


def _decided(action: CanaryAction, state: CanaryState, target: int, message: str | None = None) -> CanaryDecision:
    if state.phase is CanaryPhase.ROLLED_BACK:
        return CanaryDecision(action, state, 0, 0, message)
    return CanaryDecision(action, state, target, 100, message)


@dataclass(frozen=True)
class CanaryStepPreview:
    """One step of a canary as `serve update --dry-run` shows it: the share, the new version's replicas for
    it, its bake window (a good window each time; the last step is followed by 100%) and the replicas the
    step launches (ids; reused replicas and those of the steps before count towards ``new_replicas``)."""

    percent: int
    new_replicas: int
    bake_seconds: float
    launch: tuple[int, ...] = ()

    def describe(self) -> str:
        noun = "replica" if self.new_replicas == 1 else "replicas"
        return f"{self.percent}% on {self.new_replicas} new {noun}, bake {format_seconds(self.bake_seconds)}"


@dataclass(frozen=True)
class CanaryPreview:
    """What a canary will do, as ``plan_canary_step`` decides it pass after pass: its steps, or (no step)
    the message of a rollout that is over at its first pass (every replica reused: nothing to judge)."""

    steps: tuple[CanaryStepPreview, ...] = ()
    done: str | None = None


# Each step takes a few passes in the model (launch, READY and the window starts, judged): 4 per step
# leaves room; the bound only stops a planner bug from looping forever.
_PREVIEW_PASSES_PER_STEP = 4


def plan_canary_preview(version: int, target: int, settings: CanarySettings, *, config_changed: bool = True,
                        reused: int = 0, launch_ids: tuple[int, ...] = ()) -> CanaryPreview:
    """The canary of ``version`` to ``target`` replicas as the controller runs it, when every replica is
    READY a pass after its launch and every window is judged good: ``plan_canary_step`` itself, pass after
    pass. Target 4, steps 10, 50 -> 10% on 1 (one launched), 50% on 2 (one more); with ``config_changed``
    False (every replica reused) no step at all: nothing to judge. ``reused``: replicas of the new version
    at the start; ``launch_ids``: the ids the launched replicas take, in launch order."""
    state = CanaryState(version, settings)
    have, launched = reused, 0
    steps: list[CanaryStepPreview] = []
    ids = iter(launch_ids)
    now = 0.0
    good = VersionCounts(requests=settings.min_requests)
    for _ in range(_PREVIEW_PASSES_PER_STEP * (len(settings.steps) + 1)):
        inputs = CanaryInputs(target=target, new_ready=have, readiness_failures=0, new_counts=good,
                              config_changed=config_changed)
        decision = plan_canary_step(state, inputs, now)
        if decision.action is CanaryAction.DONE and not steps:
            return CanaryPreview(done=decision.message)
        if decision.action in (CanaryAction.DONE, CanaryAction.PROMOTE, CanaryAction.ROLL_BACK):
            break
        if decision.action is CanaryAction.START_BAKE:
            taken = tuple(itertools.islice(ids, launched))
            steps.append(CanaryStepPreview(decision.percent, decision.new_replicas, settings.bake_seconds, taken))
            launched = 0
        elif decision.action in (CanaryAction.BAKE, CanaryAction.EXTEND, CanaryAction.PAUSED):
            break  # a good window in the model never extends or pauses; a bug rather than a loop
        # Launched in this pass, READY in the next; a started window is judged a bake later.
        launched += max(0, decision.new_replicas - have)
        have = max(have, decision.new_replicas)
        if decision.state.window_start is not None:
            now = decision.state.window_start + settings.bake_seconds
        state = decision.state
    return CanaryPreview(steps=tuple(steps))


# --- a rolling or blue-green update watched for an automatic rollback (`--auto-rollback`) ---------------

WATCHED = "after taking traffic"


@dataclass(frozen=True)
class WatchInputs:
    """What one pass knows of a watched rolling or blue-green update."""

    taking_traffic: bool  # READY replicas of the new version are among the versions the load balancer serves
    failures: int  # its replicas that failed before becoming READY
    launch_blocked: bool  # that many that launching stopped (the failure limit)
    new_counts: VersionCounts = VersionCounts()
    old_counts: VersionCounts = VersionCounts()


def plan_watch_step(state: CanaryState, inputs: WatchInputs, now: float) -> CanaryDecision:
    """The next step of watching a rolling or blue-green update (phase ``WATCHING``): rolled back when its
    replicas keep failing before READY (launching stopped), or when its error rate over one bake window from
    the moment it takes traffic is judged bad (``judge_canary``, against the old version's rate too). A
    good window ends the watch; too few requests extend it up to ``max_extensions`` times, then the watch
    ends unjudged (the update goes on: it is not held for a person as a canary is). Traffic and replicas
    are the mode's own: ``percent`` is 100 and ``new_replicas`` 0, unused."""
    version, settings = state.version, state.settings
    if state.phase is not CanaryPhase.WATCHING:
        return CanaryDecision(CanaryAction.DONE, state, 0, 100)
    if inputs.launch_blocked:
        noun = "replica" if inputs.failures == 1 else "replicas"
        reason = f"version {version} rolled back: {inputs.failures} {noun} failed before becoming ready"
        return CanaryDecision(CanaryAction.ROLL_BACK, replace(state, phase=CanaryPhase.ROLLED_BACK, verdict=reason),
                              0, 0, reason)
    if state.window_start is None:
        if not inputs.taking_traffic:
            return CanaryDecision(CanaryAction.WAIT_READY, state, 0, 100)
        return CanaryDecision(CanaryAction.START_BAKE, replace(state, window_start=now), 0, 100,
                              f"version {version} takes traffic: watched for {format_seconds(settings.bake_seconds)},"
                              f" rolled back above {format_percent(settings.max_error_rate)} errors")
    window = state.window_seconds
    if now - state.window_start < window:
        return CanaryDecision(CanaryAction.BAKE, state, 0, 100)
    verdict = judge_canary(version, inputs.new_counts, inputs.old_counts, 0, settings, 100, window, state.extensions,
                           where=WATCHED)
    if verdict.kind is VerdictKind.FAIL:
        return CanaryDecision(CanaryAction.ROLL_BACK, replace(state, phase=CanaryPhase.ROLLED_BACK,
                                                              verdict=verdict.reason), 0, 0, verdict.reason)
    if verdict.kind is VerdictKind.EXTEND:
        return CanaryDecision(CanaryAction.EXTEND, replace(state, extensions=state.extensions + 1,
                                                           verdict=verdict.reason), 0, 100, verdict.reason)
    ended = "not judged, too few requests" if verdict.kind is VerdictKind.PAUSE else "passed"
    reason = verdict.reason if verdict.kind is VerdictKind.PASS else f"version {version}: watch ended {ended}"
    return CanaryDecision(CanaryAction.DONE, replace(state, phase=CanaryPhase.PROMOTED, verdict=reason), 0, 100,
                          reason)
