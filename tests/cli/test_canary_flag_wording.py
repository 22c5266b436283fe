"""The canary flags' refusals quote what was typed: `--max-error-rate 150%` is named as typed (not as the
1.5 it parses to), and a negative `--bake` is told it must be positive (it is a duration, only not one a
bake can be)."""

from __future__ import annotations

import pytest

from skyserve_lite.cli.canary_options import compute_canary_settings
from skyserve_lite.errors import UsageError


@pytest.mark.parametrize(
    ("bake", "rate", "message"),
    [
        (None, "150%", "--max-error-rate: must be a fraction from 0 to below 1 (0.02 or 2%), not '150%'"),
        (None, "1", "--max-error-rate: must be a fraction from 0 to below 1 (0.02 or 2%), not '1'"),
        (None, "-2%", "--max-error-rate: must be a fraction from 0 to below 1 (0.02 or 2%), not '-2%'"),
        ("-1", None, "--bake: must be a positive duration, not '-1'"),
        ("-2m", None, "--bake: must be a positive duration, not '-2m'"),
        ("soon", None, "--bake: 'soon' is not a duration, e.g. 2m, 90s or 120"),
    ],
)
def test_a_bad_flag_is_quoted_as_typed(bake: str | None, rate: str | None, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        compute_canary_settings(None, None, bake, rate)
    assert str(caught.value) == message


def test_good_values_still_parse() -> None:
    settings = compute_canary_settings(None, None, "90s", "5%")
    assert (settings.bake_seconds, settings.max_error_rate) == (90.0, 0.05)
