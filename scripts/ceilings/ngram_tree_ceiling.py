"""Do better candidate sources make n-gram draft trees worth it? tau of draft trees, offline.

    python scripts/ceilings/ngram_tree_ceiling.py --threads 1 [--prompts 10] [--budgets 8,16,32] [--max-new-tokens 128]

The tree version of ngram_ceiling.py. At temperature 0 a tree's accepted path is the longest root
path whose tokens equal the target's greedy tokens (generate_tree's greedy walk), so one plain
greedy run per prompt decides every step of every source offline:

    step:  tree = source(prompt + emitted, B nodes, depth d);  n = longest root path equal to greedy's next n;
           emit n + 1 tokens (the accepted nodes and the target's own next token)
    tau  = tokens emitted / steps

A tree of B nodes and a chain of gamma = B drafts cost the same verify pass (B + 1 rows), so the
sources compare at equal budgets B (--budgets). The greedy run is float32 on the reference kernels
(model.py as written), up to --max-new-tokens or eos; then ONE forward over prompt + greedy gives,
at every step's position, the target's top-k and the early exit's top-k (the first --layer layers
+ final norm + LM head: what ModelTreeDrafter(target, num_layers=L) computes for its first level).

Sources (all n-gram lookups search the context itself: prompt + emitted; "ngram order" is
NgramTreeDrafter's: n = max down to min, most recent first; continuations merged into a trie
under the node budget, in order):

    chain gB / chain g<=6        NgramDrafter(3, 1): the most recent match; gamma = B / min(B, 6)
    tree 3-1 d6 / tree 3-1       NgramTreeDrafter(3, 1) as it is: every earlier match; depth 6 / B
    tree 5-1                     the same with n = 5 down to 1
    tree every match, no budget  every continuation of every match of the last token, depth B, NO node
                                 budget: the ceiling of any ordering or pruning of these candidates
                                 (its verify pass is every node, so no speed bound is given)
    tree recent                  every match of the last token, most recent first (no n-gram ranking)
    tree longest                 every match, the longest backward agreement first (ties: most recent)
    tree freq-lex / -4 / -2      every match weighs base ** min(agreement, cap) (1000 ** min(., 5): the
                                 longest n-gram class, then how many matches; 4 or 2 ** min(., 8): softer);
                                 a node's score = the weights of the continuations through it; the
                                 B best nodes (a parent scores at least its children)
    exit top-k + tree            first level: the early exit's top-k after the last committed token;
                                 under each child c the n-gram tree of context + [c]; round robin
    tree ∪ exit top-1            the early exit's top-1 (+ its n-gram tree) and the plain n-gram tree
                                 of the context, in one trie, round robin
    oracle top-k + tree          first level: the TARGET's top-k after the last committed token. An
                                 upper bound, not a drafter: in the loop that token (the correction
                                 or bonus) is row 0 of the coming verify pass, so its distribution
                                 costs an extra full decode step. Its top-1 is greedy's next token.

Draft cost per step, in decode steps (one target pass of one row): n-gram 0 (a lookup); exit
L / num_layers (one early-exit pass of one row, on the target's cache); oracle 1. The markdown
shows tau / (1 + cost): the speed-up such a source could reach if a verify pass of B + 1 rows cost
no more than a decode step (it costs more, so this is an upper bound). Medians over the prompts of
each set (--sets, the first --prompts of each Spec-Bench category); "x chain" is the median over
prompts of tau / the chain's tau at the same B. The JSON keeps each prompt's greedy tokens and
top-k rows, so other sources can be replayed from it without the model (Run(prompt ids, greedy,
target_top, exit_top)). Writes ngram_tree_ceiling.json and .md to --out (default
out/ngram_tree_ceiling/).
"""

from __future__ import annotations

import sys
from pathlib import Path
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.chain.drafters import NgramDrafter, ngram_order, suffix_matches  # noqa: E402

PROG = "ngram_tree_ceiling"
AGREEMENT_CAP = 64  # backward agreement is counted up to this many tokens
NO_BUDGET = 10**9


# ------------------------------------------------------------------------------ trees and runs


class Tree:
    """A draft tree as a trie: node 0 is the root (the last committed token); kids[node] maps a
    token to its child there. Shared prefixes are one node, as in NgramTreeDrafter.propose_tree."""

    def __init__(self) -> None:
        self.kids: list[dict[int, int]] = [{}]
        self.parent, self.token, self.depth = [-1], [-1], [0]

    @property
    def size(self) -> int:
        return len(self.kids) - 1

    def child(self, node: int, token: int) -> int:
        """The child of `node` carrying `token`, created if missing."""
        found = self.kids[node].get(token)
        if found is None:
            found = self.kids[node][token] = len(self.kids)
            self.kids.append({})
            self.parent.append(node)
            self.token.append(token)
            self.depth.append(self.depth[node] + 1)
        return found

    def insert(self, path: Sequence[int], budget: int) -> bool:
        """Merge `path` in from the root, adding nodes while fewer than `budget`. False once the
        tree is full (propose_tree's rule: stop at the first path that fills it)."""
        node = 0
        for token in path:
            if token not in self.kids[node] and self.size == budget:
                return False
            node = self.child(node, token)
        return self.size < budget

    def accepted(self, want: Sequence[int]) -> int:
        """How many of `want` (greedy's next tokens) the tree holds as a root path: the greedy walk."""
        node = 0
        for n, token in enumerate(want):
            node = self.kids[node].get(token)
            if node is None:
                return n
        return len(want)


def trie(paths: Iterable[Sequence[int]], budget: int) -> Tree:
    """The paths merged in order until `budget` nodes."""
    tree = Tree()
    for path in paths:
        if path and not tree.insert(path, budget):
            break
    return tree


def best_nodes(weighted: Iterable[tuple[Sequence[int], float]], budget: int) -> Tree:
    """Every (path, weight) merged into one trie, each node scored by the weights of the paths
    through it; then the `budget` best nodes (ties: shallower, then earlier). A parent scores at
    least as much as its children and is shallower, so the kept nodes form a tree."""
    full, score = Tree(), [0.0]
    for path, weight in weighted:
        node = 0
        for token in path:
            node = full.child(node, token)
            if node == len(score):
                score.append(0.0)
            score[node] += weight
    kept = sorted(range(1, full.size + 1), key=lambda n: (-score[n], full.depth[n], n))[:budget]
    tree, new = Tree(), {0: 0}
    for n in kept:
        new[n] = tree.child(new[full.parent[n]], full.token[n])  # KeyError = a child kept without its parent
    return tree


def round_robin(lists: Sequence[Sequence]) -> list:
    """The first items of every list, then the second items, ..."""
    return [items[i] for i in range(max(map(len, lists), default=0)) for items in lists if i < len(items)]


@dataclass
class Run:
    """One prompt's greedy continuation, and at each step's position what the target and the
    early exit rank first: target_top[i] / exit_top[i] are their top-k for greedy[i], i.e. after
    prompt + greedy[:i]."""

    prompt: list[int]
    greedy: list[int]
    target_top: list[list[int]]
    exit_top: list[list[int]]
    _matches: dict = field(default_factory=dict, repr=False)

    def context(self, e: int, extra: Sequence[int] = ()) -> list[int]:
        return self.prompt + self.greedy[:e] + list(extra)

    def matches(self, e: int, extra: tuple[int, ...] = ()) -> list[tuple[int, int]]:
        """suffix_matches of context(e, extra), remembered (every source asks at the same steps)."""
        key = (e, extra)
        if key not in self._matches:
            self._matches[key] = suffix_matches(self.context(e, extra), AGREEMENT_CAP)
        return self._matches[key]


def ordered_ends(matches: list[tuple[int, int]], order: str, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The ends of suffix_matches (minispec.chain.drafters) in the order a source takes them; repeats
    dropped (a repeat proposes the same continuation, which adds no node to a trie, so dropping it
    changes no tree).

    ngram:   NgramTreeDrafter's (ngram_order): n = max_ngram down to min_ngram, most recent first within each n
    recent:  most recent first, any agreement >= min_ngram
    longest: the longest agreement first (ties: most recent)
    """
    if order == "ngram":
        ends = ngram_order(matches, max_ngram, min_ngram)
    elif order == "recent":
        ends = [end for end, agree in matches if agree >= min_ngram]
    elif order == "longest":
        ends = [end for end, agree in sorted(matches, key=lambda m: (-m[1], -m[0])) if agree >= min_ngram]
    else:
        raise ValueError(order)
    return list(dict.fromkeys(ends))


def continuations(context: Sequence[int], ends: Iterable[int], depth: int) -> list[list[int]]:
    return [list(context[end + 1:end + 1 + depth]) for end in ends] if depth > 0 else []


# ----------------------------------------------------------------------------------- sources

Source = Callable[[Run, int, int, int], Tree]  # (run, e, budget, depth) -> the tree drafted after prompt + greedy[:e]


def chain_source(max_ngram: int = 3, min_ngram: int = 1) -> Source:
    lookup = NgramDrafter(max_ngram, min_ngram).lookup
    return lambda run, e, budget, depth: trie([lookup(run.context(e), min(budget, depth))], budget)


def tree_source(order: str = "ngram", max_ngram: int = 3, min_ngram: int = 1) -> Source:
    def source(run, e, budget, depth):
        ends = ordered_ends(run.matches(e), order, max_ngram, min_ngram)
        return trie(continuations(run.context(e), ends, depth), budget)
    return source


def freq_source(base: float, cap: int) -> Source:
    def source(run, e, budget, depth):
        context = run.context(e)
        return best_nodes(((context[end + 1:end + 1 + depth], base ** min(agree, cap)) for end, agree in run.matches(e)),
                          budget)
    return source


def first_level_source(which: str, k: int, union: bool = False) -> Source:
    """First level: `which`'s ("exit" or "target") top-k after the last committed token, each child
    c continued by the n-gram tree (ngram order, 3-1) of context + [c]; with union, the plain n-gram
    tree of the context as one more list in the round robin."""
    def source(run, e, budget, depth):
        lists = []
        for c in (run.exit_top if which == "exit" else run.target_top)[e][:k]:
            ends = ordered_ends(run.matches(e, (c,)), "ngram")
            lists.append([[c]] + [[c] + cont for cont in continuations(run.context(e, (c,)), ends, depth - 1)])
        if union:
            lists.append(continuations(run.context(e), ordered_ends(run.matches(e), "ngram"), depth))
        return trie(round_robin(lists), budget)
    return source


@dataclass
class Variant:
    source: Source
    depth: Callable[[int], int]  # budget -> the deepest a tree (or chain) goes
    cost: str  # draft cost per step, in decode steps (see the module docstring)
    cost_steps: float | None  # None: no speed bound (the verify pass is not B + 1 rows)
    budget: Callable[[int], int] = lambda b: b  # B -> the most nodes per tree


def variants(layer: int, num_layers: int, k: int, depth_cap: int) -> dict[str, Variant]:
    full, capped = (lambda b: b), (lambda b: min(b, depth_cap))
    exit_cost = layer / num_layers
    v = {
        "chain gB": Variant(chain_source(), full, "0", 0.0),
        f"chain g<={depth_cap}": Variant(chain_source(), capped, "0", 0.0),
        f"tree 3-1 d{depth_cap}": Variant(tree_source(), capped, "0", 0.0),
        "tree 3-1": Variant(tree_source(), full, "0", 0.0),
        "tree 5-1": Variant(tree_source("ngram", 5, 1), full, "0", 0.0),
        "tree every match, no budget": Variant(tree_source("recent"), full, "0 (verify: every node)", None,
                                               budget=lambda b: NO_BUDGET),
        "tree recent": Variant(tree_source("recent"), full, "0", 0.0),
        "tree longest": Variant(tree_source("longest"), full, "0", 0.0),
        "tree freq-lex": Variant(freq_source(1000.0, 5), full, "0", 0.0),
        "tree freq-4": Variant(freq_source(4.0, 8), full, "0", 0.0),
        "tree freq-2": Variant(freq_source(2.0, 8), full, "0", 0.0),
        "exit top-1 + tree": Variant(first_level_source("exit", 1), full, f"{exit_cost:.2f}", exit_cost),
    }
    if k > 1:
        v[f"exit top-{k} + tree"] = Variant(first_level_source("exit", k), full, f"{exit_cost:.2f}", exit_cost)
    v["tree ∪ exit top-1"] = Variant(first_level_source("exit", 1, union=True), full, f"{exit_cost:.2f}", exit_cost)
    v["oracle top-1 + tree"] = Variant(first_level_source("target", 1), full, "1 (oracle)", 1.0)
    if k > 1:
        v[f"oracle top-{k} + tree"] = Variant(first_level_source("target", k), full, "1 (oracle)", 1.0)
    return v


# ------------------------------------------------------------------------------------ replay


def replay(source: Source, run: Run, budget: int, depth: int) -> dict:
    """tau, steps and nodes per step of `source` drafting against the greedy continuation (see the
    module docstring). Never drafts past the end, as generate_tree does."""
    greedy, e, steps, nodes = run.greedy, 1, 0, 0  # the prefill gives the first token
    while e < len(greedy):
        d = min(depth, len(greedy) - e - 1)
        tree = source(run, e, budget, d) if d > 0 else Tree()
        assert tree.size <= budget
        e += tree.accepted(greedy[e:e + d]) + 1
        steps += 1
        nodes += tree.size
    return {"tau": (len(greedy) - 1) / steps if steps else 1.0, "steps": steps,
            "nodes_per_step": nodes / steps if steps else 0.0}


@torch.inference_mode()
def record(model, prompt: list[int], *, max_new_tokens: int, eos: Sequence[int], layer: int, k: int) -> Run:
    """The greedy continuation (speculative.generate_chain, no draft) and, from one forward over
    prompt + greedy (one more for the early exit), every step's top-k of the target and of the
    first `layer` layers."""
    from minispec.chain.speculative import generate_chain as generate

    greedy = generate(model, prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos).tokens
    ids = torch.tensor([prompt + greedy[:-1]], device=model.device)  # row len(prompt) - 1 + i predicts greedy[i]
    start = len(prompt) - 1
    tops = []
    for num_layers in (None, layer):
        hidden = model.forward_hidden(ids, num_layers=num_layers)[0, start:]  # [len(greedy), d]
        tops.append(model.head(hidden).float().topk(k, dim=-1).indices.tolist())
    return Run(list(prompt), list(greedy), tops[0], tops[1])


# ------------------------------------------------------------------------------------- the run


def build_parser():
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.SPEC_BENCH_SETS),
                   default="summarization,rag", help="Spec-Bench categories, comma-separated")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=10, help="prompts per set")
    p.add_argument("--budgets", type=benchlib.number_list(int, "--budgets", lo=1), default="8,16,32",
                   help="verify budgets B (B + 1 rows per step), comma-separated")
    p.add_argument("--depth-cap", type=ranged(int, "--depth-cap", lo=1), default=6,
                   help="the capped chain's and tree's deepest draft")
    p.add_argument("--layer", type=ranged(int, "--layer", lo=1), default=24, help="early exit after this layer")
    p.add_argument("--top-k", type=ranged(int, "--top-k", lo=1), default=4, help="first-level children (exit, oracle)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2), default=128,
                   help="most new tokens of each greedy run (stops at eos)")
    return p


def main(argv=None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


def measure(args, ckpt) -> dict:
    import minispec
    from minispec.errors import MinispecError

    model = minispec.load_model(ckpt, dtype=torch.float32)  # the reference kernels
    if args.layer > model.config.num_layers:
        raise MinispecError(f"--layer {args.layer}: the model has {model.config.num_layers} layers")
    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = benchlib.load_prompts(args.sets, args.prompts, tokenizer)
    chosen = variants(args.layer, model.config.num_layers, args.top_k, args.depth_cap)
    results = {name: {str(b): [] for b in args.budgets} for name in chosen}
    runs = []
    for prompt in prompts:
        t0 = time.perf_counter()
        run = record(model, prompt.ids, max_new_tokens=args.max_new_tokens, eos=tokenizer.eos_token_ids,
                     layer=args.layer, k=args.top_k)
        t_model = time.perf_counter() - t0
        pairs = list(zip(run.greedy, run.target_top, run.exit_top))
        runs.append({"set": prompt.set, "index": prompt.index, "source_id": prompt.source_id,
                     "prompt_tokens": len(prompt.ids), "new_tokens": len(run.greedy),
                     # the full forward's argmax against the greedy run's token (both float32, reference)
                     "target_top1_differs": sum(g != t[0] for g, t, _ in pairs),
                     "exit_top1_agrees": sum(g == x[0] for g, _, x in pairs) / len(pairs),
                     "exit_topk_holds": sum(g in x for g, _, x in pairs) / len(pairs),
                     # enough to replay other sources later without the model: Run(prompt ids, these)
                     "greedy": run.greedy, "target_top": run.target_top, "exit_top": run.exit_top})
        for name, variant in chosen.items():
            for budget in args.budgets:
                r = replay(variant.source, run, variant.budget(budget), variant.depth(budget))
                results[name][str(budget)].append({"set": prompt.set, "index": prompt.index, **r})
        print(f"{prompt.set}#{prompt.index}: {len(prompt.ids)}+{len(run.greedy)} tokens, model {t_model:.0f} s, "
              f"replay {time.perf_counter() - t0 - t_model:.0f} s", file=sys.stderr, flush=True)
    return {"settings": {"sets": list(args.sets), "prompts": args.prompts, "budgets": list(args.budgets),
                         "max_new_tokens": args.max_new_tokens, "layer": args.layer,
                         "num_layers": model.config.num_layers, "top_k": args.top_k, "depth_cap": args.depth_cap,
                         "dtype": "float32", "kernels": "reference"},
            "costs": {name: {"text": v.cost, "decode_steps": v.cost_steps} for name, v in chosen.items()},
            "runs": runs, "results": results}


def render(result: dict) -> str:
    s, results, costs = result["settings"], result["results"], result["costs"]
    budgets = [str(b) for b in s["budgets"]]
    parts = [benchlib.record_markdown(result["run"])]
    for name in s["sets"]:
        runs = [r for r in result["runs"] if r["set"] == name]

        def of(variant, b, key="tau", name=name):
            return [r[key] for r in results[variant][b] if r["set"] == name]

        def gain(variant, b):
            return median(t / c for t, c in zip(of(variant, b), of("chain gB", b)))

        tau_rows, speed_rows, node_rows = [], [], []
        for variant in results:
            tau_rows.append([variant, costs[variant]["text"]] + [
                f"{fmt(median(of(variant, b)))} ({fmt(gain(variant, b))}x)" for b in budgets])
            cost = costs[variant]["decode_steps"]
            speed_rows.append([variant] + [fmt(None if cost is None else median(t / (1 + cost) for t in of(variant, b)))
                                           for b in budgets])
            node_rows.append([variant] + [fmt(median(of(variant, b, "nodes_per_step")), ".1f") for b in budgets])
        parts.append(f"\n## {name}: {len(runs)} prompts, {fmt(median(r['new_tokens'] for r in runs), '.0f')} new tokens "
                     f"(median), {fmt(median(r['prompt_tokens'] for r in runs), '.0f')} prompt tokens (median)\n")
        parts.append("Median tau (median of tau / chain gB's tau on the same prompt):\n")
        parts.append(md_table(["source", "draft cost (decode steps)", *(f"B={b}" for b in budgets)], tau_rows))
        parts.append("\nMedian tau / (1 + draft cost): the speed-up if a verify pass cost one decode step (an upper bound):\n")
        parts.append(md_table(["source", *(f"B={b}" for b in budgets)], speed_rows))
        parts.append("\nMedian nodes per step:\n")
        parts.append(md_table(["source", *(f"B={b}" for b in budgets)], node_rows))
        parts.append(f"\nEarly exit at layer {s['layer']}/{s['num_layers']}: its top-1 is greedy's next token at a "
                     f"median {fmt(median(100 * r['exit_top1_agrees'] for r in runs), '.0f')}% of positions, its "
                     f"top-{s['top_k']} holds it at {fmt(median(100 * r['exit_topk_holds'] for r in runs), '.0f')}%. "
                     f"The full forward's argmax differs from the greedy run's token at "
                     f"{sum(r['target_top1_differs'] for r in runs)} of {sum(r['new_tokens'] for r in runs)} positions.\n")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
