"""Rich tables for people (the JSON for scripts is each value's ``to_json``). Pure: values in, renderables out.

What only one view needs (the plan's actions, file sizes) is imported by it: `serve status` imports this
module, and at 10,000 replicas every import of its start-up is paid before the first line.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from skyserve_lite.cli.common import NO_SERVICES
from skyserve_lite.cli.fit import Column, FitTable, Narrow, Trimmed
from skyserve_lite.clock import format_timestamp
from skyserve_lite.controller.fleet import find_endpoints as find_endpoints  # re-exported

if TYPE_CHECKING:
    from skyserve_lite.api import HistoryEntry, ServiceView
    from skyserve_lite.autoscalers.simulator import SimulatedDecision
    from skyserve_lite.plan.placement import LaunchPlan
    from skyserve_lite.plan.update import UpdatePlan
    from skyserve_lite.state.models import ReplicaStatus

_STATUS_STYLE = {
    "READY": "green", "REPLICA_INIT": "yellow", "CONTROLLER_INIT": "yellow", "STARTING": "yellow",
    "PROVISIONING": "yellow", "PENDING": "yellow", "NOT_READY": "red", "SHUTTING_DOWN": "magenta",
    "NO_REPLICA": "dim",
}


# Priorities below: among the columns that may give way in a narrow console, the lowest goes first (see
# ``cli.fit``). Columns without one (names, ids, URLs, statuses) are KEEP: always shown, never cut.
_DROP = Narrow.DROP
_UNDER = Narrow.UNDER
# A free-text column wraps down to this many cells before anything gives way: a block of 30 reads as text,
# where rich's own squeezing left a column of one word per line.
_FOLD = 30


def _paragraph(text: str, style: str = "") -> Trimmed:
    """Text that wraps at the console's width, without the space rich leaves at the end of each line it
    breaks (no printed line ends in spaces, ``cli.fit``)."""
    return Trimmed(Text(text, style=style))


def _titled(title: str, table: FitTable) -> Group:
    """A title on its own line: a table's own title wraps to the table's width."""
    return Group(_paragraph(title, "bold"), table)


def styled_status(status: str) -> Text:
    style = _STATUS_STYLE.get(status, "red" if status.startswith(("FAILED", "PREEMPTED")) else "")
    return Text(status, style=style)


def format_age(since: float, now: float) -> str:
    """``42s``, ``3m``, ``5h``, ``2d``: the largest whole unit."""
    seconds = max(0, int(now - since))
    if seconds >= 86400:
        return f"{seconds // 86400}d"
    if seconds >= 3600:
        return f"{seconds // 3600}h"
    if seconds >= 60:
        return f"{seconds // 60}m"
    return f"{seconds}s"


# Few services, so what gives way moves under the row rather than being dropped. With a 24-character name,
# in 120 columns: LB POLICY (11) and AUTOSCALER (49) go under, and NAME 24 + STATUS 6 + VERSION 7 +
# ENDPOINT 23 + POLICY 40 + REPLICAS 9 + 5 gaps of 2 = 119 fit; in 80 VERSION and POLICY go under too (68).
SERVICE_COLUMNS = (
    Column("NAME"), Column("STATUS"), Column("VERSION", _UNDER, priority=3), Column("ENDPOINT"),
    Column("POLICY", _UNDER, priority=4), Column("LB POLICY", _UNDER, priority=1),
    Column("REPLICAS", _UNDER, priority=5), Column("AUTOSCALER", _UNDER, priority=2),
    Column("REASON", _UNDER, priority=0, label=""),
)


def services_table(views: Sequence[ServiceView], unverified_for: float | None = None) -> Group:
    table = FitTable(SERVICE_COLUMNS)
    for view in views:
        # Counted by status, then each status asked once: 10,000 replicas are asked nothing one by one.
        by_status = Counter(map(_STATUS_OF, view.replicas))
        ready = sum(count for status, count in by_status.items() if status.value == "READY")
        live = sum(count for status, count in by_status.items() if status.is_live)
        status = styled_status(view.service.status.value)
        if unverified_for is not None:
            status.append(f" (unverified for {unverified_for:.0f}s)", style="red")
        reason = view.service.status_reason or ""
        if view.canary is not None:  # the split, the step and the measured rates (``api.CanaryView``)
            reason = "\n".join(filter(None, (reason, f"canary {view.canary.describe()}")))
        table.add_row(view.service.name, status, str(view.service.current_version), view.service.endpoint,
                      view.policy, view.load_balancing_policy, f"{ready}/{live} ready", describe_autoscaler(view),
                      reason)
    return _titled("Services", table)


_STATUS_OF = attrgetter("status")
_VERSION_OF = attrgetter("version")


def describe_autoscaler(view: ServiceView) -> str:
    """``qps 5.2 -> raw 3, target 1 (upscale delay 4/15)``: inputs, what they ask for, what is applied."""
    if view.autoscaler is None or view.autoscaler[1].policy == "fixed":
        return "-"
    state, observed = view.autoscaler
    if observed.qps is not None:
        inputs = f"qps {observed.qps:.2f}"
    elif observed.average_ongoing is not None:
        inputs = f"in-flight {observed.average_ongoing:.1f}/replica"
    else:
        inputs = "no load reported"
    held = f" ({observed.held_back})" if observed.held_back else ""
    return f"{inputs} -> raw {observed.raw_target}, target {state.target}{held}"


def replica_columns(views: Sequence[ServiceView]) -> tuple[Column, ...]:
    """Many replicas, so what gives way is dropped (``-o json`` has it all), except the reason, which moves
    under its row. VERSION goes early when every replica runs its service's current version (the services
    table says which); during a rollout it is what tells old from new, and stays longest."""
    one_version = all(set(map(_VERSION_OF, view.replicas)) <= {view.service.current_version} for view in views)
    return (
        Column("SERVICE"), Column("ID"), Column("VERSION", _DROP, priority=2 if one_version else 5),
        Column("STATUS"), Column("CLOUD/REGION", _DROP, priority=3), Column("INSTANCE", _DROP, priority=1),
        Column("URL"), Column("AGE", _DROP, priority=4), Column("REASON", _UNDER, priority=0, label=""),
    )


def replicas_table(views: Sequence[ServiceView], now: float | None = None) -> Group:
    now = time.time() if now is None else now
    table = FitTable(replica_columns(views))
    # One Text per status, shared by its rows (a table only reads its cells): at 10,000 rows a Text each
    # was a tenth of building the table.
    statuses: dict[ReplicaStatus, Text] = {}
    ages: dict[float, str] = {}  # by launch time: the replicas of a launch share it
    for view in views:
        name = view.service.name
        for r in view.replicas:
            status = statuses.get(r.status)
            if status is None:
                status = statuses[r.status] = styled_status(r.status.value)
            where = f"{r.cloud}/{r.region}" if r.region else r.cloud
            landed = f"{r.instance_type} {r.accelerator}" if r.instance_type and r.accelerator else (
                r.instance_type or r.accelerator)
            instance = f"{r.instance_id or '-'}\n{landed}" if landed else (r.instance_id or "-")
            table.add_row(name, str(r.replica_id), str(r.version), status, where, instance, r.url or "-",
                          ages.get(r.launched_at) or ages.setdefault(r.launched_at, format_age(r.launched_at, now)),
                          r.status_reason or "")
    return _titled("Replicas", table)


def events_table(view: ServiceView) -> Group:
    table = FitTable((Column("TIME"), Column("REPLICA"), Column("EVENT", _UNDER, fold_to=_FOLD, label="")))
    for event in view.events:
        table.add_row(format_timestamp(event.time) or "", "-" if event.replica_id is None else str(event.replica_id),
                      event.message)
    return _titled(f"Recent events of {view.service.name}", table)


def status_renderable(views: Sequence[ServiceView], now: float | None = None, *, events: bool = False,
                      unverified_for: float | None = None) -> Group:
    """Services and replicas; with ``events`` (one service asked for by name) its recent events too. With
    ``unverified_for`` (the controller has not completed a pass for that long) every service status says
    so: a READY that nobody could check is not claimed as READY. The columns are chosen when the value is
    printed, from the console's width (``cli.fit``): one value serves a pipe, a terminal and a live view."""
    if not views:
        return Group(Text(NO_SERVICES))
    parts: list[Group | Text] = [services_table(views, unverified_for), Text(""), replicas_table(views, now)]
    if events:
        parts.extend(item for view in views if view.events for item in (Text(""), events_table(view)))
    return Group(*parts)


def plan_renderable(plan: UpdatePlan, rollback_to: int | None = None) -> Group:
    """The update plan: a row per live replica (action, reasons) and per replica launched, the steps the
    controller takes, then the summary line. With ``rollback_to`` it is headed as the rollback it is: a
    rollback to version 1 of a service at version 2 stores version 3, and "Update ...: version 2 -> 3"
    alone read as a step forward."""
    from skyserve_lite.plan.update import ReplicaAction

    action_style = {ReplicaAction.REUSE: "green", ReplicaAction.REPLACE: "yellow", ReplicaAction.TERMINATE: "red"}
    what = "Update" if rollback_to is None else "Rollback"
    whose = "" if rollback_to is None else f"version {rollback_to}'s task, "
    title = (f"{what} {plan.service}: version {plan.from_version} -> {plan.to_version} ({whose}{plan.mode.value}), "
             f"target {plan.target_replicas} replicas")
    table = FitTable((Column("REPLICA"), Column("VERSION"), Column("ACTION"),
                      Column("REASONS", _UNDER, fold_to=_FOLD, label="")))
    for decision in plan.replicas:
        reasons = "\n".join(change.describe() for change in decision.reasons) or (
            "same replica config" if decision.action is ReplicaAction.REUSE else "")
        table.add_row(str(decision.replica_id), str(decision.version),
                      Text(decision.action.value, style=action_style[decision.action]), reasons)
    for launch in plan.launches:
        market = "spot" if launch.is_spot else "on demand"
        what = f"new replica ({market})" if launch.kept else (
            f"new replica ({market}), terminated once the spot replicas are READY")
        table.add_row(str(launch.replica_id), str(plan.to_version), Text("launch", style="cyan"), what)
    if not plan.replicas and not plan.launches:
        table.add_row("-", "-", "-", "no live replica")
    parts: list[FitTable | Trimmed] = [_paragraph(title, "bold"), table]
    if plan.canary:
        # One plan: the canary's steps with what each launches, then the promotion (the rest of the launches,
        # and the old replicas drain as in rolling). The forecast's rolling passes would launch every replica
        # in its first step, which a canary does not.
        lines = [f" {number}. {step.describe()}, then judged"
                 + (f" (launch {_ids(step.launch)})" if step.launch else "")
                 for number, step in enumerate(plan.canary, start=1)]
        stepped = {rid for step in plan.canary for rid in step.launch}
        rest = [launch.replica_id for launch in plan.launches if launch.replica_id not in stepped]
        drained = sorted({rid for step in plan.steps for rid in step.drain})
        then = ([f"launch {_ids(rest)}"] if rest else []) + (
            [f"drain {_ids(drained)} as the new replicas are READY"] if drained else [])
        lines.append(f" {len(plan.canary) + 1}. 100% (promoted)" + (": " + "; ".join(then) if then else "")
                     + f" (traffic: version {plan.to_version})")
        parts.append(_paragraph("Canary steps (each rolls back at once when judged bad):\n" + "\n".join(lines)))
    elif plan.steps:
        lines = [f" {number}. {step.describe()}" for number, step in enumerate(plan.steps, start=1)]
        parts.append(_paragraph("Steps (each once the replicas launched before it are READY):\n" + "\n".join(lines)))
    if not plan.converged:
        parts.append(_paragraph("Warning: the rollout did not settle in the forecast; the counts below are what "
                                "the controller does first.", "red"))
    for note in plan.notes:
        parts.append(_paragraph(f"Note: {note}", "yellow"))
    parts.append(_paragraph(plan.summary(), "bold"))
    return Group(*parts)


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(map(str, ids))


# MARKET gives way first: every try says its market too. In 80 columns REPLICA 7 + TRIES 62 + ZONES 58 does
# not fit, so the zones go under their try and MARKET is dropped (7 + 2 + 62 = 71); in 120 the zones fold.
LAUNCH_COLUMNS = (Column("REPLICA"), Column("MARKET", _DROP, priority=1), Column("TRIES, IN ORDER"),
                  Column("ZONES", _UNDER, priority=0, fold_to=_FOLD))


def launch_plan_renderable(plan: LaunchPlan) -> Group:
    """`serve up --dry-run`: a row per placement each replica tries, in order, then the images, what was
    left out and the total price."""
    table = FitTable(LAUNCH_COLUMNS)
    images: dict[str, None] = {}
    disks: dict[str, None] = {}
    for replica in plan.replicas:
        first = (str(replica.replica), replica.market)
        for number, placement in enumerate(replica.placements, start=1):
            table.add_row(*(first if number == 1 else ("", "")), f"{number}. {placement.describe()}",
                          ", ".join(placement.zone_order))
        if not replica.placements:
            table.add_row(*first, "-", "")
        images.update((p.describe_image(), None) for p in replica.placements if p.image is not None)
        disks.update((d, None) for p in replica.placements if (d := p.describe_disk()) is not None)
    replicas = f"{len(plan.replicas)} {'replica' if len(plan.replicas) == 1 else 'replicas'}"
    parts: list[FitTable | Trimmed] = [_paragraph(f"Launch {plan.service} on {plan.cloud}: {replicas}", "bold"),
                                      table]
    if images:
        parts.append(_paragraph("Image: " + "; ".join(images)))
    if disks:
        parts.append(_paragraph("Disk: " + "; ".join(disks)))
    if plan.envs or plan.secrets:
        parts.append(_paragraph("Environment: " + ", ".join([*plan.envs, *(f"{n} (secret)" for n in plan.secrets)])))
    if plan.files:
        parts.append(_paragraph(f"Files: {plan.files}"))
    for reason in plan.skipped:
        parts.append(_paragraph(f"Left out: {reason}", "yellow"))
    for note in plan.notes:
        parts.append(_paragraph(f"Note: {note}", "yellow"))
    price = plan.hourly_price
    if plan.cloud != "local":
        parts.append(_paragraph(f"Total: ${price:.2f}/h on the first placements" if price is not None
                                else "Total: unknown (a price is not in the catalog)", "bold"))
    parts.append(_paragraph("Dry run: nothing was stored or launched.", "dim"))
    return Group(*parts)


def describe_files(entry: HistoryEntry) -> str:
    """``sha256 9f2c1a0b (12.3 KiB)``, ``expired``, or ``-`` for a version with no local files."""
    from skyserve_lite.files.capture import format_size

    if entry.files_expired:
        return "expired"
    if entry.files_digest is None:
        return "-"
    return f"sha256 {entry.files_digest[:8]} ({format_size(entry.files_size or 0)})"


def history_table(name: str, entries: Sequence[HistoryEntry]) -> Group:
    # In 80 columns VERSION 7 + CREATED 20 + MODE 10 + FILES 26 + CHANGES 30 + 4 gaps = 101: FILES goes under
    # the row and CHANGES gets 80 - 43 = 37.
    table = FitTable((Column("VERSION"), Column("CREATED", _DROP, priority=2), Column("MODE", _DROP, priority=3),
                      Column("FILES", _UNDER, priority=1), Column("CHANGES", _UNDER, priority=9, fold_to=_FOLD,
                                                                 label="")))
    for entry in entries:
        changes = entry.summary + (f" ({entry.note})" if entry.note else "")
        table.add_row(str(entry.version), format_timestamp(entry.created_at) or "", entry.mode,
                      describe_files(entry), changes)
    return _titled(f"History of {name}", table)


def simulation_table(policy: str, decisions: Sequence[SimulatedDecision]) -> Group:
    table = FitTable((Column("TIME (s)"), Column("QPS"), Column("RAW TARGET"), Column("TARGET"),
                      Column("HELD BACK BY", _UNDER, fold_to=20, label="")))
    for d in decisions:
        table.add_row(f"{d.time_s:g}", f"{d.qps:.2f}", str(d.raw_target), str(d.target_replicas), d.held_back or "")
    return _titled(f"Simulated: {policy}", table)


def endpoint_lines(endpoints: Sequence[tuple[str, Sequence[tuple[str, bool]]]]) -> list[str]:
    """`serve status`'s `Endpoints` lines, one per service (name, its ``find_endpoints``), shown when some
    service answers on more than one host."""
    if all(len(found) <= 1 for _, found in endpoints):
        return []
    return [f"Endpoints of {name}: " + ", ".join(f"{url} ({'live' if up else 'not live'})" for url, up in found)
            for name, found in endpoints]
