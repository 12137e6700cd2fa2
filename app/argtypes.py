"""argparse types shared by app/cli.py and app/audit_cli.py: a number out of range is refused by argparse, which
names the flag and exits 2, before any work starts (a negative --threads would otherwise reach torch)."""
from __future__ import annotations

import argparse


def at_least(minimum: int):
    """An argparse `type`: an int >= `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


def positive_float(text: str) -> float:
    """An argparse `type`: a float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def fraction(text: str) -> float:
    """An argparse `type`: a float in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction 0 < x <= 1, got {text!r}") from None
    if not 0 < value <= 1:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a fraction 0 < x <= 1, got {text}")
    return value


COUNT = at_least(0)  # 0 has a meaning (none, or the default) wherever this is used
POSITIVE = at_least(1)
