"""Option types shared by the commands."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN and the infinities (exit 2, naming the option).

    click's own range check lets NaN through, since every comparison with NaN is false: `--timeout nan`
    would be a wait that never ends. Infinity passes a range without a maximum for the same reason a
    huge number would, yet no deadline is computed from it.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)
