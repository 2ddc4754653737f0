"""Greedy multi-path block verification (minispec/acceptance/multipath.py, its walk multipath_walk in
minispec/trees/walks/multipath.py), float64.

Exactly, on tiny vocabularies and small trees whose siblings are drawn without replacement (the
tree shapes and tables of test_policy_traversal.py): the output is distributed as the target's;
the expected number of accepted tokens is never below block verification's on the tree's first
path, and above it on a case built for it. Draw for draw: block verification on a chain.
Chi-square through the walk on sampled trees and an n-gram trie with a power check
(test_tree_acceptance.py's harness); through the real loop: check_policy, in test_testing.py."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minispec.acceptance import BlockVerification, MultiPathBlockVerification
from minispec.trees.tree import DraftTree
from minispec.trees.walks import children_by_row, multipath_block, multipath_walk, traversal_walk, traverse
from minispec.testing import seeds
from minispec.testing.checks import P_VALUE_FLOOR
from test_policy_block import random_tables
from test_policy_traversal import (SHAPES, cases, chains, drawn_trees, enumerate_outcomes, expected_accepted,
                                   shape_depth, target_rows)
from test_tree_acceptance import TREE_SOURCES, lossless_p_values

F64 = torch.float64


def first_path(tree: DraftTree) -> list[int]:
    """The root's first child, then each node's first child down to a leaf."""
    children = children_by_row(tree)
    path, node = [], -1
    while children[node + 1]:
        node = children[node + 1][0]
        path.append(node)
    return path


def block_on_first_path(tree: DraftTree, rows: torch.Tensor):
    """Block verification of the first path alone (the same drafts, the other paths ignored), as a
    walk with tests: the multipath walk on the tree cut down to that path."""
    chain = first_path(tree)
    index = {node: i for i, node in enumerate(chain)}
    cut = DraftTree([tree.tokens[c] for c in chain], [index.get(tree.parents[c], -1) for c in chain],
                    tree.q_draft[chain])
    cut_rows = torch.stack([rows[0]] + [rows[c + 1] for c in chain])

    def run(accept):
        path, next_row = multipath_block(cut, cut_rows, lambda node, h: accept(chain[node], h))
        return [chain[i] for i in path], next_row

    return run


@settings(max_examples=30, deadline=None)
@given(case=cases)
def test_multipath_is_lossless_exactly(case):
    """P(the first depth+1 emitted tokens) over every fill and every test outcome, completed by the
    target's own sampling where the step emitted fewer, equals the target's (round-off ~1e-15)."""
    seed, shape, vocab, ties = case
    parents = SHAPES[shape]
    depth = shape_depth(parents)
    target, draft = random_tables(seed, vocab, depth, ties)
    fills = list(drawn_trees(parents, vocab, draft))
    assume(abs(sum(prob for prob, _ in fills) - 1) < 1e-12)  # the draft can fill the shape
    length = depth + 1
    got: dict[tuple, float] = {}

    def complete(prefix: tuple, prob: float):
        if len(prefix) == length:
            got[prefix] = got.get(prefix, 0.0) + prob
            return
        for v in range(vocab):
            if target[prefix][v] > 0:
                complete(prefix + (v,), prob * float(target[prefix][v]))

    for fill_prob, tree in fills:
        rows = target_rows(target, tree)
        for prob, path, next_row in enumerate_outcomes(lambda accept: multipath_block(tree, rows, accept)):
            next_dist = next_row / next_row.sum()
            for y in range(vocab):
                if prob * next_dist[y] > 0:
                    complete(tuple(tree.tokens[a] for a in path) + (y,), fill_prob * prob * float(next_dist[y]))
    for seq in itertools.product(range(vocab), repeat=length):
        want = 1.0
        for k in range(length):
            want *= float(target[seq[:k]][seq[k]])
        assert got.get(seq, 0.0) == pytest.approx(want, abs=1e-12), (seq, got.get(seq, 0.0), want)


@settings(max_examples=30, deadline=None)
@given(case=cases)
def test_multipath_accepts_at_least_as_many_tokens_as_block_verification_on_the_first_path(case):
    """E[accepted] over the fills and the tests, exactly: multipath >= block verification of the same
    tree's first path; and every outcome's path starts with what that block verification keeps."""
    seed, shape, vocab, ties = case
    parents = SHAPES[shape]
    target, draft = random_tables(seed, vocab, shape_depth(parents), ties)
    fills = list(drawn_trees(parents, vocab, draft))
    assume(abs(sum(prob for prob, _ in fills) - 1) < 1e-12)
    ours = block = 0.0
    for fill_prob, tree in fills:
        rows = target_rows(target, tree)
        ours += fill_prob * expected_accepted(tree, rows, lambda accept: multipath_block(tree, rows, accept))
        block += fill_prob * expected_accepted(tree, rows, block_on_first_path(tree, rows))
    assert ours >= block - 1e-12, (ours, block)


def test_multipath_beats_block_verification_where_the_second_path_is_the_targets():
    """Two root children: the first (token 0) the target never takes, the second (token 1) it always
    does. Block verification on the first path stops at the root (0 tokens); multipath then tests
    token 1 against the residual (0, 1): min(1, 1 / q_2(1)) = 1, so one token, surely."""
    p_rows = torch.tensor([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]], dtype=F64)  # root, node 0, node 1
    tree = DraftTree([0, 1], [-1, -1], torch.tensor([[0.6, 0.4], [0.0, 1.0]], dtype=F64))
    ours = expected_accepted(tree, p_rows, lambda accept: multipath_block(tree, p_rows, accept))
    block = expected_accepted(tree, p_rows, block_on_first_path(tree, p_rows))
    assert (ours, block) == (pytest.approx(1.0), pytest.approx(0.0))


@given(inp=chains(), seed=seeds)
def test_on_a_chain_multipath_is_block_verification_draw_for_draw(inp, seed):
    """The same coins, the same decision, the same generator state after."""
    inp.generator = torch.Generator().manual_seed(seed)
    block = BlockVerification()(inp)
    walk_generator = torch.Generator().manual_seed(seed)
    tree = DraftTree.chain(inp.draft_tokens.tolist(), inp.q_draft)
    path, next_token = multipath_walk(tree, inp.p_target, walk_generator)
    assert (len(path), next_token) == (block.num_accepted, block.next_token)
    assert path == list(range(block.num_accepted))
    assert torch.equal(walk_generator.get_state(), inp.generator.get_state())
    inp.generator = torch.Generator().manual_seed(seed)
    assert (MultiPathBlockVerification()(inp).num_accepted, ) == (block.num_accepted, )


@st.composite
def root_forks(draw):
    """K chains that part at the root (the multi-draft input "several chains"), float64: each chain a
    root child then a line; node rows random, T = 1 rows, draft rows with the elder siblings' first
    tokens removed at the root (what a drafter without replacement records)."""
    vocab, num_chains, length = draw(st.integers(2, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(draw(seeds))
    tokens, parents, q_rows, taken = [], [], [], []
    for _ in range(min(num_chains, vocab)):
        q = torch.softmax(2 * torch.randn(vocab, generator=gen, dtype=F64), -1)
        q[taken] = 0.0
        q = q / q.sum()
        for depth in range(length):
            token = int(torch.multinomial(q, 1, generator=gen))
            tokens.append(token)
            parents.append(-1 if depth == 0 else len(tokens) - 2)
            q_rows.append(q)
            if depth == 0:
                taken.append(token)
            q = torch.softmax(2 * torch.randn(vocab, generator=gen, dtype=F64), -1)
    tree = DraftTree(tokens, parents, torch.stack(q_rows))
    p_target = torch.softmax(3 * torch.randn(len(tokens) + 1, vocab, generator=gen, dtype=F64), -1)
    return tree, p_target


@given(case=root_forks(), seed=seeds)
def test_on_chains_that_part_at_the_root_multipath_is_traversal_draw_for_draw(case, seed):
    """Traversal, having turned down a whole chain, gives the root the residual and weight
    min(1, m / (m + 1 - 1)) = 1: block verification of the next chain against the residual, which is
    what multipath does. The rules part only below the root (the next test)."""
    tree, p_target = case
    ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    assert multipath_walk(tree, p_target, ours) == traversal_walk(tree, p_target, theirs)
    assert torch.equal(ours.get_state(), theirs.get_state())


def test_below_the_root_traversal_tries_the_siblings_first_and_accepts_more_here():
    """On the "mixed" shape (a node with two children below the root) the two lossless rules part:
    traversal tests a node's other children before stopping at it, multipath stops first. Exactly,
    on one table: 1.2899 against 1.2356 expected accepted tokens (token-level: 1.2147)."""
    target, draft = random_tables(1, 3, shape_depth(SHAPES["mixed"]), False)
    ours = theirs = 0.0
    for fill_prob, tree in drawn_trees(SHAPES["mixed"], 3, draft):
        rows = target_rows(target, tree)
        ours += fill_prob * expected_accepted(tree, rows, lambda accept: multipath_block(tree, rows, accept))
        theirs += fill_prob * expected_accepted(tree, rows, lambda accept: traverse(tree, rows, accept))
    assert (round(ours, 4), round(theirs, 4)) == (1.2356, 1.2899)


@pytest.mark.parametrize("source", TREE_SOURCES)
def test_multipath_walk_is_lossless_on_sampled_trees_and_on_a_one_hot_trie(source):
    p_first, p_three = lossless_p_values(source, walk=multipath_walk)
    assert p_first >= P_VALUE_FLOOR, f"first token: chi-square p-value {p_first:.2g}"
    assert p_three >= P_VALUE_FLOOR, f"first three tokens: chi-square p-value {p_three:.2g}"


def test_multipath_is_a_registered_policy_with_a_tree_form():
    from minispec.acceptance import get
    from minispec.trees import walks

    policy = get("multipath")
    assert isinstance(policy, MultiPathBlockVerification) and policy.lossless
    assert walks.walk_for(policy) is walks.multipath.multipath_tree
