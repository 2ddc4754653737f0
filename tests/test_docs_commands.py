"""Every command the docs give can run today: each script and module named in README.md, docs/ and
scripts/README.md as `python scripts/...py` or `python -m minispec...` answers --help, and every
flag a doc passes to it is one that its --help lists."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "scripts" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"python (scripts/[\w/]+\.py|-m minispec(?:\.\w+)*)((?:[ \t]+(?:\\\n\s*)?[^\s`|]+)*)")


def documented() -> dict[str, dict[str, set[str]]]:
    """command -> {doc name: the flags the doc passes to it}."""
    found: dict[str, dict[str, set[str]]] = {}
    for doc in DOCS:
        for command, rest in COMMAND.findall(doc.read_text(encoding="utf-8")):
            flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest))
            found.setdefault(command, {}).setdefault(doc.name, set()).update(flags)
    return found


COMMANDS = documented()


def test_the_docs_name_commands():
    assert "scripts/speed/bench_formats.py" in COMMANDS and "-m minispec.generate" in COMMANDS


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_documented_command_answers_help_and_knows_its_flags(command):
    argv = command.split() if command.startswith("-m") else [str(ROOT / command)]
    proc = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, f"python {command} --help: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    for doc, flags in COMMANDS[command].items():
        unknown = sorted(flag for flag in flags if flag not in proc.stdout)
        assert not unknown, f"{doc} passes {unknown} to python {command}, whose --help does not list them"
