"""Room on disk: a conversion checks it before it writes, so that a full disk is one line up
front instead of a failure after minutes of work. And the user's cache folder, where an
installed minispec keeps what it makes (checkpoints, the kernel probe's answers).

The check is a bound, not a guarantee (another process may fill the disk meanwhile): the
writers still turn a failed write into one line and remove what they wrote.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from minispec.errors import CheckpointError

MiB = 2**20
HEADROOM = 64 * MiB  # on top of what a writer knows it writes: config, tokenizer, the file system's own


def free_bytes(folder: Path) -> int:
    """Bytes free on the file system that holds `folder` (or, if it does not exist yet, its nearest existing parent)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def require_free(folder: Path, needed: int, what: str, fix: str, shown_as: Path | None = None) -> None:
    """CheckpointError if fewer than `needed` + HEADROOM bytes are free where `folder` is.

    what: what will be written ("the float32 weights, config and tokenizer");
    fix: what the user can do ("free some space or choose another --dest");
    shown_as: the folder as the message names it (default: `folder`).
    """
    free = free_bytes(folder)
    if free < needed + HEADROOM:
        raise CheckpointError(f"{shown_as or folder}: {free / MiB:.0f} MiB free; expected at least "
                              f"{(needed + HEADROOM) / MiB:.0f} MiB for {what} ({fix})")


def write_failure(folder: Path, file: str, error: BaseException) -> CheckpointError:
    """The one line for a write into `folder` that failed (a full disk, most often)."""
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return CheckpointError(f"{folder}: writing {file} failed ({reason}); expected a writable folder with room "
                           "for the checkpoint (nothing was left half-written)")


def user_cache_dir() -> Path:
    """The platform's per-user cache folder for minispec."""
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "minispec"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "minispec"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minispec"
