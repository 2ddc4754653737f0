"""What `--dropout-p auto` picks, per prompt and per prompt set, and whether it carries across sets.

    python scripts/dropmatch/dropmatch_auto_p.py [--ckpt qwen2.5-coder-1.5b-instruct] [--sets humaneval:16,mt_bench:4,qa:4]
                                       [--levels 0.8,0.95] [--paths 5]

For every prompt: the p that `--dropout-p auto` chooses (minispec.lab.dropout_calibration.
auto_dropout_p on the first CALIBRATION_TOKENS tokens of the target's greedy continuation, as the
CLI does). For every set: the median and range of those p, the p that reaches the level on all
of the set's positions pooled (the full continuations), and the pooled agreement on every other
set at this set's pooled p: does a p calibrated on one kind of prompt keep its level on another?
The greedy continuations are the replay's (scripts/dropmatch/dropmatch_replay.py's cache in out/dropmatch/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median
from dropmatch_replay import continuations, set_counts

import torch  # noqa: E402

from minispec.lab.dropout_calibration import (CALIBRATION_TOKENS, MeasuredAgreement,  # noqa: E402
                                                     auto_dropout_p, calibrate_p)
from minispec.cli import ranged  # noqa: E402

PROG = "dropmatch_auto_p"


def measure(args, ckpt) -> dict:
    import minispec

    tokenizer = minispec.load_tokenizer(ckpt)
    model = benchlib.load_minispec(ckpt, torch.float32, "fast").model
    eos = list(tokenizer.eos_token_ids)
    by_set = {name: benchlib.load_prompts([name], n, tokenizer) for name, n in args.sets}
    texts = {name: continuations(model, prompts, args.max_new_tokens, eos, benchlib.ROOT / "out" / "dropmatch", ckpt)
             for name, prompts in by_set.items()}
    pooled = {}
    for name, prompts in by_set.items():
        with torch.inference_mode():
            pooled[name] = torch.cat([model.forward_hidden(torch.tensor([p.ids + t]))[0, len(p.ids) - 1:-1]
                                      for p, t in zip(prompts, texts[name]) if t])  # [N, d]
    rows = []
    for level in args.levels:
        for name, prompts in by_set.items():
            print(f"{PROG}: level {level}, {name} ...", file=sys.stderr)
            per_prompt = [auto_dropout_p(model, p.ids, args.paths, level, continuation=t[:CALIBRATION_TOKENS])
                          for p, t in zip(prompts, texts[name]) if t]
            p_pooled = calibrate_p(MeasuredAgreement(pooled[name], model.head, args.paths), level)
            elsewhere = {other: MeasuredAgreement(hidden, model.head, args.paths)(p_pooled)
                         for other, hidden in pooled.items()}
            rows.append({"level": level, "set": name, "prompts": len(per_prompt), "p_per_prompt": per_prompt,
                         "p_median": median(per_prompt), "p_min": min(per_prompt), "p_max": max(per_prompt),
                         "p_pooled": p_pooled, "positions": int(pooled[name].shape[0]), "agreement_at_p": elsewhere})
    return {"settings": {"sets": [f"{n}:{k}" for n, k in args.sets], "paths": args.paths, "levels": list(args.levels),
                         "max_new_tokens": args.max_new_tokens, "calibration_tokens": CALIBRATION_TOKENS},
            "rows": rows}


def render(result: dict) -> str:
    s = result["settings"]
    names = [r["set"] for r in result["rows"] if r["level"] == s["levels"][0]]
    return "\n".join([
        "# minispec: what --dropout-p auto picks\n", benchlib.record_markdown(result["run"]),
        f"K = {s['paths']}. Per prompt: auto's p from the first {s['calibration_tokens']} greedy tokens (as the CLI). "
        f"Pooled: the p reaching the level on all positions of the set's continuations (up to {s['max_new_tokens']} "
        "tokens each), and the all-K agreement that p gives on each set's positions.\n",
        md_table(["level", "set", "prompts", "auto p: median [min, max]", "pooled p", "positions"]
                 + [f"agreement on {n}" for n in names],
                 [[f"{r['level']:g}", r["set"], str(r["prompts"]),
                   f"{fmt(r['p_median'], '.3f')} [{fmt(r['p_min'], '.3f')}, {fmt(r['p_max'], '.3f')}]",
                   fmt(r["p_pooled"], ".3f"), str(r["positions"])]
                  + [fmt(r["agreement_at_p"].get(n), ".2f") for n in names] for r in result["rows"]]), ""])


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=set_counts, default="humaneval:16,mt_bench:4,qa:4",
                   help="comma-separated prompt sets, each 'name:N' (cached continuations are reused)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=CALIBRATION_TOKENS), default=128,
                   help="length of each greedy continuation (the pooled positions)")
    p.add_argument("--levels", type=benchlib.number_list(float, "--levels", 0.01, 1), default="0.8,0.95",
                   help="comma-separated target agreements (auto's default: 0.8)")
    p.add_argument("--paths", type=ranged(int, "--paths", lo=1, hi=64), default=5, help="K")
    return p


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


if __name__ == "__main__":
    sys.exit(main())
