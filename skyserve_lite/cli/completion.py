"""Shell completion of service names and replica ids, from the controller the command would talk to.

Completion runs on every Tab press: it must answer quickly and never print an error into the user's
prompt, so anything that goes wrong (no state directory yet, a damaged database, an unreachable host)
completes nothing.

The callbacks are named in the commands' decorators, so this module is imported by every start of the
command (`--help` too): what they read with (the api) is imported when they run, on a Tab press.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from click.shell_completion import CompletionItem

from skyserve_lite.cli.common import get_controller

if TYPE_CHECKING:
    from skyserve_lite.api import ServiceView


def _views(ctx: click.Context, names: tuple[str, ...] = ()) -> list[ServiceView]:
    try:
        return list(get_controller(ctx).get_status(names, events=0))
    except Exception:  # a Tab handler's top level: whatever fails (a remote codec mismatch too) completes nothing
        return []


def complete_service_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Names of the services that start with what was typed, the ones already on the line left out."""
    given = set(ctx.params.get("names") or ())
    names = sorted(view.service.name for view in _views(ctx))
    return [CompletionItem(name) for name in names if name.startswith(incomplete) and name not in given]


def complete_replica_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Replica ids of the service named earlier on the line (``NAME``, or the first of ``NAMES``), with
    each one's status as its help text."""
    # While an option's value is being completed click leaves the words before it unparsed, in ctx.args.
    name = ctx.params.get("name") or next(iter(ctx.params.get("names") or ctx.args), None)
    if not name:
        return []
    views = _views(ctx, (name,))
    replicas = [r for view in views for r in view.replicas]
    return [CompletionItem(str(r.replica_id), help=f"{r.status.value}, version {r.version}") for r in replicas
            if str(r.replica_id).startswith(incomplete)]
