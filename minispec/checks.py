"""The argument checks every chapter shares, each said once (no torch: the CLI's first lines use them).

    is_int(value)                    an integer that is not a bool (True is an int to Python, not a size)
    positive_int(value, name)        an integer >= 1, else a one-line MinispecError naming `name`
    check_gamma(gamma)               the most draft tokens per verify step: positive_int(gamma, "gamma")
    returned_index(value, where, n)  what a plug-in (a policy, an engine, a batch form) returned as a count
                                     or a token id: an int in [0, n), or one MinispecError line naming `where`

A message reads `<name> = <value>; expected an integer >= 1`, plus what the value means when a
hint is given, so that the Python API and the CLI say the same thing about the same mistake.
"""

from __future__ import annotations

import sys
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


def returned_index(value, where: str, upper: int | None = None) -> int:
    """A count or token id that user code returned, as a Python int in [0, upper): an int (numpy's
    too) or a one-element integer tensor. A float is not truncated, a string not parsed, a bool not
    read as 0/1 and a 0-d tensor not kept as a tensor (it would compare unequal to every eos id):
    each is a MinispecError naming `where` and the value."""
    torch = sys.modules.get("torch")  # a tensor can only come from a process that imported torch
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() == 1 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool:
            value = int(value)
    if not is_int(value):
        raise MinispecError(f"{where} = {value!r} ({type(value).__name__}); expected an int")
    if value < 0 or (upper is not None and value >= upper):
        raise MinispecError(f"{where} = {value}; expected 0 <= {where.rsplit('.', 1)[-1]} < {upper}" if upper is not None
                            else f"{where} = {value}; expected an int >= 0")
    return int(value)
