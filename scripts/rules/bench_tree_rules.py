"""Acceptance rules on draft trees, sampled: tau, speed and quality of each rule's tree walk.

    python scripts/rules/bench_tree_rules.py [--ckpt DIR|NAME] [--draft early-exit:24] [--sets mt_bench,gsm8k,humaneval]
                                       [--prompts-per-set 2] [--budget 16] [--branching 4,2,1] [--gamma 4]
                                       [--rules sampling,traversal,multipath,block,typical,dropmatch:0.3] [--chain sampling,block]
                                       [--temperature 1] [--seeds 0,1] [--max-new-tokens 64]

Per prompt and seed, every rule walks the same kind of tree (minispec.trees.speculative.generate_tree:
a static tree of --branching children per depth, cut to --budget nodes, --gamma deep, drafted by
--draft), and every --chain rule decodes a chain of gamma = --gamma drafts with the same drafter
(minispec.chain.speculative.generate_chain): a chain of gamma drafts costs gamma + 1 verify rows, a tree
budget + 1. Rules with a tree walk (minispec.trees.walks.walk_names()):

    sampling      multi-draft speculative sampling (recursive rejection over siblings): lossless
    traversal     traversal verification (leaf to root, sequence-level): lossless, never fewer
                  accepted tokens in expectation on a chain
    multipath     greedy multi-path block verification (block verification path by path, the
                  residual passed on): lossless, never fewer accepted tokens than `block`
    block         block verification of the tree's first path only, the other paths drafted and
                  scored but ignored: block verification on the same multi-draft input and the
                  same pass, the baseline multipath's gain is measured against (this script's rule)
    typical       Medusa's typical acceptance (lossy)
    dropmatch:P   DropMatch's tree rule (K = 5 heads at dropout p = P) OR-ed with sampling (lossy)

Chain rules: sampling, block (lossless; block is traversal's chain form), typical, dropmatch:P.

Per row, pooled over prompts and seeds: tau (tokens per verify step, the correction/bonus
counted), acceptance (accepted depth over tree depth, per step), the median over (prompt, seed) of
tok/s over the tree `sampling` row's on the same prompt and seed, and quality: the target's mean
NLL per generated token (float32, one forward over prompt + output), with its paired bootstrap 95%
interval against tree `sampling` (the same (prompt, seed) pairs resampled). A lossless rule's NLL
differs from sampling's only by chance (its interval holds 0); a lossy rule's shows what it costs.

Writes bench_tree_rules.json and .md to --out (default out/bench_tree_rules/); records.jsonl is
appended as the run goes and read back on the next run (resumable: rows done with the same draft,
tree, temperature and length are skipped).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402

PROG = "bench_tree_rules"
TREE_RULES = ("sampling", "traversal", "multipath", "block", "typical", "dropmatch")
CHAIN_RULES = ("sampling", "block", "typical", "dropmatch")
BASE = "tree sampling"


def rows_of(args) -> list[dict]:
    """Every row the run decodes: the trees (sampling first: the base), then the chains."""
    trees = [benchlib.PolicySpec("sampling", "sampling", ())] + [r for r in args.rules if r.text != "sampling"]
    return [{"label": f"{shape} {r.text}", "shape": shape, "policy": r.name, "options": dict(r.options)}
            for shape, rules in (("tree", trees), ("chain", args.chain)) for r in rules]


@functools.cache
def first_path_block_class() -> type:
    """A policy class whose tree walk is block verification of the tree's first path (the root's first
    child, then first children down to a leaf); on a chain, block verification itself."""
    from minispec.acceptance import BlockVerification
    from minispec.trees.tree import DraftTree
    from minispec.trees.walks import TreeDecision, children_by_row, multipath_walk, register_walk

    class FirstPathBlock(BlockVerification):
        pass

    @register_walk(FirstPathBlock)
    def walk(policy, inp) -> TreeDecision:
        children, chain, node = children_by_row(inp.tree), [], -1
        while children[node + 1]:
            node = children[node + 1][0]
            chain.append(node)
        cut = DraftTree.chain([inp.tree.tokens[c] for c in chain], inp.tree.q_draft[chain])
        rows = inp.p_target[[0] + [c + 1 for c in chain]]  # [L+1, V]: the root's row, then the path's
        path, next_token = multipath_walk(cut, rows, inp.generator)  # on a chain: block verification
        return TreeDecision([chain[i] for i in path], next_token)

    return FirstPathBlock


def decode(model, drafter, tree_drafter, row: dict, prompt, args, seed: int, eos: list[int]):
    from minispec import acceptance
    from minispec.chain.speculative import generate_chain as generate
    from minispec.trees.speculative import generate_tree

    if row["shape"] == "tree" and row["policy"] == "block":
        policy = first_path_block_class()()
    else:
        policy = acceptance.get(row["policy"], **row["options"])
    common = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed, eos_token_ids=eos,
                  policy=policy, gamma=args.gamma)
    if row["shape"] == "tree":
        return generate_tree(model, prompt.ids, draft=tree_drafter, tree=args.budget, **common)
    return generate(model, prompt.ids, draft=drafter, **common)


def measure(args, ckpt: Path) -> dict:
    import minispec
    from minispec import kernels
    from minispec.chain.drafters import make_drafter
    from minispec.trees.drafters import TreeSpec, make_tree_drafter

    if args.branching and len(args.branching) > args.gamma:
        raise MinispecError(f"--branching {','.join(map(str, args.branching))}: {len(args.branching)} depths for "
                            f"--gamma {args.gamma} (the tree's depth); expected at most {args.gamma} numbers, or a "
                            "larger --gamma")
    out = benchlib.out_dir(PROG, args.out)
    out.mkdir(parents=True, exist_ok=True)
    records_file = out / "records.jsonl"
    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = benchlib.load_prompts(args.sets, args.prompts_per_set, tokenizer)
    model = kernels.apply(minispec.load_model(ckpt, dtype=torch.float32), "fast", checkpoint=ckpt)
    spec = args.draft
    if not spec.startswith(("early-exit:", "self:", "ngram")):
        from minispec.checkpoints.hub import resolve_checkpoint

        spec = minispec.load_model(resolve_checkpoint(spec, what="--draft"), dtype=torch.float32)
    drafter = make_drafter(spec, model)  # a chain drafter (early exit shares the target's layers)
    tree_drafter = make_tree_drafter(spec, model, TreeSpec(budget=args.budget, branching=args.branching),
                                     depth=args.gamma)
    branching = list(getattr(tree_drafter, "branching", ()))  # what the drafter uses (none for n-grams)
    setting = (f"{args.draft} budget {args.budget} branching {','.join(map(str, branching))} depth {args.gamma} "
               f"T {args.temperature:g} {args.max_new_tokens} tokens")  # records of other settings are not reused
    key = (lambda r: (r["label"], r["set"], r["index"], r["seed"], r["setting"]))
    done = benchlib.read_records(records_file, key)
    rows = rows_of(args)
    eos = tokenizer.eos_token_ids
    with records_file.open("a") as log:
        for prompt in prompts:
            for seed in args.seeds:
                for row in rows:
                    if (row["label"], prompt.set, prompt.index, seed, setting) in done:
                        continue
                    result = decode(model, drafter, tree_drafter, row, prompt, args, seed, eos)
                    s = result.stats
                    r = {"label": row["label"], "set": prompt.set, "index": prompt.index, "seed": seed,
                         "setting": setting, "tokens": result.tokens, "steps": s.get("verify_steps", 0),
                         "drafted": s.get("num_drafted", 0), "accepted": s.get("num_accepted", 0),
                         "tokens_per_second": s["tokens_per_second"],
                         "nll": benchlib.mean_nll(model, prompt.ids, result.tokens)}
                    done[key(r)] = r
                    log.write(json.dumps(benchlib.finite(r)) + "\n")
                    log.flush()
                    print(f"{row['label']:<22} {prompt.set}/{prompt.index} seed {seed}  tau "
                          f"{(len(r['tokens']) - 1) / max(r['steps'], 1):.2f}  {r['tokens_per_second']:.1f} tok/s", flush=True)
    pairs = [(p.set, p.index, seed) for p in prompts for seed in args.seeds]
    return {"settings": {"target": ckpt.name, "draft": args.draft, "sets": list(args.sets), "prompts_per_set": args.prompts_per_set,
                         "budget": args.budget, "branching": branching, "gamma": args.gamma,
                         "temperature": args.temperature, "seeds": list(args.seeds),
                         "max_new_tokens": args.max_new_tokens},
            "labels": [row["label"] for row in rows], "pairs": pairs,
            "records": [done[(row["label"], *pair, setting)] for row in rows for pair in pairs]}


def summarize(result: dict) -> list[dict]:
    by = {(r["label"], r["set"], r["index"], r["seed"]): r for r in result["records"]}
    pairs = [tuple(p) for p in result["pairs"]]
    base_tau = None
    rows = []
    for label in result["labels"]:
        mine = [by[(label, *pair)] for pair in pairs]
        base = [by[(BASE, *pair)] for pair in pairs]
        steps = sum(r["steps"] for r in mine)
        tau = sum(len(r["tokens"]) - 1 for r in mine) / steps if steps else None  # the first token is the prefill's
        if label == BASE:
            base_tau = tau
        usable = [(r["nll"], b["nll"]) for r, b in zip(mine, base) if r["nll"] is not None and b["nll"] is not None]
        rows.append({
            "label": label, "tau": tau, "tau_gain": ratio(tau, base_tau) - 1 if tau and base_tau else None,
            "acceptance": sum(r["accepted"] for r in mine) / max(sum(r["drafted"] for r in mine), 1),
            "speed": median(r["tokens_per_second"] / b["tokens_per_second"] for r, b in zip(mine, base)
                            if b["tokens_per_second"]),
            "nll": sum(n for n, _ in usable) / len(usable) if usable else None,
            "vs_base_nll": benchlib.paired_mean_interval([n for n, _ in usable], [m for _, m in usable]) if usable else None,
        })
    return rows


def render(result: dict) -> str:
    return benchlib.record_markdown(result["run"]) + "\n" + table(result)


def table(result: dict) -> str:
    """The settings in a line, and the table."""
    s = result["settings"]
    text = (f"Target {s.get('target', 'smollm2-135m-instruct')}, T = {s['temperature']}, seeds {s['seeds']}, {len(result['pairs']) // len(s['seeds'])} prompts "
            f"({', '.join(s['sets'])}, {s['prompts_per_set']} each), {s['max_new_tokens']} new tokens; draft "
            f"{s['draft']}; trees: budget {s['budget']}, branching {s['branching']}, depth {s['gamma']}; chains: "
            f"gamma {s['gamma']}. tau pooled; speed: median over (prompt, seed) of tok/s over {BASE}'s; NLL: the "
            f"target's mean per token, with the paired bootstrap 95% interval against {BASE}'s.\n\n")
    return text + md_table(
        ["rule", "tau", f"tau vs {BASE}", "acceptance", f"x {BASE} (median)", "NLL", f"NLL vs {BASE} [95% CI]"],
        [[r["label"], fmt(r["tau"]), "–" if r["tau_gain"] is None else f"{r['tau_gain'] * 100:+.1f}%",
          fmt(r["acceptance"]), fmt(r["speed"], ".2f", "x"), fmt(r["nll"], ".3f"),
          "–" if r["vs_base_nll"] is None else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*r["vs_base_nll"])]
         for r in summarize(result)]) + "\n"


def main(argv=None) -> int:
    parser = benchlib.script_parser(PROG, __doc__)
    parser.add_argument("--draft", default="early-exit:24",
                        help="the drafter: early-exit:N, self:bf16|int8, a checkpoint folder or a known name")
    parser.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.PROMPT_SETS),
                        default="mt_bench,gsm8k,humaneval", help="comma-separated prompt sets")
    parser.add_argument("--prompts-per-set", type=ranged(int, "--prompts-per-set", lo=1, hi=80), default=2,
                        help="the first N prompts of each set")
    parser.add_argument("--budget", type=ranged(int, "--budget", lo=1, hi=64), default=16, help="tree nodes per step")
    parser.add_argument("--branching", type=benchlib.number_list(int, "--branching", 1, sequence=True), default=None,
                        help="children per node at depth 1, 2, ... (a static tree; if not given: 4,2,1 cut to --gamma)")
    parser.add_argument("--gamma", type=ranged(int, "--gamma", lo=1, hi=32), default=4,
                        help="tree depth, and the chains' draft length")
    parser.add_argument("--rules", type=benchlib.policy_list("--rules", TREE_RULES),
                        default="sampling,traversal,multipath,block,typical,dropmatch:p=0.3",
                        help=f"tree rules, comma-separated, among {', '.join(TREE_RULES)}, each NAME[:key=value,...]; "
                             "tree sampling always runs: the base")
    parser.add_argument("--chain", type=benchlib.policy_list("--chain", CHAIN_RULES, empty=True),
                        default="sampling,block", help=f"chain rules at gamma = --gamma, among {', '.join(CHAIN_RULES)}, "
                        "each NAME[:key=value,...]; '' for none")
    parser.add_argument("--temperature", type=ranged(float, "--temperature", lo=0.0, hi=100.0, lo_open=True),
                        default=1.0, help="sampling temperature (> 0: at 0 the lossless walks are all greedy)")
    parser.add_argument("--seeds", type=benchlib.number_list(int, "--seeds", 0), default="0,1", help="comma-separated")
    parser.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1, hi=4096), default=64,
                        help="tokens per prompt")
    return benchlib.run_benchmark(PROG, argv, parser, measure, render)


if __name__ == "__main__":
    raise SystemExit(main())
