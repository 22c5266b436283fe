"""Where this machine's state directory is."""

from __future__ import annotations

import os
from pathlib import Path


def home_dir() -> Path:
    """``$SKY_LITE_HOME``, default ``~/.sky-lite``."""
    return Path(os.environ.get("SKY_LITE_HOME") or Path.home() / ".sky-lite").expanduser().resolve()
