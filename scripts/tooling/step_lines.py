"""How much code one speculative step makes a reader follow: the function bodies it runs, by file.

    python scripts/tooling/step_lines.py [--policy sampling] [--draft model] [--all]

Runs the chain loop (minispec.chain.speculative) on a tiny random model with a separate draft
model (or --draft ngram) and traces every function of the package that runs during its verify
steps (draft, verify, decide, roll back, commit; not the prefill before them nor the stats after
them), and the loop function that holds the step. Each function counts
once, by its body: the lines from its first statement after the docstring to its end, without blank
and comment-only lines. The model's own files (model/: the transformer, its cache, p and q) are a
chapter read on their own and are listed apart unless --all.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PACKAGE = ROOT / "minispec"


def body_lines(path: Path, first_line: int) -> int:
    """Non-blank, non-comment lines of the body of the function defined at `first_line` of `path`."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                (node.decorator_list[0].lineno if node.decorator_list else node.lineno) <= first_line <= node.lineno:
            body = node.body[1:] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body
            text = lines[body[0].lineno - 1:node.end_lineno]
            return sum(1 for line in text if line.strip() and not line.strip().startswith("#"))
    return 0


def traced_step_functions(policy: str, draft: str) -> set[tuple[Path, int, str]]:
    """(file, first line, name) of every package function that runs inside the loop's verify steps."""
    from minispec.chain.speculative import generate_chain
    from minispec.testing import random_model, tiny_config

    target = random_model(tiny_config(), 0, scale=3.0)
    drafter = random_model(tiny_config(), 1) if draft == "model" else "ngram"
    seen, in_step, ends = [], [False], []  # calls in order; where each step ended (on_step)

    def profile(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if event == "call" and in_step[0] and path.is_relative_to(PACKAGE):
            seen.append((path, frame.f_code.co_firstlineno, frame.f_code.co_name))

    def first_tokens_streamed(tokens, num_accepted, num_drafted):
        """on_tokens: its first call is the prefill's token; the steps start after it. The loop that
        holds the steps (first_token's caller) counts too."""
        if not in_step[0]:
            loop = sys._getframe(2).f_code
            seen.append((Path(loop.co_filename), loop.co_firstlineno, loop.co_name))
            in_step[0] = True

    sys.setprofile(profile)
    try:
        generate_chain(target, [1, 2, 3, 1, 2, 3], max_new_tokens=12, draft=drafter, policy=policy, gamma=3,
                       temperature=1.0 if policy != "exact" else 0.0, eos_token_ids=[],
                       on_tokens=first_tokens_streamed, on_step=lambda record: ends.append(len(seen)))
    finally:
        sys.setprofile(None)
    return {entry for entry in seen[:ends[-1]] if entry[2] not in ("<lambda>", "<genexpr>", "<listcomp>", "<dictcomp>",
                                                                    "first_tokens_streamed")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="step_lines", description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="sampling")
    parser.add_argument("--draft", choices=["model", "ngram"], default="model")
    parser.add_argument("--all", action="store_true", help="count model/ too")
    args = parser.parse_args(argv)
    by_file: dict[Path, list[tuple[str, int]]] = defaultdict(list)
    for path, line, name in traced_step_functions(args.policy, args.draft):
        by_file[path].append((name, body_lines(path, line)))
    total, files = 0, 0
    for path in sorted(by_file):
        model_file = path.parent.name == "model"
        lines = sum(n for _, n in by_file[path])
        counted = args.all or not model_file
        total, files = total + lines * counted, files + counted
        names = ", ".join(f"{name} {n}" for name, n in sorted(by_file[path]))
        print(f"{lines:4d}  {path.relative_to(ROOT)}{'' if counted else ' (the model: not counted)'}: {names}")
    print(f"{total} lines of function bodies in {files} files (policy {args.policy}, {args.draft} draft)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
