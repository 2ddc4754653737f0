"""minispec.checkpoints.fetch under faults: killed conversions, two processes racing, unwritable folders.

A conversion runs in a subprocess with the tiny GGUF of tests/test_weights.py in place of the
download, and given a point it SIGKILLs itself there (KILLS below: the subprocess wraps the
converter's own steps; nothing of this is in the package). Then: nothing half-written is loadable at DEST, and the next call repairs
what is on disk and leaves no work folder, .old- folder or lock file behind.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import minispec.checkpoints.fetch as weights
from minispec.checkpoints.convert import convert_gguf
from minispec import load_model, load_tokenizer
from minispec.errors import CheckpointError
from minispec.checkpoints.fetch import ensure_default_checkpoint, main

pytest.importorskip("gguf", reason="the GGUF writer (pip install -e .[test])")
from test_weights import write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and flock are POSIX")

REPO = Path(__file__).resolve().parent.parent

# One conversion, as a user's process would run it; argv: gguf dest force log [barrier].
CONVERT = """
import os, signal, sys, time
from pathlib import Path
import minispec.checkpoints.fetch as weights
from minispec.checkpoints.convert import convert_gguf

gguf_path, dest, force, log, barrier, kill_at = (sys.argv[1:] + ["", ""])[:6]

def kill(point):
    if point == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

# The points, in order: fetched (the download done), writing (model.safetensors written, the rest
# not), converted, swapping (between the two renames of a forced conversion), swapped (the new
# folder in, the old one not yet cleared).
real_convert, real_replace = weights.convert_gguf, os.replace

def convert(*args, **kwargs):
    kill("fetched")
    folder = real_convert(*args, on_weights_written=lambda: kill("writing"), **kwargs)
    kill("converted")
    return folder

def replace(src, dst):
    real_replace(src, dst)
    kill("swapping" if Path(dst).name.startswith(".old-") else "swapped" if Path(src).name == "checkpoint" else "")

weights.convert_gguf, weights.os.replace = convert, replace

def fake_fetch(workdir, *, quiet=False, known=None):  # the tiny GGUF instead of the 93 MB download; each call logged
    with open(log, "a") as f:
        f.write("fetch\\n")
    if barrier:
        time.sleep(1.5)  # hold the lock while the other process arrives
    return Path(gguf_path)

weights.fetch_gguf = fake_fetch
if barrier:  # start together: each announces itself, then waits for the other
    Path(barrier, str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
print(weights.ensure_default_checkpoint(dest, force=force == "force"))
"""


def start_conversion(gguf: Path, dest: Path, log: Path, *, force: bool = False, kill_at: str | None = None,
                     barrier: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", CONVERT, str(gguf), str(dest), "force" if force else "", str(log), str(barrier or ""),
            kill_at or ""]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_conversion(*args, **kwargs) -> subprocess.CompletedProcess:
    process = start_conversion(*args, **kwargs)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GGUF and its converted files' bytes (the conversion is deterministic)."""
    folder = tmp_path_factory.mktemp("tiny")
    write_tiny_gguf(folder / "tiny.gguf")
    reference = convert_gguf(folder / "tiny.gguf", folder / "reference")
    return folder / "tiny.gguf", {name: (reference / name).read_bytes() for name in weights.CONVERTED_FILES}


@pytest.fixture
def offline(tiny, monkeypatch):
    """In this process, 'download' the tiny GGUF; the list counts the fetches."""
    calls = []
    monkeypatch.setattr(weights, "fetch_gguf", lambda workdir, **kwargs: calls.append(workdir) or tiny[0])
    return calls


def converted_files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in weights.CONVERTED_FILES if (folder / name).is_file()}


def assert_loads(folder: Path) -> None:
    assert load_model(folder).config.num_layers == 2
    assert load_tokenizer(folder) is not None


# ---------------------------------------------------------------- killed conversions

@pytest.mark.parametrize("point", ["fetched", "writing", "converted"])
def test_killed_first_conversion_leaves_nothing_loadable_and_the_next_run_cleans_up(tiny, offline, tmp_path, point):
    home, log = tmp_path / "home", tmp_path / "fetches.log"
    dest = home / "ckpt"
    done = run_conversion(tiny[0], dest, log, kill_at=point)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not dest.exists()  # the half-written checkpoint is only in the work folder
    assert sorted(p.name[:len(".tmp-ckpt-")] for p in home.iterdir()) == [".ckpt.lock", ".tmp-ckpt-"]  # left by the kill

    assert ensure_default_checkpoint(dest, quiet=True) == dest
    assert converted_files(dest) == tiny[1] and len(offline) == 1
    assert sorted(p.name for p in home.iterdir()) == ["ckpt"]  # the stale work folder is gone, and the lock
    assert_loads(dest)


@pytest.mark.parametrize("point, survivor", [("writing", "old"), ("converted", "old"), ("swapping", "old"),
                                             ("swapped", "new")])
def test_killed_forced_conversion_is_restored_or_finished_by_the_next_load(tiny, offline, tmp_path, point, survivor):
    """--force over a checkpoint with the user's files in it, killed at each step of the swap.

    Between the two renames DEST is briefly absent (the old folder waits as .old-ckpt); at no point
    does it hold a mix of old and new files. The next call, a plain load, puts the old folder back
    or finishes the swap without converting again, and the user's files are all there.
    """
    home, log = tmp_path / "home", tmp_path / "fetches.log"
    dest = ensure_default_checkpoint(home / "ckpt", quiet=True)
    (dest / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "old": True}))  # tells old from new
    (dest / "notes.txt").write_text("mine")
    (dest / "runs").mkdir()
    (dest / "runs" / "log.txt").write_text("also mine")
    old, new = converted_files(dest), tiny[1]

    done = run_conversion(tiny[0], dest, log, force=True, kill_at=point)
    assert done.returncode == -signal.SIGKILL, done.stderr
    if point == "swapping":
        assert not dest.exists() and converted_files(home / ".old-ckpt") == old
    else:
        assert converted_files(dest) in (old, new)

    assert ensure_default_checkpoint(dest, quiet=True) == dest
    assert converted_files(dest) == (old if survivor == "old" else new) and len(offline) == 1  # not converted again
    assert (dest / "notes.txt").read_text() == "mine" and (dest / "runs" / "log.txt").read_text() == "also mine"
    assert sorted(p.name for p in home.iterdir()) == ["ckpt"]
    assert_loads(dest)


@pytest.mark.parametrize("fault", [KeyboardInterrupt, SystemExit, OSError])
def test_work_folder_and_lock_are_removed_on_every_exit_python_sees(tiny, offline, tmp_path, monkeypatch, fault):
    def interrupted(*args, **kwargs):
        raise fault()

    monkeypatch.setattr(weights, "convert_gguf", interrupted)
    with pytest.raises(fault):
        ensure_default_checkpoint(tmp_path / "home" / "deep" / "ckpt", quiet=True)
    assert not (tmp_path / "home").exists()  # the folders this conversion made are gone too
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "mine.txt").write_text("x")
    with pytest.raises(fault):
        ensure_default_checkpoint(tmp_path / "home" / "deep" / "ckpt", quiet=True)
    assert [p.name for p in (tmp_path / "home").iterdir()] == ["mine.txt"]  # what was there before stays


@pytest.mark.parametrize("value", [" ", "\t", "  \n"])
def test_a_blank_minispec_home_is_one_line_and_makes_no_folder(tmp_path, monkeypatch, value):
    from minispec.checkpoints.disk import minispec_home
    from minispec.errors import CheckpointError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINISPEC_HOME", value)
    with pytest.raises(CheckpointError, match="MINISPEC_HOME .*: blank; expected a folder path"):
        minispec_home()
    assert list(tmp_path.iterdir()) == []


def test_only_this_destinations_stale_work_folders_are_removed(tiny, offline, tmp_path):
    home = tmp_path / "home"
    names = [".tmp-ckpt-0123abcd", ".tmp-ckpt-2-0123abcd", ".tmp-other-0123abcd", ".tmp-ckpt-mine", ".tmp-ckpt-0123ABCD"]
    for name in names:
        (home / name).mkdir(parents=True)
    ensure_default_checkpoint(home / "ckpt", quiet=True)
    assert sorted(p.name for p in home.iterdir()) == sorted(["ckpt"] + names[1:])


# ---------------------------------------------------------------- two processes at once

def test_two_processes_racing_convert_once_and_both_succeed(tiny, tmp_path):
    dest, log, barrier = tmp_path / "home" / "ckpt", tmp_path / "fetches.log", tmp_path / "barrier"
    barrier.mkdir()
    racers = [start_conversion(tiny[0], dest, log, barrier=barrier) for _ in range(2)]
    results = [(*racer.communicate(timeout=120), racer.returncode) for racer in racers]
    assert [code for _, _, code in results] == [0, 0], [err for _, err, _ in results]
    assert [out.strip() for out, _, _ in results] == [str(dest)] * 2
    assert sum("waiting for another process converting into" in err for _, err, _ in results) == 1  # they did race
    assert log.read_text().count("fetch") == 1
    assert converted_files(dest) == tiny[1]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["ckpt"]
    assert_loads(dest)


# ---------------------------------------------------------------- a folder we cannot write

@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
@pytest.mark.parametrize("dest_in", ["weights", "weights/sub"])
def test_read_only_destination_is_one_line_before_any_download(offline, tmp_path, capsys, dest_in):
    """A read-only weights/ on first use, the checkpoint directly in it or in a folder still to be made."""
    read_only = tmp_path / "weights"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        assert main(["--dest", str(tmp_path / dest_in / "ckpt")]) == 2
    finally:
        read_only.chmod(0o755)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"minispec.weights: error: {tmp_path / dest_in}: cannot write there (Permission denied); "
                   "expected a writable folder for the checkpoint and its temp folder "
                   "(choose another with --dest or MINISPEC_HOME)"]
    assert offline == [] and list(read_only.iterdir()) == []


@pytest.mark.parametrize("blocked", ["open", "mkdir"])
def test_unwritable_destination_fails_before_any_download(offline, tmp_path, monkeypatch, blocked):
    """The same as root: the OS refuses to create anything in `weights/` (the lock file, the work folder)."""
    read_only = tmp_path / "weights"
    read_only.mkdir()
    real = getattr(os, blocked)

    def refuse(path, *args, **kwargs):
        if Path(path).parent == read_only:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, blocked, refuse)
    with pytest.raises(CheckpointError, match=rf"^{read_only}: cannot write there \(Permission denied\); expected"):
        ensure_default_checkpoint(read_only / "ckpt", quiet=True)
    assert offline == [] and list(read_only.iterdir()) == []


def test_force_through_a_symbolic_link_converts_the_folder_it_points_to_and_moves_nothing_out(tiny, offline, tmp_path):
    """DEST a link to a folder of the user's: --force converts in that folder, as for the folder itself;
    the user's files stay in it, the link is untouched, nothing is left beside either, and again works."""
    real, link = tmp_path / "data" / "models", tmp_path / "links" / "ckpt"
    ensure_default_checkpoint(real, quiet=True)
    (real / "notes.txt").write_text("mine")
    link.parent.mkdir()
    link.symlink_to(real, target_is_directory=True)
    for _ in range(2):
        assert ensure_default_checkpoint(link, quiet=True, force=True) == link
        assert link.is_symlink() and link.resolve() == real.resolve()
        assert (real / "notes.txt").read_text() == "mine" and converted_files(real) == tiny[1]
        assert sorted(p.name for p in real.parent.iterdir()) == ["models"]
        assert sorted(p.name for p in link.parent.iterdir()) == ["ckpt"]
        assert_loads(link)


def test_a_link_to_nothing_is_one_line(offline, tmp_path):
    link = tmp_path / "ckpt"
    link.symlink_to(tmp_path / "gone", target_is_directory=True)
    with pytest.raises(CheckpointError, match="symbolic link .* does not exist"):
        ensure_default_checkpoint(link, quiet=True)
    assert not (tmp_path / "gone").exists() and offline == []
