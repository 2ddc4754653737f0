"""The README's promises: its Python examples (and docs/usage.md's) run as written, from any folder, and CI
runs its test command."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


USAGE = README.parent / "docs" / "usage.md"


def python_blocks() -> list[tuple[str, int, str]]:
    """(file name, block number from 1, code) of every python block in README.md and docs/usage.md."""
    return [(doc.name, i + 1, code) for doc in (README, USAGE)
            for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.DOTALL))]


@pytest.mark.parametrize("block", python_blocks(), ids=lambda block: f"{block[0]}-{block[1]}")
def test_python_examples_run_as_written(block, real_ckpt, tmp_path):  # real_ckpt: the default checkpoint is in place
    """Each block alone, in a fresh interpreter, in an empty folder: nothing from the repository's
    root or from the pytest process (no hypothesis profile loaded) helps it."""
    name, number, code = block
    env = {key: value for key, value in os.environ.items() if key != "MINISPEC_PROFILE"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"{name}, python block {number}:\n{proc.stderr[-3000:]}"


def test_ci_runs_the_readme_test_command_verbatim():
    commands = re.findall(r"```bash\n(.*?)\n```", README.read_text(), flags=re.DOTALL)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (README.parent / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()
