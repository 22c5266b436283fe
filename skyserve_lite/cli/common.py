"""What every command module of the CLI shares: the state directory, the controller, error output.

Light to import (click and the standard library): `sky-lite --help` and every command's module import this,
and what a command needs (the api, rich) is imported when it runs.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from skyserve_lite.errors import SkyLiteError
from skyserve_lite.paths import home_dir

if TYPE_CHECKING:
    from rich.console import Console

    from skyserve_lite import api

__all__ = ["errors", "get_controller", "home_dir", "one_shot_collection", "stderr"]


def get_controller(ctx: click.Context | None = None) -> api.Controller:
    """The controller the command talks to: the context object tests pass as ``obj``, else this machine's
    or the recorded host's (``remote.config``), opened on first use so that commands that run the
    controller itself never depend on how to reach it. ``ctx``: the context, where click passes one
    (completion); by default the current one."""
    root = (ctx or click.get_current_context()).find_root()
    if root.obj is None:
        from skyserve_lite.remote.connect import open_controller

        root.obj = open_controller(home_dir(), os.environ)
    return root.obj  # type: ignore[no-any-return]


@contextmanager
def errors() -> Iterator[None]:
    """Turn sky-lite's own errors into one line on stderr and their exit code; no traceback."""
    try:
        yield
    except SkyLiteError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)


@contextmanager
def one_shot_collection() -> Iterator[None]:
    """No automatic garbage collection inside: for a command that reads a fleet once, prints it and exits.

    Its values (rows, views, table cells) hold no reference cycles, so a collection frees none of them, yet
    CPython starts one every 700 new objects and walks the young ones again each time, and now and then
    every object the imports left: at 10,000 replicas that was a tenth of `serve status`'s instructions and
    more of its time. The state is restored on the way out (tests call commands in one process)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True)
