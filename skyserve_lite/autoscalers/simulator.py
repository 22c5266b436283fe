"""Run a task's autoscaling policy against a load trace, offline, with the controller's own policy code.

The trace is CSV with a header: ``time_s,qps`` and optionally ``ongoing_requests`` (in flight across the
service). Each row's values hold until the next row. One decision is simulated per decision period of the
policy, from t=0 to the last row's time; the request window at time t is the trace's rate integrated over
the 60 s before t, as the load balancer would have counted it.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skyserve_lite.autoscalers.base import Metrics
from skyserve_lite.autoscalers.dispatch import make_autoscaler
from skyserve_lite.errors import UsageError
from skyserve_lite.spec.model import ReplicaPolicy

WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class TraceRow:
    time_s: float
    qps: float
    ongoing_requests: float | None = None


@dataclass(frozen=True)
class SimulatedDecision:
    time_s: float
    qps: float
    target_replicas: int
    raw_target: int
    held_back: str | None

    def to_json(self) -> dict[str, Any]:
        time_s = int(self.time_s) if float(self.time_s).is_integer() else self.time_s
        return {"time_s": time_s, "qps": round(self.qps, 6), "target_replicas": self.target_replicas,
                "raw_target": self.raw_target, "held_back": self.held_back}


def parse_trace(text: str, source: str) -> list[TraceRow]:
    """Read a trace; ``UsageError`` names the file, line and column of anything wrong."""
    reader = csv.DictReader(io.StringIO(text))
    columns = reader.fieldnames or []
    if "time_s" not in columns or "qps" not in columns:
        raise UsageError(f"{source}: the header must name time_s and qps (and optionally ongoing_requests), "
                         f"got {','.join(columns) or 'nothing'}")
    rows: list[TraceRow] = []
    for line, record in enumerate(reader, start=2):
        values = {}
        for column in ("time_s", "qps", "ongoing_requests"):
            text_value = (record.get(column) or "").strip()
            if not text_value:
                if column == "ongoing_requests":
                    continue
                raise UsageError(f"{source}: line {line}: {column} is empty")
            try:
                values[column] = float(text_value)
            except ValueError:
                raise UsageError(f"{source}: line {line}: {column} must be a number, got {text_value!r}") from None
            if not math.isfinite(values[column]) or values[column] < 0:
                raise UsageError(f"{source}: line {line}: {column} must be a number >= 0, got {text_value!r}")
        if rows and values["time_s"] <= rows[-1].time_s:
            raise UsageError(f"{source}: line {line}: time_s must increase, got {values['time_s']:g} after "
                             f"{rows[-1].time_s:g}")
        rows.append(TraceRow(values["time_s"], values["qps"], values.get("ongoing_requests")))
    if not rows:
        raise UsageError(f"{source}: the trace has no rows")
    return rows


def _row_at(trace: Sequence[TraceRow], time_s: float) -> TraceRow | None:
    current = None
    for row in trace:
        if row.time_s > time_s:
            break
        current = row
    return current


def requests_between(trace: Sequence[TraceRow], start: float, end: float) -> float:
    """Requests the trace sends in [start, end): each row's rate holds until the next row."""
    total = 0.0
    for index, row in enumerate(trace):
        row_end = trace[index + 1].time_s if index + 1 < len(trace) else math.inf
        overlap = min(end, row_end) - max(start, row.time_s)
        if overlap > 0:
            total += row.qps * overlap
    return total


def simulate(policy: ReplicaPolicy, trace: Sequence[TraceRow], period_seconds: float | None = None
             ) -> list[SimulatedDecision]:
    autoscaler = make_autoscaler(policy, period_seconds)
    # A fixed policy has no period of its own: show it at the asked period, or the request-rate one.
    period = period_seconds or autoscaler.period_seconds or 20.0
    state = autoscaler.initial_state(version=1)
    decisions = []
    steps = int(trace[-1].time_s // period) + 1
    for step in range(steps):
        now = step * period
        row = _row_at(trace, now)
        ongoing: tuple[float, ...] = ()
        if row is not None and row.ongoing_requests is not None and state.target > 0:
            ongoing = (row.ongoing_requests / state.target,) * state.target
        # As in the controller: a decision at t counts the requests of [t - 60, t), so the one at t=0 has
        # seen none yet and a load that starts at t=0 shows from the next decision on.
        requests = requests_between(trace, now - WINDOW_SECONDS, now)
        metrics = Metrics(now=now, requests_in_window=round(requests), ongoing_requests=ongoing)
        decision = autoscaler.decide(state, metrics)
        state = decision.state
        decisions.append(SimulatedDecision(now, metrics.qps, state.target, decision.raw_target,
                                           decision.held_back))
    return decisions
