"""Traversal verification (TraversalVerification in minispec/acceptance/block.py, its walk
traversal_walk in minispec/trees/walks/traversal.py), float64.

Exactly, on tiny vocabularies and small trees whose siblings are drawn without replacement: the
output is distributed as the target's, and the expected number of accepted tokens is never
below token-level tree verification's (and above it on a case built for it). Draw for draw:
block verification on a chain, greedy_walk at T = 0. Chi-square through the walk on sampled
trees and an n-gram trie, with a power check on planted bugs (tests/test_tree_acceptance.py's
harness); through the real loop: check_policy, in test_testing.py, and the tree loop below.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minispec.acceptance import BlockVerification, TraversalVerification, VerifyInput
from minispec.trees.walks import traversal as trees  # the traversal walk and its tree form
from minispec.acceptance.sampling import acceptance_probability, residual_distribution
from minispec.trees.walks import children_by_row, greedy_walk, sampling_walk, traversal_walk, traverse
from minispec.model.sampling import SamplingParams, logits_to_probs
from minispec.testing import seeds
from minispec.testing.checks import P_VALUE_FLOOR
from minispec.trees.tree import DraftTree
from test_policy_block import random_tables  # target and draft tables, contexts up to length depth + 1
from test_tree_acceptance import TREE_SOURCES, lossless_p_values

F64 = torch.float64

SHAPES = {  # parents, topological order
    "chain-2": [-1, 0], "chain-3": [-1, 0, 1], "fan-2": [-1, -1], "fan-2-deep": [-1, -1, 0],
    "fan-2-both-deep": [-1, -1, 0, 1], "fork-below": [-1, 0, 0], "fan-3": [-1, -1, -1, 0],
    "mixed": [-1, -1, 0, 0, 1], "deep-and-wide": [-1, -1, 0, 1, 2],
}


def context(parents: list[int], tokens: list[int], node: int) -> tuple:
    """The tokens from the root's child down to `node` (() for the root, node = -1)."""
    out = []
    while node != -1:
        out.append(tokens[node])
        node = parents[node]
    return tuple(reversed(out))


def drawn_trees(parents: list[int], vocab: int, draft):
    """Every fill of the shape, with its probability: each node drawn from the draft's row at its
    parent with the elder siblings' tokens removed, renormalised. Yields (prob, DraftTree)."""
    n = len(parents)

    def fill(i, tokens, rows, prob):
        if i == n:
            yield prob, DraftTree(tokens, parents, torch.stack(rows) if rows else torch.zeros(0, vocab, dtype=F64))
            return
        remaining = draft[context(parents, tokens, parents[i])].clone()
        for elder in range(i):
            if parents[elder] == parents[i]:
                remaining[tokens[elder]] = 0.0
        if remaining.sum() <= 0:
            return
        q = remaining / remaining.sum()
        for x in range(vocab):
            if q[x] > 0:
                yield from fill(i + 1, tokens + [x], rows + [q], prob * float(q[x]))

    yield from fill(0, [], [], 1.0)


def target_rows(target, tree: DraftTree) -> torch.Tensor:
    """[N+1, V]: row u+1 the target's distribution after node u's context."""
    return torch.stack([target[context(tree.parents, tree.tokens, u)] for u in range(-1, tree.num_nodes)])


def enumerate_outcomes(run) -> list[tuple[float, list[int], torch.Tensor]]:
    """Every outcome of a walk whose only randomness is its tests: run(accept) with accept(node,
    prob) -> bool answered both ways (probabilities prob and 1 - prob), exactly."""
    outcomes = []

    def explore(answers: list[bool], prob: float):
        asked = []

        def accept(node, p):
            if len(asked) < len(answers):
                asked.append(p)
                return answers[len(asked) - 1]
            raise _Branch(p)

        try:
            path, next_row = run(accept)
        except _Branch as branch:
            if branch.p > 0:
                explore(answers + [True], prob * branch.p)
            if branch.p < 1:
                explore(answers + [False], prob * (1 - branch.p))
            return
        outcomes.append((prob, path, next_row))

    explore([], 1.0)
    return outcomes


class _Branch(Exception):
    def __init__(self, p: float):
        self.p = p


def token_level(tree: DraftTree, p_rows: torch.Tensor):
    """Token-level tree verification (sampling_walk's rule) as a walk with tests:
    recursive rejection over the siblings, down from the root."""
    children = children_by_row(tree)

    def run(accept):
        node, path = -1, []
        while True:
            residual = p_rows[node + 1]
            chosen = None
            for c in children[node + 1]:
                a = float(acceptance_probability(residual[None], tree.q_draft[c][None], torch.tensor([tree.tokens[c]]))[0])
                if accept(c, a):
                    chosen = c
                    break
                residual = residual_distribution(residual, tree.q_draft[c])
            if chosen is None:
                return path, residual
            path.append(chosen)
            node = chosen

    return run


def shape_depth(parents: list[int]) -> int:
    return max(len(context(parents, list(range(len(parents))), i)) for i in range(len(parents)))


cases = st.tuples(st.integers(0, 2**31), st.sampled_from(sorted(SHAPES)), st.sampled_from([2, 3]), st.booleans())


@settings(max_examples=30, deadline=None)
@given(case=cases)
def test_traversal_is_lossless_exactly(case):
    """P(the first depth+1 emitted tokens) over every fill and every test outcome, completed by
    the target's own sampling where the step emitted fewer, equals the target's."""
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
        for prob, path, next_row in enumerate_outcomes(lambda accept: traverse(tree, rows, accept)):
            next_dist = next_row / next_row.sum()
            for y in range(vocab):
                if prob * next_dist[y] > 0:
                    complete(tuple(tree.tokens[a] for a in path) + (y,), fill_prob * prob * float(next_dist[y]))
    # float64 sums of at most a few thousand products of numbers <= 1: round-off ~1e-15.
    for seq in itertools.product(range(vocab), repeat=length):
        want = 1.0
        for k in range(length):
            want *= float(target[seq[:k]][seq[k]])
        assert got.get(seq, 0.0) == pytest.approx(want, abs=1e-12), (seq, got.get(seq, 0.0), want)


def expected_accepted(tree: DraftTree, rows: torch.Tensor, run) -> float:
    return sum(prob * len(path) for prob, path, _ in enumerate_outcomes(run))


@settings(max_examples=30, deadline=None)
@given(case=cases)
def test_traversal_accepts_at_least_as_many_tokens_as_token_level_verification(case):
    """E[accepted] over the fills and the tests, exactly: traversal >= token-level (recursive rejection)."""
    seed, shape, vocab, ties = case
    parents = SHAPES[shape]
    target, draft = random_tables(seed, vocab, shape_depth(parents), ties)
    fills = list(drawn_trees(parents, vocab, draft))
    assume(abs(sum(prob for prob, _ in fills) - 1) < 1e-12)
    ours = theirs = 0.0
    for fill_prob, tree in fills:
        rows = target_rows(target, tree)
        ours += fill_prob * expected_accepted(tree, rows, lambda accept: traverse(tree, rows, accept))
        theirs += fill_prob * expected_accepted(tree, rows, token_level(tree, rows))
    assert ours >= theirs - 1e-12, (ours, theirs)


def test_traversal_beats_token_level_where_a_child_makes_up_for_its_parent():
    """Root child x = 1 over-drafted (q 1, p 0.5); under it the draft is certain of 0, which the
    target takes surely. Token-level keeps x with p/q = 0.5, then the child; traversal tests the
    whole sequence first, with min(1, 0.5 * 1 / 0.5) = 1."""
    p_rows = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.5, 0.5]], dtype=F64)  # root, node 0 (x = 1), node 1
    tree = DraftTree([1, 0], [-1, 0], torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=F64))
    ours = expected_accepted(tree, p_rows, lambda accept: traverse(tree, p_rows, accept))
    theirs = expected_accepted(tree, p_rows, token_level(tree, p_rows))
    # traversal: the leaf's weight min(1, 0.5 * 1.0 / 0.5) = 1, both drafts kept surely;
    # token level: x kept with 0.5, then its child with min(1, 1.0 / 0.5) = 1.
    assert (ours, theirs) == (pytest.approx(2.0), pytest.approx(1.0))


@st.composite
def chains(draw, max_gamma: int = 5, max_vocab: int = 6) -> VerifyInput:
    """A chain's input, float64: each d_i the target's argmax half the time, else a draw from q. Every
    slice: temperatures far from 1 and, at T > 0, top-k and top-p (where p_target and q_draft are not
    softmaxes of the logits, and a draft may have no mass under its own q)."""
    gamma, vocab = draw(st.integers(0, max_gamma)), draw(st.integers(2, max_vocab))
    temperature = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0, 2.0]))
    params = SamplingParams(temperature, *((draw(st.one_of(st.none(), st.integers(1, vocab))),
                                            draw(st.sampled_from([None, 0.5, 0.9]))) if temperature > 0 else ()))
    gen = torch.Generator().manual_seed(draw(seeds))
    target_logits = (torch.randint(-2, 3, (gamma + 1, vocab), generator=gen).to(F64) if draw(st.booleans())
                     else 3 * torch.randn(gamma + 1, vocab, generator=gen, dtype=F64))  # [gamma+1, V], ties or not
    draft_logits = 2 * torch.randn(gamma, vocab, generator=gen, dtype=F64)  # [gamma, V]
    q_draft = logits_to_probs(draft_logits, params)  # [gamma, V]
    from_q = torch.multinomial(q_draft, 1, generator=gen)[:, 0] if gamma else torch.zeros(0, dtype=torch.long)
    draft_tokens = torch.where(torch.rand(gamma, generator=gen) < 0.5, target_logits[:gamma].argmax(-1), from_q)
    return VerifyInput(draft_tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                       torch.Generator().manual_seed(draw(seeds)), draft_logits)


@given(inp=chains(), seed=seeds)
def test_on_a_chain_traversal_is_block_verification_draw_for_draw(inp, seed):
    """The same coins, the same decision, the same generator state after."""
    inp.generator = torch.Generator().manual_seed(seed)
    block = BlockVerification()(inp)
    walk_generator = torch.Generator().manual_seed(seed)
    tree = DraftTree.chain(inp.draft_tokens.tolist(), inp.q_draft)
    path, next_token = traversal_walk(tree, inp.p_target, walk_generator)
    assert (len(path), next_token) == (block.num_accepted, block.next_token)
    assert path == list(range(block.num_accepted))
    assert torch.equal(walk_generator.get_state(), inp.generator.get_state())


@st.composite
def greedy_trees(draw, max_vocab: int = 6, max_nodes: int = 10):
    """(tree, target_logits [N+1, V]) at T = 0: one-hot q_draft rows (what a T = 0 drafter
    records); each token its parent row's argmax half the time, else a free sibling token."""
    vocab, n = draw(st.integers(2, max_vocab)), draw(st.integers(0, max_nodes))
    gen = torch.Generator().manual_seed(draw(seeds))
    target_logits = torch.randint(-2, 3, (n + 1, vocab), generator=gen).to(F64)  # [N+1, V], ties common
    parents, tokens = [], []
    for i in range(n):
        parent = int(torch.randint(-1, i, (1,), generator=gen)) if i else -1
        taken = {t for t, p in zip(tokens, parents) if p == parent}
        free = [v for v in range(vocab) if v not in taken]
        if not free:
            break
        argmax = int(target_logits[parent + 1].argmax())
        token = argmax if argmax in free and torch.rand(1, generator=gen) < 0.5 else free[int(torch.randint(len(free), (1,), generator=gen))]
        parents.append(parent)
        tokens.append(token)
    q_draft = torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long), vocab).to(F64).reshape(len(tokens), vocab)
    return DraftTree(tokens, parents, q_draft), target_logits[:len(tokens) + 1]


@given(case=greedy_trees(), seed=seeds)
def test_at_temperature_zero_traversal_is_greedy_walk(case, seed):
    tree, target_logits = case
    p_target = logits_to_probs(target_logits, SamplingParams(0.0))  # [N+1, V] one-hot
    assert traversal_walk(tree, p_target, torch.Generator().manual_seed(seed)) == greedy_walk(tree, target_logits)


# ============================================= chi-square on sampled trees, with its power check


@pytest.mark.parametrize("source", TREE_SOURCES)
def test_traversal_walk_is_lossless_on_sampled_trees_and_on_a_one_hot_trie(source):
    p_first, p_three = lossless_p_values(source, walk=traversal_walk)
    assert p_first >= P_VALUE_FLOOR, f"first token: chi-square p-value {p_first:.2g}"
    assert p_three >= P_VALUE_FLOOR, f"first three tokens: chi-square p-value {p_three:.2g}"


def weight_without_the_parent(w_parent: float, p_x: float, q_x: float) -> float:
    """Planted bug: each node's own ratio min(1, p/q), the path's weight forgotten (token level
    tests in leaf-to-root order)."""
    return min(1.0, p_x / q_x) if q_x > 0 else float(p_x > 0)


@pytest.mark.parametrize("bug", [weight_without_the_parent])
@pytest.mark.parametrize("source", ["depth-2-(3,2)", "depth-3-(3,2,2)"])
def test_the_traversal_losslessness_test_rejects_a_planted_bug(source, bug, monkeypatch):
    """Power check: the same chi-square test and sample size, the walk's weight rule replaced."""
    monkeypatch.setattr(trees, "child_weight", bug)
    p_first, p_three = lossless_p_values(source, walk=traversal_walk)
    assert min(p_first, p_three) < P_VALUE_FLOOR, \
        f"the bug passes: chi-square p-values {p_first:.2g} (first token), {p_three:.2g} (first three)"


def test_traversal_is_a_registered_policy_with_a_tree_form():
    from minispec.acceptance import get
    from minispec.trees.walks import walk_for

    policy = get("traversal")
    assert isinstance(policy, TraversalVerification) and policy.lossless
    assert walk_for(policy) is trees.traversal_tree
