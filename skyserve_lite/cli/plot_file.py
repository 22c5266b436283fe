"""`serve simulate --plot-file`: the chart of ``cli.chart`` as a PNG image, drawn by matplotlib.

matplotlib is an optional dependency (the ``plot`` extra) and is imported only by ``write_plot_png``: every
other command, and `serve simulate` without ``--plot-file``, runs without it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from skyserve_lite.autoscalers.simulator import SimulatedDecision
from skyserve_lite.cli.chart import Hold, find_hold, time_span
from skyserve_lite.errors import UsageError

DEFAULT_SIZE = (1200, 600)
MIN_SIDE, MAX_SIDE = 200, 10000
MISSING_MATPLOTLIB = "--plot-file needs matplotlib: pip install 'skyserve-lite[plot]'"
# Pixels per inch of the figure: the image is exactly (width, height) pixels because figsize is set to
# (width / DPI, height / DPI) inches and saved at DPI, without bbox_inches='tight' (which would crop it).
DPI = 100


def parse_plot_size(text: str) -> tuple[int, int]:
    """``"1200x600"`` -> (1200, 600). ``UsageError`` unless both are whole numbers of pixels within
    [MIN_SIDE, MAX_SIDE] (smaller leaves no room for the axes; larger is hundreds of megabytes of pixels)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None:
        raise UsageError(f"--plot-size: expected WIDTHxHEIGHT in pixels, e.g. 1200x600, got {text!r}")
    width, height = int(match[1]), int(match[2])
    if not (MIN_SIDE <= width <= MAX_SIDE and MIN_SIDE <= height <= MAX_SIDE):
        raise UsageError(f"--plot-size: each side must be {MIN_SIDE}-{MAX_SIDE} pixels, got {width}x{height}")
    return width, height


def write_plot_png(decisions: Sequence[SimulatedDecision], path: Path, size: tuple[int, int] = DEFAULT_SIZE,
                   title: str = "") -> None:
    """Draw qps and the replica target over time into a PNG of exactly ``size`` pixels at ``path``,
    replacing the file. Raises ``UsageError`` when matplotlib is not installed or the file cannot be
    written."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(MISSING_MATPLOTLIB) from None
    matplotlib.use("Agg")  # no display: the image goes to a file, never a window
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    width, height = size
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    load, replicas = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    # Each decision holds until the next, the last one for a period, as in the text chart: steps drawn from
    # each point onward ("post"), with the last value repeated at the end of the span.
    times = [d.time_s for d in decisions] + [time_span(decisions)[1]]
    load.step(times, [d.qps for d in decisions] + [decisions[-1].qps], where="post", color="tab:blue",
              label="qps")
    load.set_ylabel("qps")
    load.set_ylim(bottom=0)
    load.grid(alpha=0.3)
    replicas.step(times, [d.target_replicas for d in decisions] + [decisions[-1].target_replicas], where="post",
                  color="black", label="target replicas")
    for hold, marker, color, label in ((Hold.UPSCALE, "^", "tab:red", "raw target held back by the upscale delay"),
                                       (Hold.DOWNSCALE, "v", "tab:green",
                                        "raw target held back by the downscale delay")):
        held = [d for d in decisions if find_hold(d) is hold]
        if held:
            replicas.scatter([d.time_s for d in held], [d.raw_target for d in held], marker=marker, color=color,
                             label=label, zorder=3)
    replicas.set_ylabel("replicas")
    replicas.set_xlabel("time (s)")
    replicas.yaxis.set_major_locator(MaxNLocator(integer=True))  # no 1.5 replicas
    replicas.grid(alpha=0.3)
    replicas.legend(loc="best", fontsize="small")
    if title:
        figure.suptitle(title)
    figure.set_layout_engine("constrained")
    try:
        figure.savefig(path, dpi=DPI, format="png")
    except OSError as exc:
        raise UsageError(f"--plot-file: cannot write {path}: {exc}") from exc
