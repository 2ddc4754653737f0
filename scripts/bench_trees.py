"""Draft trees against chains at equal verify budgets: tau, nodes per step, speed (greedy).

    python scripts/bench_trees.py [--prompts 2] [--budgets 8,16] [--max-new-tokens 64] [--threads 1]

At temperature 0 on Spec-Bench prompts (--sets, --prompts of each), float32, the reference model
(model.py as written: the fast kernels' attention is not tree-aware yet). A verify budget B is
B + 1 target rows per step: a chain drafts gamma = B tokens, a tree B nodes. Per prompt, in turn:

    plain                     plain greedy decoding: the baseline of every speed ratio
    chain <drafter> gB        speculative.generate, exact policy, gamma B
    tree  <drafter> B         tree_speculative.generate_tree, greedy walk, B nodes, depth --depth

Drafters: early-exit at layer --layer (the target's first N layers + norm + head; as a tree:
ModelTreeDrafter(target, num_layers=N), dynamic, the --width most probable paths expanded by
--top-k children per level), and n-gram (chain: the last match; tree: every earlier match merged
into one trie). Per configuration, medians over prompts of: tau (tokens per verify step, the
correction/bonus counted), nodes per step, tok/s, and speed = tok/s / plain tok/s on the same
prompt; "= plain" counts outputs equal to plain greedy's.

Writes bench_trees.json and .md to --out (default out/bench_trees/).
"""

from __future__ import annotations

import sys

import benchlib
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "bench_trees"


def build_parser():
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.SPEC_BENCH_SETS),
                   default="summarization,rag,math_reasoning", help="Spec-Bench categories, comma-separated")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=2, help="prompts per set")
    p.add_argument("--budgets", type=benchlib.number_list(int, "--budgets", lo=1), default="8,16",
                   help="verify budgets B (B + 1 rows per step), comma-separated")
    p.add_argument("--depth", type=ranged(int, "--depth", lo=1), default=6, help="the deepest a tree goes")
    p.add_argument("--layer", type=ranged(int, "--layer", lo=1), default=24, help="early exit after this layer")
    p.add_argument("--width", type=ranged(int, "--width", lo=1), default=4, help="tree: paths expanded per level")
    p.add_argument("--top-k", type=ranged(int, "--top-k", lo=1), default=4, help="tree: children per expanded node")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=64)
    return p


def main(argv=None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


def render(result: dict) -> str:
    return benchlib.record_markdown(result["run"]) + "\n" + result["table"]


def measure(args, ckpt) -> dict:
    import minispec
    from minispec.speculative import generate
    from minispec.tree_speculative import ModelTreeDrafter, NgramTreeDrafter, generate_tree

    model = minispec.load_model(ckpt, dtype=torch.float32)
    tokenizer = minispec.load_tokenizer(ckpt)
    eos = tokenizer.eos_token_ids
    prompts = benchlib.load_prompts(args.sets, args.prompts, tokenizer)
    n = args.max_new_tokens

    configs = {"plain": lambda ids: generate(model, ids, max_new_tokens=n, eos_token_ids=eos)}
    for budget in args.budgets:
        configs[f"chain early-exit:{args.layer} g{budget}"] = (
            lambda ids, b=budget: generate(model, ids, max_new_tokens=n, draft=f"early-exit:{args.layer}", gamma=b,
                                           eos_token_ids=eos))
        configs[f"tree early-exit:{args.layer} {budget}"] = (
            lambda ids, b=budget: generate_tree(
                model, ids, max_new_tokens=n, budget=b, max_depth=args.depth, eos_token_ids=eos,
                drafter=ModelTreeDrafter(model, num_layers=args.layer, branching=(args.top_k,), width=args.width)))
        configs[f"chain ngram g{budget}"] = (
            lambda ids, b=budget: generate(model, ids, max_new_tokens=n, draft="ngram", gamma=b, eos_token_ids=eos))
        configs[f"tree ngram {budget}"] = (
            lambda ids, b=budget: generate_tree(model, ids, max_new_tokens=n, budget=b, max_depth=args.depth,
                                                eos_token_ids=eos, drafter=NgramTreeDrafter()))

    per_config = {name: [] for name in configs}
    for prompt in prompts:
        plain_tokens, plain_speed = None, None
        for name, fn in configs.items():
            out = fn(prompt.ids)
            s = out.stats
            row = {"set": prompt.set, "tau": s.get("tau", 1.0), "tok_s": s["tokens_per_second"],
                   "nodes": s.get("nodes_per_step", s.get("num_drafted", 0) / max(1, s.get("verify_steps", 1))),
                   "tokens": len(out.tokens)}
            if name == "plain":
                plain_tokens, plain_speed = out.tokens, s["tokens_per_second"]
            row["same"] = out.tokens == plain_tokens
            row["speed"] = ratio(s["tokens_per_second"], plain_speed)
            per_config[name].append(row)
            print(f"{prompt.set}#{prompt.index} {name:32s} tau {row['tau']:.2f} nodes {row['nodes']:.1f} "
                  f"speed {row['speed']:.2f}", file=sys.stderr, flush=True)

    rows = []
    for name, records in per_config.items():
        rows.append([name, fmt(median(r["tau"] for r in records)), fmt(median(r["nodes"] for r in records), ".1f"),
                     fmt(median(r["tok_s"] for r in records), ".1f"), fmt(median(r["speed"] for r in records)),
                     f"{sum(r['same'] for r in records)}/{len(records)}"])
    return {"configs": per_config, "table": md_table(["config", "tau", "nodes/step", "tok/s", "speed", "= plain"], rows)}


if __name__ == "__main__":
    sys.exit(main())
