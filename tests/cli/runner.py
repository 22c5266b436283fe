"""Running the CLI in-process against an injected controller (click's context object), as the tests do."""

from __future__ import annotations

from click.testing import CliRunner

from skyserve_lite.api import Controller
from skyserve_lite.cli.main import main


class Cli:
    """``cli("serve", "status")`` -> (exit code, stdout, stderr), with ``controller`` as the CLI's controller."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def __call__(self, *args: str, input: str | None = None) -> tuple[int, str, str]:
        result = CliRunner().invoke(main, list(args), input=input, obj=self.controller)
        return result.exit_code, result.stdout, result.stderr
