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
    """The platform's per-user cache folder for minispec. A relative XDG_CACHE_HOME is ignored, as
    the XDG specification says; a home folder that cannot be found is one line."""
    if sys.platform == "win32":
        return (env_folder("LOCALAPPDATA") or home() / "AppData" / "Local") / "minispec"
    if sys.platform == "darwin":
        return home() / "Library" / "Caches" / "minispec"
    cache = env_folder("XDG_CACHE_HOME")
    return (cache if cache is not None and cache.is_absolute() else home() / ".cache") / "minispec"


def minispec_home() -> Path | None:
    """MINISPEC_HOME as a folder (a leading ~ expanded), or None where it is unset or empty."""
    return env_folder("MINISPEC_HOME")


def env_folder(variable: str) -> Path | None:
    """The folder an environment variable names, `~` or `~user` expanded; None if unset or empty.
    A value that cannot be expanded (no such user) or holds a NUL byte is one line naming it."""
    value = os.environ.get(variable)
    if not value:
        return None
    if not value.strip():  # a folder named by spaces would be made in the current folder, unseen
        raise CheckpointError(f"{variable} = {value!r}: blank; expected a folder path, or the variable unset")
    if "\0" in value:
        raise CheckpointError(f"{variable} = {value!r}: holds a NUL byte; expected a folder path")
    try:
        return Path(value).expanduser()
    except RuntimeError as error:  # ~nosuchuser, or ~ without a home folder
        raise CheckpointError(f"{variable} = {value!r}: cannot expand {value.split('/')[0]!r} ({error}); expected "
                              "a folder path") from None


def home() -> Path:
    """The user's home folder, or one line saying what to set instead."""
    try:
        return Path.home()
    except (RuntimeError, KeyError) as error:
        raise CheckpointError(f"no home folder ({error}); expected HOME to be set, or MINISPEC_HOME to name the "
                              "folder for checkpoints and caches") from None


def make_folders(folder: Path) -> list[Path]:
    """mkdir -p `folder`; the folders this call made, deepest last (for remove_made_folders)."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    folder.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


def remove_made_folders(made: list[Path]) -> None:
    """Undo make_folders where nothing else was put in them since: deepest first, empty ones only."""
    for path in reversed(made):
        try:
            path.rmdir()
        except OSError:  # not empty (another process's file), or already gone: leave it
            break
