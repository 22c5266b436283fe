"""Helpers for provider tests that talk to real processes on 127.0.0.1."""

from __future__ import annotations

import time
import urllib.request


def get_text(url: str, timeout: float = 10) -> str:
    """GET ``url`` until it answers (a process just started may not listen yet), up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
