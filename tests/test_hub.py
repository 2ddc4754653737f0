"""Checkpoints by hub repo id, offline: a hub-layout cache folder is built here and read through
huggingface_hub exactly as a real download leaves it (blobs, snapshots/<commit> of symlinks,
refs/<branch>). This machine has no hub access, so every run is HF_HUB_OFFLINE=1."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minispec.errors import CheckpointError
from minispec.generate import main
from minispec.checkpoints.hub import is_repo_id, resolve_checkpoint

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a snapshot is named by its 40-hex commit


def hub_cache(root: Path, repo_id: str, files: dict[str, Path], revision: str = "main") -> Path:
    """A hub cache (HF_HUB_CACHE) holding `files` as repo_id's snapshot at COMMIT, `revision` -> COMMIT."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / revision).write_text(COMMIT)
    for i, (name, source) in enumerate(files.items()):
        blob = repo / "blobs" / f"blob{i}"
        os.symlink(source.resolve(), blob)  # a blob is the file's content; here a link to it
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    return root


def offline_env(cache: Path) -> dict:
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def run_cli(env, *argv):
    return subprocess.run([sys.executable, "-m", "minispec.generate", *argv], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def cache_with_the_default_checkpoint(real_ckpt, tmp_path_factory):
    files = {path.name: path for path in real_ckpt.iterdir() if path.suffix in (".json", ".safetensors")}
    return hub_cache(tmp_path_factory.mktemp("hub"), "acme/smol", files)


def test_cli_reads_a_repo_id_from_the_hub_cache_offline(cache_with_the_default_checkpoint, real_ckpt):
    """The user's path, environment variables and all: --ckpt owner/name gives the folder's tokens."""
    env = offline_env(cache_with_the_default_checkpoint)
    common = ("--max-new-tokens", "6", "--json")
    want = json.loads(run_cli(env, "--ckpt", str(real_ckpt), *common).stdout)["tokens"]
    proc = run_cli(env, "--ckpt", "acme/smol", *common)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == want


@pytest.fixture
def offline(cache_with_the_default_checkpoint, monkeypatch):
    """This process as HF_HUB_OFFLINE=1 HF_HUB_CACHE=<the cache> would start it (huggingface_hub reads
    its environment once, at import, into huggingface_hub.constants)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache_with_the_default_checkpoint))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_revisions_and_drafts_by_repo_id(offline, real_ckpt, capsys):
    """@revision and --revision name the same snapshot; --draft takes a repo id too."""
    common = ["--max-new-tokens", "6", "--json"]
    assert main(["--ckpt", str(real_ckpt), *common]) == 0
    want = json.loads(capsys.readouterr().out)["tokens"]
    for argv in (["--ckpt", f"acme/smol@{COMMIT}"], ["--ckpt", "acme/smol", "--revision", "main"],
                 ["--ckpt", "acme/smol", "--draft", "acme/smol", "--gamma", "2"]):
        assert main(argv + common) == 0, argv
        assert json.loads(capsys.readouterr().out)["tokens"] == want, argv
    assert resolve_checkpoint("acme/smol@main") == resolve_checkpoint("acme/smol", revision=COMMIT)


@pytest.mark.parametrize("argv, message", [
    (["--ckpt", "acme/missing"], "--ckpt acme/missing: not a local folder, not in the hub cache"),
    (["--ckpt", "acme/smol@v9"], "--ckpt acme/smol@v9: not a local folder, not in the hub cache"),
    (["--ckpt", "acme/smol@v9", "--revision", "main"], "--ckpt acme/smol@v9: two revisions"),
    (["--ckpt", "acme/smol@"], "--ckpt acme/smol@: nothing after '@'; expected owner/name@REVISION"),
    (["--ckpt", "./no/such/folder"], "--ckpt ./no/such/folder: no such folder; expected a checkpoint folder"),
    (["--ckpt", "acme/smol", "--draft", "acme/other"], "--draft acme/other: not a local folder"),
    (["--revision", "main"], "--revision: a hub revision of --ckpt"),
])
def test_what_is_not_there_is_one_line(offline, argv, message, capsys):
    assert main([*argv, "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("minispec.generate: error: ") and message in err, err
    assert err.count("\n") == 1
    if "hub cache" in message:  # and it says why it did not try the hub
        assert "offline mode is on (HF_HUB_OFFLINE=1)" in err


def test_a_local_folder_wins_and_takes_no_revision(tmp_path, monkeypatch):
    folder = tmp_path / "acme" / "smol"
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("acme/smol") == Path("acme/smol")  # a folder of that name is never looked up
    with pytest.raises(CheckpointError, match="a revision .* for a local folder"):
        resolve_checkpoint("acme/smol", revision="main")
    (tmp_path / "model.gguf").write_text("")
    with pytest.raises(CheckpointError, match="a file, not a folder"):
        resolve_checkpoint("model.gguf")


@pytest.mark.parametrize("text, ok", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", True), ("Qwen/Qwen2.5-0.5B", True), ("a/b", True),
    ("/abs/path", False), ("./rel/path", False), ("../x/y", False), ("a/b/c", False), ("name", False), ("~/x", False),
])
def test_repo_id_shape(text, ok):
    assert is_repo_id(text) == ok
