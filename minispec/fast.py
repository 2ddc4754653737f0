"""Moved to minispec.kernels (packed.py, int8.py): a re-export for callers not yet switched."""

from minispec.kernels import apply, apply_drafter
from minispec.kernels.int8 import Int8Linear  # noqa: F401
from minispec.kernels.packed import SUPPORTED_DTYPES, FastBlock, PackedLinear, packed_kernels_available  # noqa: F401


def optimize(model, weights: str = "packed"):
    return apply(model, {"packed": "fast", "int8": "int8"}[weights])


def optimize_drafter(drafter) -> None:
    model = getattr(drafter, "model", None)
    if model is not None and model.dtype in SUPPORTED_DTYPES:
        apply_drafter(drafter, "fast")
