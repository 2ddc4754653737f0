"""Draft trees (minispec/trees/tree.py): one target pass over every node, then the accepted path kept.

float64 on random tiny Llama, Qwen2 and Qwen3 models (see test_model.py for why float64): each
node's logits from the tree pass equal the last logits of a plain forward of its path, and after
keeping any root-to-node path the cache equals a cache built by feeding that sequence alone, and
keeps working for the next pass.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minispec.chain.drafters import NgramDrafter
from minispec.errors import MinispecError
from minispec.decode import generate
from minispec.model.sampling import SamplingParams
from minispec.testing import loop_setups, random_model, tiny_config
from minispec.testing.checks import P_VALUE_FLOOR
from minispec.testing.distribution import chi_square_p_value, sequence_distribution
from minispec.trees.tree import DraftTree, keep_path, tree_mask, tree_positions
from minispec.trees.drafters import ModelTreeDrafter, NgramTreeDrafter, TreeDrafter
from minispec.trees.speculative import generate_tree

F64 = torch.float64
ATOL = 1e-10  # float64: the tree pass and a plain pass sum the same terms in another order


@st.composite
def draft_trees(draw, vocab: int, max_nodes: int = 10) -> DraftTree:
    """A random tree: each node's parent any earlier node or the root, distinct tokens among siblings."""
    parents, tokens = [], []
    for i in range(draw(st.integers(1, max_nodes))):
        parent = draw(st.integers(-1, i - 1))
        taken = {t for p, t in zip(parents, tokens) if p == parent}
        free = [t for t in range(vocab) if t not in taken]
        if not free:
            continue
        parents.append(parent)
        tokens.append(draw(st.sampled_from(free)))
    q_draft = torch.full((len(tokens), vocab), 1.0 / vocab, dtype=F64)
    return DraftTree(tokens, parents, q_draft)


def tree_pass(model, cache, last: int, tree: DraftTree) -> torch.Tensor:
    """Logits [N+1, V] of [last, node 0..N-1] in one pass with the tree's positions and mask."""
    start = cache.length
    ids = torch.tensor([[last] + tree.tokens])
    hidden = model.forward_hidden(ids, cache, positions=tree_positions(tree, start), mask=tree_mask(tree, start))
    return model.head(hidden[0])


@given(setup=loop_setups(), data=st.data())
def test_each_node_scores_as_a_plain_forward_of_its_path(setup, data):
    cfg, seed, prompt = setup
    model = random_model(cfg, seed, dtype=F64)
    tree = data.draw(draft_trees(cfg.vocab_size))
    seq = prompt + [data.draw(st.integers(0, cfg.vocab_size - 1))]  # the last token is the tree's root
    cache = model.new_cache(1, len(seq) + tree.num_nodes)
    model.forward_hidden(torch.tensor([seq[:-1]]), cache) if len(seq) > 1 else None
    logits = tree_pass(model, cache, seq[-1], tree)  # [N+1, V]
    with torch.no_grad():
        root = model(torch.tensor([seq]))[0, -1]
        torch.testing.assert_close(logits[0], root, atol=ATOL, rtol=0)
        for i in range(tree.num_nodes):
            path_tokens = [tree.tokens[a] for a in tree.path(i)]
            plain = model(torch.tensor([seq + path_tokens]))[0, -1]  # [V]
            torch.testing.assert_close(logits[i + 1], plain, atol=ATOL, rtol=0)


@given(setup=loop_setups(), data=st.data())
def test_keeping_a_path_leaves_the_cache_of_that_sequence(setup, data):
    """After keep_path the cache equals one fed the accepted sequence alone, and the next pass
    (a plain token) gives the logits of a plain forward."""
    cfg, seed, prompt = setup
    model = random_model(cfg, seed, dtype=F64)
    tree = data.draw(draft_trees(cfg.vocab_size))
    node = data.draw(st.integers(-1, tree.num_nodes - 1))  # the deepest accepted node (-1: none)
    path = tree.path(node) if node >= 0 else []
    seq = prompt + [data.draw(st.integers(0, cfg.vocab_size - 1))]
    cache = model.new_cache(1, len(seq) + tree.num_nodes + 1)
    if len(seq) > 1:
        model.forward_hidden(torch.tensor([seq[:-1]]), cache)
    start = cache.length
    tree_pass(model, cache, seq[-1], tree)
    keep_path(cache, start, path)
    accepted = seq + [tree.tokens[a] for a in path]
    fresh = model.new_cache(1, len(accepted) + 1)
    model.forward_hidden(torch.tensor([accepted]), fresh)
    assert cache.length == fresh.length == len(accepted)
    for layer in range(cache.num_layers):
        torch.testing.assert_close(cache.k[layer][:, :, : cache.length], fresh.k[layer][:, :, : fresh.length],
                                   atol=ATOL, rtol=0)
        torch.testing.assert_close(cache.v[layer][:, :, : cache.length], fresh.v[layer][:, :, : fresh.length],
                                   atol=ATOL, rtol=0)
    nxt = data.draw(st.integers(0, cfg.vocab_size - 1))
    with torch.no_grad():
        after = model(torch.tensor([[nxt]]), cache)[0, -1]
        torch.testing.assert_close(after, model(torch.tensor([accepted + [nxt]]))[0, -1], atol=ATOL, rtol=0)


def test_a_chain_is_the_width_one_tree():
    tree = DraftTree.chain([5, 6, 7], torch.zeros(3, 9))
    assert tree.parents == [-1, 0, 1] and tree.depths == [1, 2, 3] and tree.path(2) == [0, 1, 2]
    mask = tree_mask(tree, 4)  # a chain's tree mask is the causal mask after 4 cached positions
    causal = torch.ones(4, 8, dtype=torch.bool).tril(4)
    assert torch.equal(mask, causal)
    assert tree_positions(tree, 4).tolist() == [4, 5, 6, 7]


def test_siblings_never_see_each_other_and_positions_go_by_depth():
    #        root
    #       /    \
    #     0(a)   1(b)
    #     |
    #     2(c)
    tree = DraftTree([10, 11, 12], [-1, -1, 0], torch.zeros(3, 20))
    mask = tree_mask(tree, 2)  # columns: 2 cached, root, node 0, node 1, node 2
    assert mask.tolist() == [
        [True, True, True, False, False, False],  # root
        [True, True, True, True, False, False],  # node 0: root + itself
        [True, True, True, False, True, False],  # node 1: not its sibling node 0
        [True, True, True, True, False, True],  # node 2: its parent node 0, not node 1
    ]
    assert tree_positions(tree, 2).tolist() == [2, 3, 3, 4]


@pytest.mark.parametrize("tokens, parents, what", [
    ([1, 2], [-1, 1], "parent 1"), ([1, 1], [-1, -1], "repeats token 1"), ([1], [-1, 0], "1 tokens but 2 parents"),
])
def test_malformed_trees_are_one_line_errors(tokens, parents, what):
    with pytest.raises(MinispecError, match=what):
        DraftTree(tokens, parents, torch.zeros(len(tokens), 4))


# ============================================================================== the tree loop (greedy)


class RandomTreeDrafter(TreeDrafter):
    """Trees of any shape with arbitrary tokens (the target's argmax now and then), cut to `depth`."""

    name = "random-tree"

    def __init__(self, seed: int, target) -> None:
        self.gen, self.target = torch.Generator().manual_seed(seed), target

    def start(self, max_seq_len):
        pass

    def propose_tree(self, context, budget, depth, vocab_size, params=None, generator=None):
        with torch.no_grad():
            likely = int(self.target(torch.tensor([context]))[0, -1].argmax())
        parents, tokens = [], []
        for _ in range(int(torch.randint(0, budget + 1, (1,), generator=self.gen))):
            parent = int(torch.randint(-1, len(tokens), (1,), generator=self.gen)) if tokens else -1
            if parent >= 0 and (DraftTree(tokens, parents, torch.zeros(len(tokens), vocab_size)).depths[parent]
                                >= depth):
                continue
            token = likely if float(torch.rand(1, generator=self.gen)) < 0.4 else int(
                torch.randint(vocab_size, (1,), generator=self.gen))
            if (parent, token) in set(zip(parents, tokens)):
                continue
            parents.append(parent)
            tokens.append(token)
        return DraftTree(tokens, parents, torch.zeros(len(tokens), vocab_size))


class ChainAsTree(TreeDrafter):
    """The chain n-gram drafter's own proposal, as a width-1 tree."""

    name = "ngram-chain-as-tree"

    def __init__(self, max_ngram: int) -> None:
        self.chain = NgramDrafter(max_ngram=max_ngram)

    def start(self, max_seq_len):
        pass

    def propose_tree(self, context, budget, depth, vocab_size, params=None, generator=None):
        drafts = self.chain.lookup(context, min(budget, depth))
        return DraftTree.chain(drafts, torch.zeros(len(drafts), vocab_size))


@given(setup=loop_setups(), budget=st.integers(1, 12), max_depth=st.integers(1, 6), n_new=st.integers(1, 20),
       kind=st.sampled_from(["ngram-tree", "random"]))
def test_tree_speculative_greedy_equals_plain_greedy(setup, budget, max_depth, n_new, kind):
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    drafter = NgramTreeDrafter(max_ngram=2) if kind == "ngram-tree" else RandomTreeDrafter(seed, target)
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    tree = generate_tree(target, prompt, max_new_tokens=n_new, draft=drafter, tree=budget, gamma=max_depth,
                         eos_token_ids=[])
    assert tree.tokens == plain.tokens
    s = tree.stats
    assert s["tau"] * s["verify_steps"] == pytest.approx(len(tree.tokens) - 1)
    assert s["nodes_per_step"] <= budget and sum(s["accepted_depth_histogram"]) == s["verify_steps"]


@given(setup=loop_setups(), gamma=st.integers(1, 6), n_new=st.integers(1, 20))
def test_a_width_one_tree_is_the_chain_loop(setup, gamma, n_new):
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    chain = generate(target, prompt, max_new_tokens=n_new, draft="ngram:2", gamma=gamma, eos_token_ids=[])
    tree = generate_tree(target, prompt, max_new_tokens=n_new, draft=ChainAsTree(2), tree=gamma,
                         gamma=gamma, eos_token_ids=[])
    assert tree.tokens == chain.tokens
    assert tree.stats["verify_steps"] == chain.stats["verify_steps"]
    assert tree.stats["tau"] == chain.stats["tau"]


def test_ngram_tree_merges_every_earlier_match_under_the_budget():
    #            the suffix [1] occurs at 0, 3 and 6; what followed: [2, 3], [2, 4], [5, 1]
    context = [1, 2, 3, 1, 2, 4, 1, 5, 1]
    drafter = NgramTreeDrafter(max_ngram=1)
    assert drafter.candidates(context, 2) == [[5, 1], [2, 4], [2, 3]]
    tree = drafter.propose_tree(context, budget=8, depth=2, vocab_size=6)
    assert (tree.tokens, tree.parents) == ([5, 1, 2, 4, 3], [-1, 0, -1, 2, 2])  # [2, ...] shared once
    small = drafter.propose_tree(context, budget=3, depth=2, vocab_size=6)
    assert (small.tokens, small.parents) == ([5, 1, 2], [-1, 0, -1])


@given(setup=loop_setups(), n_new=st.integers(1, 16), shape=st.sampled_from(["static", "dynamic"]),
       kind=st.sampled_from(["random", "early-exit"]))
def test_model_trees_keep_tree_greedy_equal_to_plain_greedy(setup, n_new, shape, kind):
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    if kind == "random":
        drafter_model, num_layers = random_model(cfg, seed + 1, scale=3.0), None
    else:
        drafter_model, num_layers = target, max(1, cfg.num_layers - 1)
    branching, width = ((3, 2, 1), None) if shape == "static" else ((3,), 2)
    drafter = ModelTreeDrafter(drafter_model, num_layers=num_layers, branching=branching, width=width)
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    out = generate_tree(target, prompt, max_new_tokens=n_new, draft=drafter, tree=8, gamma=3,
                        eos_token_ids=[])
    assert out.tokens == plain.tokens


@given(setup=loop_setups(), n_new=st.integers(2, 16), width=st.sampled_from([None, 1, 2]))
def test_the_target_drafting_its_own_tree_is_accepted_to_full_depth(setup, n_new, width):
    """The draft's own tree pass (positions by depth, ancestors-only mask on its cache) must give
    the target's own next-token logits: with the target as its own draft model, its argmax path is
    in every tree, so every step accepts as deep as the tree goes (the budget allows it)."""
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    drafter = ModelTreeDrafter(target, branching=(2, 2, 2) if width is None else (2,), width=width)
    out = generate_tree(target, prompt, max_new_tokens=n_new, draft=drafter, tree=14, gamma=3,
                        eos_token_ids=[])
    assert out.tokens == generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[]).tokens
    full_steps = (n_new - 1) // 4  # steps before the last, each 3 drafts + 1 bonus
    assert out.stats["accepted_depth_histogram"][3] >= full_steps



@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_tree_speculative_sampling_keeps_the_target_distribution(kind):
    """The first three sampled tokens (the prefill's, then a depth-2 tree step's) against their
    exact joint distribution under plain sampling, chi-square over 3000 seeded runs on a 6-token
    vocabulary (216 cells, those expected below 5 pooled); the drafter is another random model
    (siblings drawn without replacement) or the n-gram trie (one-hot siblings)."""
    cfg = tiny_config(vocab_size=6, num_layers=1)
    target, other = random_model(cfg, 11, scale=2.0), random_model(cfg, 12, scale=2.0)
    prompt, params, runs = [1, 2, 1, 3, 1], SamplingParams(1.0), 3000
    counts: dict[tuple, int] = {}
    for seed in range(runs):
        drafter = ModelTreeDrafter(other, branching=(3, 2)) if kind == "model" else NgramTreeDrafter(max_ngram=1)
        out = generate_tree(target, prompt, max_new_tokens=4, draft=drafter, tree=6, gamma=2,
                            temperature=1.0, seed=seed, eos_token_ids=[])
        assert out.stats["nodes_per_step"] > 0 or kind == "ngram"
        first = tuple(out.tokens[:3])
        counts[first] = counts.get(first, 0) + 1
    probs = sequence_distribution(target, prompt, 3, params)
    assert chi_square_p_value(counts, probs, runs) > P_VALUE_FLOOR
