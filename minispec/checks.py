"""The argument checks every chapter shares, each said once (no torch: the CLI's first lines use them).

    is_int(value)                    an integer that is not a bool (True is an int to Python, not a size)
    positive_int(value, name)        an integer >= 1, else a one-line MinispecError naming `name`
    check_gamma(gamma)               the most draft tokens per verify step: positive_int(gamma, "gamma")

A message reads `<name> = <value>; expected an integer >= 1`, plus what the value means when a
hint is given, so that the Python API and the CLI say the same thing about the same mistake.
"""

from __future__ import annotations

from numbers import Integral

from minispec.errors import MinispecError


def is_int(value) -> bool:
    """Whether `value` is an integer (a Python int, a numpy or torch integer scalar), but not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def positive_int(value, name: str, hint: str = "") -> int:
    """`value` as an int if it is an integer >= 1; else a MinispecError naming `name` (and `hint`)."""
    if not is_int(value) or value < 1:
        raise MinispecError(f"{name} = {value!r}; expected an integer >= 1" + (f" ({hint})" if hint else ""))
    return int(value)


def check_gamma(gamma) -> int:
    """gamma: the most tokens a step drafts (a chain's length, a tree's depth): an integer >= 1."""
    return positive_int(gamma, "gamma")
