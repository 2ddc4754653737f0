"""The README's promises: its Python examples run as written, and CI runs its test command."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_examples_run_as_written(index, real_ckpt):  # real_ckpt: the default checkpoint is in place
    exec(compile(python_blocks()[index], f"README.md, python block {index + 1}", "exec"), {})


def test_ci_runs_the_readme_test_command_verbatim():
    commands = re.findall(r"```bash\n(.*?)\n```", README.read_text(), flags=re.DOTALL)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (README.parent / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()
