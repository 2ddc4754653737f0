"""The README's code examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_user_guide_policy_example_runs():
    block = next(b for b in python_blocks() if "check_policy(MySampling)" in b)
    assert len(block.strip().splitlines()) <= 25
    exec(compile(block, "README.md", "exec"), {})


def test_readme_gives_the_two_commands_ci_runs():
    text = README.read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", text, flags=re.DOTALL)
    assert len(commands) == 2
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()  # .ci/run runs the README's test command verbatim
    assert "python -m minispec.generate" in commands[0]
