"""Draft trees against chains at equal verify budgets: tau, nodes per step, speed (greedy).

    python scripts/speed/bench_trees.py [--prompts 2] [--budgets 8,16] [--layers 24] [--shapes w4k4]
                                  [--chain-gammas 1,2,3,4] [--skip ngram,plain] [--max-new-tokens 64] [--threads 1]

At temperature 0 on Spec-Bench prompts (--sets, --prompts of each), float32, on --kernels (fast by
default: chains and trees alike on minispec.kernels' packed weights). A verify budget B is
B + 1 target rows per step: a chain drafts gamma = B tokens, a tree B nodes. Per prompt, in turn:

    plain                        plain greedy decoding: the baseline of every speed ratio and of "= plain"
    chain early-exit:L gG        speculative.generate_chain, exact policy, gamma G (every budget, and --chain-gammas)
    tree  early-exit:L SHAPE B   tree_speculative.generate_tree, greedy walk, B nodes, depth --depth
    chain ngram gB, tree ngram B the n-gram drafters (chain: the last match; tree: every earlier match, one trie)

Early-exit drafters use the target's first L layers + norm + head, L from --layers. Tree shapes
(--shapes, comma-separated):

    wWkK        ModelTreeDrafter(width=W, branching=(K,)): dynamic, the W most probable paths per level
                expanded by their top-K children, each level cut at the budget (best path probability first)
    sA-B-C      ModelTreeDrafter(branching=(A, B, C)): static, every node at depth d gets the d-th count
                of children, each level cut at the budget (best path probability first)
    SHAPE@B     that shape at budget B only (e.g. s8-1@16); without @B a shape runs at every budget

--dropmatch P adds, for every tree configuration, the same tree walked by DropMatch's naive
rule (the paper's rule on EAGLE3 trees: accept a node whose token is one of the K = --paths
dropout heads' argmaxes, OR-ed with greedy), at dropout p = P; its quality next to greedy's:
"prefix" (the share of plain greedy's tokens reproduced before the first difference) and
"dNLL" (the mean negative log-likelihood per generated token under the target, minus plain
greedy's on the same prompt: how much less likely the text is to the target; 0 for lossless).

Per configuration, medians over prompts of: tau (tokens per verify step, the correction/bonus
counted), nodes per step, draft and verify milliseconds per step (the verify pass of B + 1
rows with its tree mask, against the chain's), and, with plain, tok/s and speed = tok/s / plain tok/s on the same prompt;
"= plain" counts outputs equal to plain greedy's. Then per layer and budget: the best tree shape,
the chain at gamma = B, the best chain with gamma <= B (among those run), and the tree's tau gain
over both; and the accepted-depth histograms summed over prompts. tau at T = 0 does not depend on
timing; the speed columns do, so the output says when the machine was busy.

Writes bench_trees.json and .md to --out (default out/bench_trees/).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.errors import MinispecError  # noqa: E402
from minispec.cli import ranged  # noqa: E402

PROG = "bench_trees"
SKIPPABLE = ("plain", "ngram")
SHAPE = re.compile(r"^(?:w(?P<w>\d+)k(?P<wk>\d+)|s(?P<s>\d+(?:-\d+)*))(?:@(?P<at>\d+))?$")


def parse_shape(text: str) -> dict:
    """'w4k4' / 's8-2-1' -> {'kind': 'dynamic'|'static', ...}; ValueError if malformed."""
    m = SHAPE.match(text)
    if m is None:
        raise ValueError(text)
    if m["w"] is not None:
        shape = {"kind": "dynamic", "width": int(m["w"]), "branching": (int(m["wk"]),)}
    else:
        shape = {"kind": "static", "width": None, "branching": tuple(int(k) for k in m["s"].split("-"))}
    shape["at"] = int(m["at"]) if m["at"] else None
    counts = (shape["width"], *shape["branching"], shape["at"])
    if any(v is not None and v < 1 for v in counts):
        raise ValueError(text)
    return {"name": text.split("@")[0], **shape}


def shape_list(text: str) -> tuple[dict, ...]:
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    try:
        shapes = tuple(parse_shape(s) for s in names)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--shapes = {text!r}: bad shape {e.args[0]!r}; expected wWkK (dynamic) or "
                                          "sA-B-C (static), e.g. w4k4,s16-1")
    if not shapes:
        raise argparse.ArgumentTypeError(f"--shapes = {text!r}; expected at least one shape")
    return shapes


def build_parser():
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.SPEC_BENCH_SETS),
                   default="summarization,rag,math_reasoning", help="Spec-Bench categories, comma-separated")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=2, help="prompts per set")
    p.add_argument("--first-prompt", type=ranged(int, "--first-prompt", lo=0), default=0,
                   help="skip this many prompts of each set first")
    p.add_argument("--budgets", type=benchlib.number_list(int, "--budgets", lo=1), default="8,16",
                   help="verify budgets B (B + 1 rows per step), comma-separated")
    p.add_argument("--depth", type=ranged(int, "--depth", lo=1), default=6, help="the deepest a tree goes")
    p.add_argument("--layers", type=benchlib.number_list(int, "--layers", lo=1), default="24",
                   help="early exit after each of these layers, comma-separated")
    p.add_argument("--shapes", type=shape_list, default="w4k4",
                   help="early-exit tree shapes, comma-separated: wWkK, sA-B-C (see the docstring)")
    p.add_argument("--chain-gammas", type=benchlib.number_list(int, "--chain-gammas", lo=1), default=None,
                   help="early-exit chains at these gammas (if not given: gamma = each budget)")
    p.add_argument("--skip", type=benchlib.name_list("--skip", SKIPPABLE), default=None,
                   help="leave out: plain (no speed columns, no '= plain' check), ngram (the n-gram rows)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=64)
    p.add_argument("--kernels", choices=["fast", "reference"], default="fast", help="the model's kernels (all rows)")
    p.add_argument("--dropmatch", type=ranged(float, "--dropmatch", lo=0, hi=1, hi_open=True), default=None,
                   metavar="P", help="also walk every tree with DropMatch's naive rule at dropout p = P")
    p.add_argument("--paths", type=ranged(int, "--paths", lo=1), default=5, help="DropMatch: dropout paths K")
    return p


def main(argv=None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


def render(result: dict) -> str:
    return "\n".join([benchlib.record_markdown(result["run"]), result["note"], "", result["table"], "",
                      "Best tree shape per layer and budget:", "", result["best_table"], "",
                      "Accepted depth (nodes accepted per step, summed over prompts):", "", result["depth_table"], ""])


def make_drafter(model, layer: int, shape: dict):
    from minispec.trees.drafters import ModelTreeDrafter

    return ModelTreeDrafter(model, num_layers=layer, branching=shape["branching"], width=shape["width"])


def measure(args, ckpt) -> dict:
    import minispec
    from minispec import kernels
    from minispec.acceptance import DropMatch
    from minispec.chain.speculative import generate_chain as generate
    from minispec.trees.drafters import NgramTreeDrafter
    from minispec.trees.speculative import generate_tree

    skip = set(args.skip or ())
    model = minispec.load_model(ckpt, dtype=torch.float32)
    deepest = model.config.num_layers - 1  # an early exit needs at least one layer left out
    if max(args.layers) > deepest:
        raise MinispecError(f"--layers {','.join(map(str, args.layers))}: {ckpt.name} has {model.config.num_layers} "
                            f"layers; expected early exits in [1, {deepest}]")
    kernels.apply(model, args.kernels, checkpoint=ckpt)
    tokenizer = minispec.load_tokenizer(ckpt)
    eos = tokenizer.eos_token_ids
    prompts = [p for p in benchlib.load_prompts(args.sets, args.first_prompt + args.prompts, tokenizer)
               if p.index >= args.first_prompt]
    prompts.sort(key=lambda p: p.index)  # one of each set in turn: a run stopped early is still balanced
    n = args.max_new_tokens
    gammas = sorted(args.chain_gammas or args.budgets)

    tree_policies = [None] + ([DropMatch(p=args.dropmatch, paths=args.paths, criterion="naive")]
                              if args.dropmatch is not None else [])
    configs = {}  # name -> (meta, fn)
    if "plain" not in skip:
        configs["plain"] = ({"kind": "plain"}, lambda ids: generate(model, ids, max_new_tokens=n, eos_token_ids=eos))
    for layer in args.layers:
        for g in gammas:
            configs[f"chain early-exit:{layer} g{g}"] = (
                {"kind": "chain", "layer": layer, "gamma": g},
                lambda ids, g=g, layer=layer: generate(model, ids, max_new_tokens=n, draft=f"early-exit:{layer}",
                                                       gamma=g, eos_token_ids=eos))
        for budget in args.budgets:
            for shape in args.shapes:
                if shape["at"] not in (None, budget):
                    continue
                for policy in tree_policies:
                    configs[f"tree early-exit:{layer} {shape['name']} {budget}{policy_suffix(policy)}"] = (
                        {"kind": "tree", "layer": layer, "shape": shape["name"], "budget": budget,
                         "policy": policy_suffix(policy)},
                        lambda ids, b=budget, layer=layer, shape=shape, policy=policy: generate_tree(
                            model, ids, max_new_tokens=n, tree=b, gamma=args.depth, eos_token_ids=eos,
                            draft=make_drafter(model, layer, shape), policy=policy))
    if "ngram" not in skip:
        for budget in args.budgets:
            configs[f"chain ngram g{budget}"] = (
                {"kind": "ngram chain", "gamma": budget},
                lambda ids, b=budget: generate(model, ids, max_new_tokens=n, draft="ngram", gamma=b, eos_token_ids=eos))
            for policy in tree_policies:
                configs[f"tree ngram {budget}{policy_suffix(policy)}"] = (
                    {"kind": "ngram tree", "budget": budget, "policy": policy_suffix(policy)},
                    lambda ids, b=budget, policy=policy: generate_tree(
                        model, ids, max_new_tokens=n, tree=b, gamma=args.depth, eos_token_ids=eos,
                        draft=NgramTreeDrafter(), policy=policy))

    loads = [benchlib.load_average()]
    per_config = {name: [] for name in configs}
    for prompt in prompts:
        plain_tokens, plain_speed = None, None
        for name, (meta, fn) in configs.items():
            out = fn(prompt.ids)
            s = out.stats
            steps = max(1, s.get("verify_steps", 1))
            row = {"set": prompt.set, "index": prompt.index, "tau": s.get("tau", 1.0), "tok_s": s["tokens_per_second"],
                   "nodes": s.get("nodes_per_step", s.get("num_drafted", 0) / steps),
                   "tokens": len(out.tokens), "steps": s.get("verify_steps"),
                   "depths": s.get("accepted_depth_histogram", s.get("accepted_length_histogram"))}
            row["draft_ms"] = 1000 * s.get("draft_seconds", 0.0) / steps
            row["verify_ms"] = 1000 * s["verify_seconds"] / steps if "verify_seconds" in s else None  # plain: none
            if name == "plain":
                plain_tokens, plain_speed = out.tokens, s["tokens_per_second"]
                plain_nll = benchlib.mean_nll(model, prompt.ids, out.tokens)
            row["same"] = None if plain_tokens is None else out.tokens == plain_tokens
            if args.dropmatch is not None and plain_tokens is not None:
                row["prefix"] = prefix_share(out.tokens, plain_tokens)
                row["dnll"] = benchlib.mean_nll(model, prompt.ids, out.tokens) - plain_nll
            row["speed"] = ratio(s["tokens_per_second"], plain_speed)
            per_config[name].append(row)
            print(f"{prompt.set}#{prompt.index} {name:36s} tau {row['tau']:.3f} nodes {row['nodes']:.1f} "
                  f"depths {row['depths']}", file=sys.stderr, flush=True)
        loads.append(benchlib.load_average())

    metas = {name: meta for name, (meta, _) in configs.items()}
    return {"configs": per_config, "meta": metas, "loads": loads, "note": speed_note(skip, loads),
            **tables(per_config, metas, args, gammas, with_speed="plain" not in skip)}


def policy_suffix(policy) -> str:
    return "" if policy is None else f" dropmatch-naive p{policy.p:g}"


def prefix_share(tokens: list[int], plain: list[int]) -> float:
    """The share of plain greedy's tokens reproduced before the first difference."""
    same = next((i for i, (a, b) in enumerate(zip(tokens, plain)) if a != b), min(len(tokens), len(plain)))
    return same / len(plain)


def speed_note(skip: set, loads: list) -> str:
    if "plain" in skip:
        return "tau only (plain skipped: no speed columns, no '= plain' check)."
    return (f"Load average during the run: {', '.join(str(x) for x in loads)}. tau does not depend on timing; "
            "the tok/s and speed columns do: trust them only if the machine ran nothing else (load near 1).")


def depth_counts(records) -> list[int]:
    total: list[int] = []
    for r in records:
        for i, c in enumerate(r["depths"] or []):
            total.extend([0] * (i + 1 - len(total)))
            total[i] += c
    while total and total[-1] == 0:
        total.pop()
    return total


def tables(per_config, metas, args, gammas, with_speed) -> dict:
    quality = with_speed and args.dropmatch is not None
    header = (["config", "tau", "nodes/step", "draft ms/step", "verify ms/step", "prompts"]
              + (["tok/s", "speed", "= plain"] if with_speed else []) + (["prefix", "dNLL"] if quality else []))
    rows = []
    tau = {name: median(r["tau"] for r in records) for name, records in per_config.items()}
    for name, records in per_config.items():
        row = [name, fmt(tau[name], ".3f"), fmt(median(r["nodes"] for r in records), ".1f"),
               fmt(median(r["draft_ms"] for r in records), ".1f"), fmt(median(r["verify_ms"] for r in records), ".1f"),
               str(len(records))]
        if with_speed:
            row += [fmt(median(r["tok_s"] for r in records), ".1f"), fmt(median(r["speed"] for r in records)),
                    f"{sum(bool(r['same']) for r in records)}/{len(records)}"]
        if quality:
            row += [fmt(median(r["prefix"] for r in records), ".2f"), fmt(median(r["dnll"] for r in records), "+.3f")]
        rows.append(row)

    def pct(a, b):
        return f"{100 * (a / b - 1):+.0f}%" if a is not None and b else "–"

    best_rows, best = [], []
    for layer in args.layers:
        chain_tau = {g: tau[f"chain early-exit:{layer} g{g}"] for g in gammas}
        for budget in args.budgets:
            trees = {m["shape"]: tau[name] for name, m in metas.items()
                     if m["kind"] == "tree" and m["layer"] == layer and m["budget"] == budget and not m["policy"]}
            if not trees:
                continue
            shape = max(trees, key=lambda s: trees[s])
            fitting = [g for g in gammas if g <= budget]
            g_best = max(fitting, key=lambda g: chain_tau[g]) if fitting else None
            entry = {"layer": layer, "budget": budget, "shape": shape, "tau": trees[shape],
                     "chain_gB": chain_tau.get(budget), "best_chain_gamma": g_best, "best_chain": chain_tau.get(g_best)}
            best.append(entry)
            best_rows.append([str(layer), str(budget), shape, fmt(trees[shape], ".3f"),
                              fmt(entry["chain_gB"], ".3f") if budget in chain_tau else "not run",
                              f"g{g_best}: {fmt(chain_tau[g_best], '.3f')}" if g_best else "none run",
                              pct(trees[shape], entry["chain_gB"]), pct(trees[shape], entry["best_chain"])])
    depth_rows = [[name, " ".join(map(str, depth_counts(records)))] for name, records in per_config.items()
                  if metas[name]["kind"] != "plain"]
    return {"table": md_table(header, rows), "best": best,
            "best_table": md_table(["layer", "B", "best shape", "tau", "chain gB", "best chain g<=B",
                                    "gain vs gB", "gain vs best chain"], best_rows),
            "depth_table": md_table(["config", "steps with 0, 1, 2, ... accepted"], depth_rows)}


if __name__ == "__main__":
    sys.exit(main())
