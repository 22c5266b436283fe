"""The `sky-lite` command's entry point.

`sky-lite controller rpc` is what a remote client runs for every call, so it is served without loading the
command-line interface (click, rich, every command's module): it relays the call to the controller loop
(``remote.relay``), or serves it itself when no loop listens. Every other command goes to ``cli.main``.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["controller", "rpc"]:
        from skyserve_lite.paths import home_dir
        from skyserve_lite.remote.relay import relay

        home = home_dir()
        code, line = relay(home, sys.stdin.buffer, 1)
        if code is not None:
            sys.exit(code)
        from skyserve_lite.remote.server import serve_stdio  # no loop to relay to: serve it here

        sys.exit(serve_stdio(home, first_line=line))
    from skyserve_lite.cli.main import main as cli

    cli()
