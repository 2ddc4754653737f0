"""The argument checks every chapter shares, each said once (no torch: the CLI's first lines use them).

    is_int(value)                    an integer that is not a bool (True is an int to Python, not a size)
    positive_int(value, name)        an integer >= 1, else a one-line MinispecError naming `name`
    check_gamma(gamma)               the most draft tokens per verify step: positive_int(gamma, "gamma")
    distribution(x, where)           a tensor of probabilities (last dim): real, finite, >= 0, summing to 1
    counts(x, where)                 a tensor of outcome counts: integers >= 0
    same_shape(a, b, where)          two tensors compared cell by cell: no broadcasting

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


def distribution(x, where: str, atol: float = 1e-6):
    """x as float64 if it is a tensor of probabilities along its last dim (real, finite, >= 0, each
    row summing to 1 within atol); else a MinispecError naming `where`. No clamp: a nan is refused,
    never turned into a best-possible 0."""
    import torch

    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.is_complex() or x.dtype == torch.bool:
        raise MinispecError(f"{where}: {type(x).__name__}; expected a real tensor of probabilities")
    x = x.to(torch.float64)
    if not bool(torch.isfinite(x).all()) or bool((x < 0).any()):
        raise MinispecError(f"{where}: holds a negative, nan or infinite value; expected probabilities >= 0")
    worst = float((x.sum(-1) - 1).abs().max())
    if worst > atol:
        raise MinispecError(f"{where}: a row sums to 1 {'+' if float(x.sum(-1).max()) > 1 else '-'} {worst:.3g}; "
                            "expected probabilities summing to 1")
    return x


def counts(x, where: str):
    """x as float64 if it is a tensor of counts (whole numbers >= 0); else a MinispecError naming `where`."""
    import torch

    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.is_complex() or x.dtype == torch.bool:
        raise MinispecError(f"{where}: {type(x).__name__}; expected a tensor of counts")
    x = x.to(torch.float64)
    if not bool(torch.isfinite(x).all()) or bool((x < 0).any()) or bool((x != x.round()).any()):
        raise MinispecError(f"{where}: holds a negative, fractional or non-finite value; expected whole counts >= 0")
    return x


def same_shape(a, b, where: str) -> None:
    """Refuse, naming `where`, two tensors a cell-by-cell comparison would otherwise broadcast."""
    if not hasattr(a, "shape") or not hasattr(b, "shape"):
        raise MinispecError(f"{where}: {type(a).__name__} and {type(b).__name__}; expected two tensors")
    if tuple(a.shape) != tuple(b.shape):
        raise MinispecError(f"{where}: shapes {list(a.shape)} and {list(b.shape)}; expected the same shape "
                            "(compared cell by cell, never broadcast)")
