"""The README's promises: its Python examples run as written, from any folder, and CI runs its test command."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_examples_run_as_written(index, real_ckpt, tmp_path):  # real_ckpt: the default checkpoint is in place
    """Each block alone, in a fresh interpreter, in an empty folder: nothing from the repository's
    root or from the pytest process (no hypothesis profile loaded) helps it."""
    env = {key: value for key, value in os.environ.items() if key != "MINISPEC_PROFILE"}
    proc = subprocess.run([sys.executable, "-c", python_blocks()[index]], capture_output=True, text=True,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"README.md, python block {index + 1}:\n{proc.stderr[-3000:]}"


def test_ci_runs_the_readme_test_command_verbatim():
    commands = re.findall(r"```bash\n(.*?)\n```", README.read_text(), flags=re.DOTALL)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (README.parent / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()
