"""minispec as an installed package (not a source checkout), run from another folder: the CLI works,
and the default checkpoint's folder is the user cache, not site-packages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`pip install .` (no dependencies: they are this environment's) into a folder of its own."""
    pytest.importorskip("setuptools", reason="the build backend, to build the package without a network")
    target = tmp_path_factory.mktemp("site-packages")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return target


def run_installed(installed, tmp_path, *argv):
    env = {**os.environ, "PYTHONPATH": str(installed), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("MINISPEC_HOME", None)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=tmp_path)


def test_installed_package_keeps_its_weights_in_the_user_cache(installed, tmp_path):
    proc = run_installed(installed, tmp_path, "-c", "import minispec, minispec.checkpoints.fetch as w; "
                         "print(minispec.__file__); print(w.default_checkpoint_dir())")
    assert proc.returncode == 0, proc.stderr
    module, folder = proc.stdout.split()
    assert Path(module).is_relative_to(installed)  # the installed copy, not this checkout
    assert Path(folder) == tmp_path / "cache" / "minispec" / "smollm2-135m-instruct"
    assert not (installed / "weights").exists() and sorted(p.name for p in installed.iterdir() if not
                                                          p.name.endswith(".dist-info")) == ["minispec"]


def test_installed_cli_runs_from_another_folder(installed, tmp_path, real_ckpt):
    proc = run_installed(installed, tmp_path, "-m", "minispec.generate", "--ckpt", str(real_ckpt),
                         "--max-new-tokens", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 3
