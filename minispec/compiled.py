"""Moved to minispec.kernels.compiled: a re-export for callers not yet switched."""

from minispec.kernels import apply
from minispec.kernels.compiled import INDUCTOR_OPTIONS, MAX_COMPILED_ROWS, warm_up  # noqa: F401


def compile_model(model):
    return apply(model, "compiled")
