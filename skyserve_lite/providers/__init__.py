"""Providers: one interface (``base.Provider``), a fake, and the clouds as its peers.

Cloud SDKs are imported only when their provider is built, so `sky-lite --help` stays fast and works
without them installed.
"""

from __future__ import annotations

from pathlib import Path

from skyserve_lite.clock import Clock
from skyserve_lite.providers.base import Provider

# Clouds a task may name that this build can run; `serve up` rejects the others before storing anything.
AVAILABLE_CLOUDS = ("local",)


def make_providers(home: Path, clock: Clock) -> dict[str, Provider]:
    """The providers a controller for ``home`` uses, by cloud name."""
    from skyserve_lite.providers.local import LocalProvider

    return {"local": LocalProvider(home, clock)}
