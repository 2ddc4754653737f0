"""What the adapters of public engines share: a missing package is one line naming the recipe."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys

from minispec.errors import MinispecError

INSTALL = "see docs/conformance.md for installing it beside the pinned CPU torch"


def need(package: str) -> None:
    """One line saying the package is missing and where the recipe is; nothing is imported (an
    adapter may have to set the environment before the package's first import)."""
    if importlib.util.find_spec(package) is None:
        raise MinispecError(f"{package}: not installed; {INSTALL}")


def version(distribution: str) -> str:
    """The installed distribution's version (not every package sets __version__; a distribution's
    name may differ from its module's: medusa-llm installs medusa)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise MinispecError(f"{distribution}: not installed; {INSTALL}") from None


def modules(package: str, names: dict[str, str]) -> dict:
    """{key: module} for the package's modules, any import failure as one line (a module one of its
    imports reaches may be missing from a --no-deps install)."""
    need(package)
    try:
        return {key: importlib.import_module(name) for key, name in names.items()}
    except ImportError as err:
        raise MinispecError(f"{package}: cannot import it ({type(err).__name__}: {err}); {INSTALL}") from None


def triton_on_cpu(package: str) -> None:
    """Make Triton run its kernels on CPU tensors: TRITON_INTERPRET=1 and an empty CUDA_VISIBLE_DEVICES
    (unless already set), before Triton's first import, which is when it reads them. Where Triton (or
    `package`) was imported before without it, one line asking for it in the environment."""
    early = [m for m in ("triton", package) if m in sys.modules]
    if early and os.environ.get("TRITON_INTERPRET") != "1":
        raise MinispecError(f"{package}: {early[0]} was imported before TRITON_INTERPRET=1 was set, so its Triton "
                            "kernels cannot run on the CPU; set TRITON_INTERPRET=1 in the environment")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
