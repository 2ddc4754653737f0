"""scripts/ceilings/ngram_tree_ceiling.py: the offline tree replay decides as generate_tree does, and a
width-1 tree replays as ngram_ceiling.py's chain (tiny random models, float64)."""

import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import ngram_ceiling  # noqa: E402
import ngram_tree_ceiling as ntc  # noqa: E402

from minispec.chain.drafters import NgramDrafter  # noqa: E402
from minispec.trees.drafters import NgramTreeDrafter  # noqa: E402
from minispec.trees.speculative import generate_tree  # noqa: E402
from minispec.testing import model_configs, random_model, seeds  # noqa: E402

VOCAB = 12


@settings(max_examples=12, deadline=None)
@given(cfg=model_configs(max_layers=2, vocab_size=VOCAB), seed=seeds, budget=st.integers(1, 6),
       depth=st.integers(1, 4), prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10))
def test_tree_replay_equals_generate_tree(cfg, seed, budget, depth, prompt):
    """NgramTreeDrafter's trees in the real loop: the same tokens, tau and nodes per step as the
    replay of the script's "tree 3-1" source; and the recorded top-1 rows are the greedy tokens."""
    model = random_model(cfg, seed, scale=3.0)
    run = ntc.record(model, prompt, max_new_tokens=20, eos=[], layer=cfg.num_layers, k=2)
    assert [top[0] for top in run.target_top] == run.greedy
    assert run.exit_top == run.target_top  # early exit after every layer is the target
    out = generate_tree(model, prompt, max_new_tokens=20, draft=NgramTreeDrafter(3, 1), tree=budget,
                        gamma=depth, eos_token_ids=[])
    replayed = ntc.replay(ntc.tree_source("ngram", 3, 1), run, budget, depth)
    assert out.tokens == run.greedy
    assert replayed["steps"] == out.stats["verify_steps"]
    assert replayed["tau"] == out.stats["tau"]
    assert abs(replayed["nodes_per_step"] - out.stats["nodes_per_step"]) < 1e-12


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(st.integers(0, 3), min_size=1, max_size=30),
       greedy=st.lists(st.integers(0, 3), min_size=1, max_size=30), gamma=st.integers(1, 8))
def test_width_one_tree_replays_as_the_chain(prompt, greedy, gamma):
    run = ntc.Run(prompt, greedy, [], [])
    chain = ngram_ceiling.offline_tau(NgramDrafter(3, 1).lookup, prompt, greedy, gamma)
    assert ntc.replay(ntc.chain_source(3, 1), run, gamma, gamma)["tau"] == chain


@settings(max_examples=40, deadline=None)
@given(context=st.lists(st.integers(0, 3), min_size=2, max_size=30), budget=st.integers(1, 10),
       depth=st.integers(1, 5))
def test_ngram_order_builds_propose_trees_tree(context, budget, depth):
    """The replay's trie of the ngram order's continuations holds exactly propose_tree's root paths."""
    tree = NgramTreeDrafter(3, 1).propose_tree(context, budget, depth, vocab_size=4)
    paths = set()
    for node in range(tree.num_nodes):
        path, n = [], node
        while n != -1:
            path.append(tree.tokens[n])
            n = tree.parents[n]
        paths.add(tuple(reversed(path)))
    ours = ntc.trie(ntc.continuations(context, ntc.ordered_ends(ntc.suffix_matches(context, ntc.AGREEMENT_CAP), "ngram"), depth), budget)
    assert ours.size == len(paths) and all(ours.accepted(p) == len(p) for p in paths)


@given(weighted=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=5), st.integers(1, 9)),
                         max_size=8), budget=st.integers(1, 8))
def test_best_nodes_keeps_the_best_scored_nodes(weighted, budget):
    tree = ntc.best_nodes(weighted, budget)
    full = ntc.best_nodes(weighted, 10**6)  # every node

    def score(path):
        return sum(w for p, w in weighted if tuple(p[:len(path)]) == tuple(path))

    def paths(t):
        out = []
        for node in range(1, t.size + 1):
            path, n = [], node
            while n:
                path.append(t.token[n])
                n = t.parent[n]
            out.append(tuple(reversed(path)))
        return out

    kept, every = paths(tree), paths(full)
    assert len(kept) == min(budget, len(every))
    dropped = set(every) - set(kept)
    assert all(score(k) >= score(d) for k in kept for d in dropped)
