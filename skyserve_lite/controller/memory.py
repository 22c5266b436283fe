"""The controller loop's garbage collection: linear in what a pass allocates, not in what the controller holds.

A pass at fleet scale keeps tens of thousands of long-lived objects (every replica row as last read, every
instance of the inventory) and allocates as many short-lived ones. CPython's full collections walk every
tracked object, and they come about once per pass once the survivors of each pass add up to a quarter of
the long-lived heap: at 50,000 replicas that walk was 240 of a steady pass's 780 ms, and the share grows with
the fleet. After each pass ``PassCollector`` moves what survived into the permanent generation
(``gc.freeze``), so collections walk only what the next pass allocates. Before freezing it collects the
young generations: the probe's event loop, sessions and tracebacks leave cyclic garbage every pass (223,000
objects over 30 passes of 500 refused probes), which frozen would stay until the next thaw. Every
``refreeze_seconds`` (a minute) it thaws everything and collects once, so that what was frozen and became
garbage since is freed: one full collection a minute instead of about one a pass.
"""

from __future__ import annotations

import gc
from collections.abc import Callable


class PassCollector:
    """Call ``after_pass()`` once per reconcile pass (``controller.loop`` does)."""

    def __init__(self, now: Callable[[], float], refreeze_seconds: float = 60.0) -> None:
        self._now = now
        self._refreeze_seconds = refreeze_seconds
        self._thawed_at = now()

    def after_pass(self) -> None:
        now = self._now()
        if now - self._thawed_at >= self._refreeze_seconds:
            gc.unfreeze()
            gc.collect()
            self._thawed_at = now
        else:
            gc.collect(1)  # the pass's own garbage, young: cheap, and not frozen with the survivors
        gc.freeze()
