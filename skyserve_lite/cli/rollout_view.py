"""The live view of a rollout (`serve update/rollback --wait`, `serve wait`): one short block on stderr,
redrawn each poll, of the new and old replicas by status and what the rollout waits for."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from skyserve_lite.waits import RolloutProgress, StatusCounts


def _counts(counts: StatusCounts) -> str:
    return ", ".join(f"{n} {status.value}" for status, n in counts) or "none"


def rollout_renderable(progress: RolloutProgress, elapsed_seconds: float) -> RenderableType:
    """``web: rolling out version 4 (12s)`` with a line per side and one of what it waits for. Lines fold
    at the console's width (a long reason wraps under its label, nothing is cut)."""
    target = "deciding" if progress.target is None else str(progress.target)
    lines = [
        Text.assemble((f"{progress.name}", "bold"), f": rolling out version {progress.version} "
                      f"({elapsed_seconds:.0f}s)"),
        Text(f"  new (version {progress.version}): {progress.ready}/{target} READY; {_counts(progress.new)}"),
    ]
    if progress.old:
        lines.append(Text(f"  old: {_counts(progress.old)}"))
    lines.append(Text(f"  waiting for {progress.detail}", style="dim"))
    return Group(*lines)
