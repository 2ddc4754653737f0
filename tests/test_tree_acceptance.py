"""Acceptance over draft trees (minispec/trees/walks/), float64.

On a width-1 tree each walk is its chain policy, draw for draw; greedy_walk against a brute-force
walk down the target's argmax chain; typical_walk's acceptances against the rule written out
with Python floats; sampling_walk at temperature 0 is greedy_walk; and sampling_walk is lossless:
on a toy target and a toy drafter that draws siblings without replacement, the first emitted
token and the first three are chi-square tested against the target's own distribution, and the
same test at the same sample size rejects a walk whose running residual is broken.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from minispec.acceptance import ExactMatch, PolicyInputError, SpeculativeSampling, TypicalAcceptance, VerifyInput
from minispec.trees.walks import sampling as trees  # the sampling walk and the rule functions it calls
from minispec.trees.walks import greedy_walk, sampling_walk, typical_walk
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, logits_to_probs, sample_token
from minispec.testing import chi_square_p_value, decided, seeds
from minispec.testing.checks import P_VALUE_FLOOR
from minispec.trees.tree import DraftTree

F64 = torch.float64


# ============================================================================ strategies


@st.composite
def chains(draw, max_gamma: int = 5, max_vocab: int = 8) -> VerifyInput:
    """A chain policy's input, float64, from a drawn seed: each d_i is the target's argmax
    (probability 1/2, so long prefixes get accepted) or a draw from q_draft[i]. Integer-valued
    target logits half the time, so ties (and the lowest-id rule) are common."""
    gamma, vocab = draw(st.integers(0, max_gamma)), draw(st.integers(2, max_vocab))
    params = SamplingParams(draw(st.sampled_from([0.0, 0.7, 1.0])))
    gen = torch.Generator().manual_seed(draw(seeds))
    if draw(st.booleans()):
        target_logits = torch.randint(-2, 3, (gamma + 1, vocab), generator=gen).to(F64)  # [gamma+1, V]
    else:
        target_logits = 3 * torch.randn(gamma + 1, vocab, generator=gen, dtype=F64)  # [gamma+1, V]
    draft_logits = 2 * torch.randn(gamma, vocab, generator=gen, dtype=F64)  # [gamma, V]
    q_draft = logits_to_probs(draft_logits, params)  # [gamma, V]
    from_q = torch.multinomial(q_draft, 1, generator=gen)[:, 0] if gamma else torch.zeros(0, dtype=torch.long)
    use_argmax = torch.rand(gamma, generator=gen) < 0.5
    draft_tokens = torch.where(use_argmax, target_logits[:gamma].argmax(-1), from_q)  # [gamma]
    return VerifyInput(draft_tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                       torch.Generator().manual_seed(draw(seeds)), draft_logits)


@st.composite
def tree_cases(draw, max_vocab: int = 6, max_nodes: int = 12):
    """(tree, target_logits [N+1, V]) float64 from a drawn seed: every node's parent an earlier
    node or the root; its token the argmax of its parent's row half the time (so deep paths are
    accepted), else any token its siblings do not carry. q_draft rows are positive (a softmax)."""
    vocab, max_n = draw(st.integers(2, max_vocab)), draw(st.integers(0, max_nodes))
    gen = torch.Generator().manual_seed(draw(seeds))
    if draw(st.booleans()):
        logits = torch.randint(-2, 3, (max_n + 1, vocab), generator=gen).to(F64)  # ties common
    else:
        logits = 3 * torch.randn(max_n + 1, vocab, generator=gen, dtype=F64)
    argmax = logits.argmax(-1).tolist()  # [max_n+1]
    parents, tokens = [], []
    for _ in range(max_n):
        parent = int(torch.randint(-1, len(tokens), (1,), generator=gen))
        taken = {t for p, t in zip(parents, tokens) if p == parent}
        free = [t for t in range(vocab) if t not in taken]
        if not free:
            continue
        likely = argmax[parent + 1] if float(torch.rand(1, generator=gen)) < 0.5 else None
        parents.append(parent)
        tokens.append(likely if likely in free else free[int(torch.randint(len(free), (1,), generator=gen))])
    n = len(tokens)
    q_draft = torch.softmax(2 * torch.randn(n, vocab, generator=gen, dtype=F64), dim=-1)  # [N, V]
    return DraftTree(tokens, parents, q_draft), logits[: n + 1]  # row i+1 scores node i's children


# ================================================================ width 1: the chain policies


@given(inp=chains())
def test_greedy_walk_on_a_chain_is_exact_match(inp):
    tree = DraftTree.chain(inp.draft_tokens.tolist(), inp.q_draft)
    num_accepted, next_token = decided(ExactMatch()(inp))
    assert greedy_walk(tree, inp.target_logits) == (list(range(num_accepted)), next_token)


@given(inp=chains(), seed=seeds)
def test_sampling_walk_on_a_chain_is_speculative_sampling_draw_for_draw(inp, seed):
    """Both draw gamma uniforms up front, then one token: the same seed gives the same decision
    and leaves the generator in the same state."""
    tree = DraftTree.chain(inp.draft_tokens.tolist(), inp.q_draft)
    walk_generator, inp.generator = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    num_accepted, next_token = decided(SpeculativeSampling()(inp))
    assert sampling_walk(tree, inp.p_target, walk_generator) == (list(range(num_accepted)), next_token)
    assert torch.equal(walk_generator.get_state(), inp.generator.get_state())


@given(inp=chains(), seed=seeds, eps=st.sampled_from([0.05, 0.09, 0.3, 1.0]), delta=st.sampled_from([0.1, 0.3, 0.9]),
       criterion_temperature=st.sampled_from([0.5, 1.0, 2.0]))
def test_typical_walk_on_a_chain_is_typical_acceptance(inp, seed, eps, delta, criterion_temperature):
    tree = DraftTree.chain(inp.draft_tokens.tolist(), inp.q_draft)
    walk_generator, inp.generator = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    num_accepted, next_token = decided(TypicalAcceptance(eps, delta, criterion_temperature)(inp))
    walked = typical_walk(tree, inp.target_logits, inp.p_target, inp.params, walk_generator, eps, delta,
                          criterion_temperature)
    assert walked == (list(range(num_accepted)), next_token)
    assert torch.equal(walk_generator.get_state(), inp.generator.get_state())


# ============================================================== trees: the walks by definition


def argmax_lowest_id(row: list[float]) -> int:
    return min(range(len(row)), key=lambda v: (-row[v], v))


def greedy_by_definition(tree: DraftTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Walk the target's argmax chain from the root; stop where no child carries the argmax."""
    rows = target_logits.tolist()
    path, node = [], -1
    while True:
        y = argmax_lowest_id(rows[node + 1])
        carriers = [i for i in range(tree.num_nodes) if tree.parents[i] == node and tree.tokens[i] == y]
        if not carriers:
            return path, y
        node = carriers[0]  # siblings differ: at most one
        path.append(node)


@given(case=tree_cases())
def test_greedy_walk_equals_the_argmax_chain_matched_against_children(case):
    tree, target_logits = case
    assert greedy_walk(tree, target_logits) == greedy_by_definition(tree, target_logits)


@given(case=tree_cases(), seed=seeds)
def test_sampling_walk_at_temperature_zero_is_greedy_walk(case, seed):
    """One-hot p: a child is accepted iff it carries the argmax (q_draft > 0 everywhere here),
    and every residual of a one-hot p is p again. The global RNG is never touched."""
    tree, target_logits = case
    p_target = logits_to_probs(target_logits, SamplingParams(0.0))  # [N+1, V] one-hot
    global_state = torch.get_rng_state()
    assert sampling_walk(tree, p_target, torch.Generator().manual_seed(seed)) == greedy_walk(tree, target_logits)
    assert torch.equal(torch.get_rng_state(), global_state)


def test_sampling_walk_accepts_surely_where_the_target_row_equals_the_siblings_draft():
    """a_1 = p(x_1) / q_1(x_1) = 1 when p = q_1: the first child is accepted whatever the coin,
    and a residual with no mass (p <= q) stays a distribution (p itself) instead of 0 / 0."""
    p_row = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)  # [V]
    tree = DraftTree([2, 3], [-1, -1], torch.stack([p_row, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64)]))
    p_target = torch.stack([p_row, p_row, p_row])  # [N+1, V]
    for seed in range(50):
        path, _ = sampling_walk(tree, p_target, torch.Generator().manual_seed(seed))
        assert path == [0]
    assert torch.equal(trees.residual_distribution(p_row, p_row), p_row)


def typical_by_definition(tree, target_logits, p_target, params, eps, delta, criterion_temperature, seed):
    """Medusa's rule with Python floats; also returns the smallest |c(x) - threshold| seen."""
    if params.greedy:
        criterion = []
        for row in target_logits.tolist():
            weights = [math.exp((v - max(row)) / criterion_temperature) for v in row]
            criterion.append([w / sum(weights) for w in weights])
    else:
        criterion = p_target.tolist()
    accepted, margin = [], math.inf
    for token, parent in zip(tree.tokens, tree.parents):
        c = criterion[parent + 1]
        entropy = -sum(v * math.log(v) for v in c if v > 0)
        threshold = min(eps, delta * math.exp(-entropy))
        accepted.append(c[token] > threshold)
        margin = min(margin, abs(c[token] - threshold))
    path, node = [], -1
    while True:
        first = [i for i in range(tree.num_nodes) if tree.parents[i] == node and accepted[i]][:1]
        if not first:
            break
        node = first[0]
        path.append(node)
    if params.greedy:
        next_token = argmax_lowest_id(target_logits[node + 1].tolist())
    else:
        next_token = sample_token(p_target[node + 1], torch.Generator().manual_seed(seed))
    return (path, next_token), margin


@given(case=tree_cases(), seed=seeds, temperature=st.sampled_from([0.0, 0.7, 1.0]),
       eps=st.sampled_from([0.05, 0.09, 0.3, 1.0]), delta=st.sampled_from([0.1, 0.3, 0.9]),
       criterion_temperature=st.sampled_from([0.5, 1.0, 2.0]))
def test_typical_walk_moves_to_the_first_typical_child(case, seed, temperature, eps, delta, criterion_temperature):
    tree, target_logits = case
    params = SamplingParams(temperature)
    p_target = logits_to_probs(target_logits, params)  # [N+1, V]
    expected, margin = typical_by_definition(tree, target_logits, p_target, params, eps, delta, criterion_temperature,
                                             seed)
    # Python's and torch's float64 softmax and entropy of <= 6 terms agree to ~1e-15; a 1e-9
    # band around the threshold only sets aside exact ties, where the two may round apart.
    assume(margin > 1e-9)
    walked = typical_walk(tree, target_logits, p_target, params, torch.Generator().manual_seed(seed), eps, delta,
                          criterion_temperature)
    assert walked == expected


# =========================================================================== input checks


TREE = DraftTree([1, 2, 0], [-1, -1, 0], torch.full((3, 4), 0.25, dtype=F64))  # N = 3 nodes, V = 4
ROWS = torch.zeros(4, 4, dtype=F64)  # [N+1, V]
ANY = torch.Generator()


@pytest.mark.parametrize("call, message", [
    (lambda: greedy_walk(TREE, ROWS[:-1]),  # no bonus row
     r"target_logits: shape \[3, 4\]; expected \[N\+1=4, V\] for a tree of N=3 nodes"),
    (lambda: sampling_walk(TREE, ROWS[0], ANY),  # one row, not N+1
     r"p_target: shape \[4\]; expected \[N\+1=4, V\]"),
    (lambda: sampling_walk(DraftTree(TREE.tokens, TREE.parents, TREE.q_draft[:, :3]), ROWS, ANY),
     r"tree.q_draft: shape \[3, 3\]; expected \[N=3, V=4\]"),
    (lambda: greedy_walk(DraftTree(TREE.tokens, TREE.parents, TREE.q_draft[:2]), ROWS),
     r"tree.q_draft: shape \[2, 4\]; expected \[N=3, V=4\]"),
    (lambda: greedy_walk(DraftTree([1, 7, 0], TREE.parents, TREE.q_draft), ROWS),
     r"tree.tokens: ids outside \[0, 4\): \[7\]"),
    (lambda: typical_walk(TREE, ROWS, ROWS[:, :3], SamplingParams(1.0), ANY),  # p_target's V != the logits'
     r"p_target: shape \[4, 3\]; expected \[N\+1=4, V=4\]"),
], ids=["no-bonus-row", "one-row", "q_draft-vocabulary", "q_draft-rows", "token-outside-V", "p_target-vocabulary"])
def test_inconsistent_shapes_are_policy_input_errors(call, message):
    with pytest.raises(PolicyInputError, match=message):
        call()


def test_typical_walk_checks_its_options_like_the_chain_policy():
    with pytest.raises(MinispecError, match="typical eps = 0"):
        typical_walk(TREE, ROWS, ROWS.softmax(-1), SamplingParams(1.0), ANY, eps=0)


# ==================================================== sampling_walk is lossless (chi-square)
#
# Toy target: a fixed table, previous token -> distribution over V = 5 tokens (a Markov chain);
# toy drafter: another table, different from the target's. Every tree has a fixed shape
# (`widths`: siblings per node, level by level, in BFS order) and a random fill: each node's k
# children are drawn WITHOUT replacement from the drafter's row for its token, child j's q_draft
# row being the drafter's row with the earlier siblings' tokens removed, renormalised.
#
# Table seed 25 and root token 4 are chosen for power: at the root, with 3 siblings, the walk
# that never updates its residual moves the first token's distribution by a chi-square
# divergence sum_y (P_bug(y) - p(y))^2 / p(y) = 0.21 per sample, the walk that does not
# renormalise it by 0.28 (exact enumeration over the ordered sibling triples). With 2,000
# samples the noncentrality is 420 / 560 against a 1e-4 critical value of 23.5 (4 degrees of
# freedom): the planted bugs are rejected surely, and a correct walk fails with probability
# 1e-4 per test (the seeds are fixed, so the suite is deterministic). The one-hot trie's
# unnormalised residual is the faintest of the planted bugs (each later sibling accepted with
# p(x_j) instead of p(x_j) / (1 - the earlier siblings' mass)); the first-token test still
# rejects it, with p-values below 1e-6 on every seed tried.

TOY_VOCAB, TOY_ROOT, TOY_SAMPLES = 5, 4, 2000
_toy = torch.Generator().manual_seed(25)
TOY_TARGET = torch.softmax(torch.randn(TOY_VOCAB, TOY_VOCAB, generator=_toy, dtype=F64), dim=-1)  # [V, V] prev -> p
TOY_DRAFT = torch.softmax(torch.randn(TOY_VOCAB, TOY_VOCAB, generator=_toy, dtype=F64), dim=-1)  # [V, V] prev -> q


def toy_trees(widths: tuple[int, ...], num: int, gen: torch.Generator):
    """`num` trees of one shape from the toy drafter, vectorised over the trees.

    Returns parents [N] (shared) and tokens [num, N], q_draft [num, N, V].
    """
    parents, tokens, q_rows = [], [], []
    level = [(-1, torch.full((num,), TOY_ROOT))]  # (node, its token in every tree)
    for width in widths:
        next_level = []
        for parent, parent_tokens in level:
            remaining = TOY_DRAFT[parent_tokens].clone()  # [num, V] the drafter's row, drawn tokens removed
            for _ in range(width):
                q_sibling = remaining / remaining.sum(-1, keepdim=True)  # [num, V] what this sibling is drawn from
                token = torch.multinomial(q_sibling, 1, generator=gen)[:, 0]  # [num]
                remaining[torch.arange(num), token] = 0.0
                next_level.append((len(parents), token))
                parents.append(parent)
                tokens.append(token)
                q_rows.append(q_sibling)
        level = next_level
    return parents, torch.stack(tokens, 1), torch.stack(q_rows, 1)


def fixed_trie(num: int, gen: torch.Generator):
    """An n-gram trie: the same candidates in every tree, one-hot q_draft rows (a drafter
    certain of each), so a_j = r_j(x_j) and each rejection removes x_j from the residual."""
    #   root(4) -> 0 -> 1 -> 0
    #                -> 4
    #           -> 2 -> 2
    #           -> 3
    parents, tokens = [-1, -1, -1, 0, 0, 1, 3], torch.tensor([0, 2, 3, 1, 4, 2, 0])
    q_draft = torch.nn.functional.one_hot(tokens, TOY_VOCAB).to(F64)  # [N, V]
    return parents, tokens.expand(num, -1), q_draft.expand(num, -1, -1)


TREE_SOURCES = {  # name -> (num, gen) -> parents [N], tokens [num, N], q_draft [num, N, V]
    "depth-1-(3)": lambda num, gen: toy_trees((3,), num, gen),  # 3 nodes
    "depth-2-(3,2)": lambda num, gen: toy_trees((3, 2), num, gen),  # 9 nodes
    "depth-3-(3,2,2)": lambda num, gen: toy_trees((3, 2, 2), num, gen),  # 21 nodes
    "one-hot-trie": fixed_trie,  # 7 nodes
}


def toy_first_three_tokens(source: str, num: int, seed: int, walk=sampling_walk) -> list[tuple[int, int, int]]:
    """Each tree walked by `walk` (tree, p_target, generator) -> (path, next_token); the emitted
    path tokens + next_token, extended by sampling the toy target itself while shorter than 3
    (what the next steps would emit)."""
    gen = torch.Generator().manual_seed(seed)
    parents, tokens, q_draft = TREE_SOURCES[source](num, gen)  # [N], [num, N], [num, N, V]
    p_target = TOY_TARGET[torch.cat([torch.full((num, 1), TOY_ROOT), tokens], 1)]  # [num, N+1, V]
    outputs = []
    for s in range(num):
        tree = DraftTree(tokens[s].tolist(), parents, q_draft[s])
        path, next_token = walk(tree, p_target[s], gen)
        emitted = [tree.tokens[node] for node in path] + [next_token]
        while len(emitted) < 3:
            emitted.append(sample_token(TOY_TARGET[emitted[-1]], gen))
        outputs.append(tuple(emitted[:3]))
    return outputs


def lossless_p_values(source: str, seed: int = 0, walk=sampling_walk) -> tuple[float, float]:
    """Chi-square p-values of the first emitted token and of the first three, against the target."""
    outputs = toy_first_three_tokens(source, TOY_SAMPLES, seed, walk)
    first_probs = {(a,): float(TOY_TARGET[TOY_ROOT, a]) for a in range(TOY_VOCAB)}
    three_probs = {(a, b, c): float(TOY_TARGET[TOY_ROOT, a] * TOY_TARGET[a, b] * TOY_TARGET[b, c])
                   for a in range(TOY_VOCAB) for b in range(TOY_VOCAB) for c in range(TOY_VOCAB)}
    first_counts: dict = {}
    three_counts: dict = {}
    for out in outputs:
        first_counts[out[:1]] = first_counts.get(out[:1], 0) + 1
        three_counts[out] = three_counts.get(out, 0) + 1
    return (chi_square_p_value(first_counts, first_probs, TOY_SAMPLES),
            chi_square_p_value(three_counts, three_probs, TOY_SAMPLES))


@pytest.mark.parametrize("source", TREE_SOURCES)
def test_sampling_walk_is_lossless_on_sampled_trees_and_on_a_one_hot_trie(source):
    p_first, p_three = lossless_p_values(source)
    assert p_first >= P_VALUE_FLOOR, f"first token: chi-square p-value {p_first:.2g}"
    assert p_three >= P_VALUE_FLOOR, f"first three tokens: chi-square p-value {p_three:.2g}"


def residual_never_updated(residual: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """Planted bug: every sibling is tested against p itself, and the correction drawn from p."""
    return residual


def residual_not_renormalised(residual: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """Planted bug: max(0, r - q) left unnormalised, so later siblings are tested against too
    little mass (the final draw normalises it, so only the acceptance tests are off)."""
    excess = (residual - q_draft).clamp(min=0)  # [V]
    return excess if excess.sum() > 0 else residual


@pytest.mark.parametrize("bug", [residual_never_updated, residual_not_renormalised])
@pytest.mark.parametrize("source", TREE_SOURCES)
def test_the_losslessness_test_rejects_a_broken_running_residual(source, bug, monkeypatch):
    """Power check: the same test, the same sample size, the walk's residual update replaced."""
    monkeypatch.setattr(trees, "residual_distribution", bug)
    p_first, p_three = lossless_p_values(source)
    assert min(p_first, p_three) < P_VALUE_FLOOR, \
        f"the bug passes: chi-square p-values {p_first:.2g} (first token), {p_three:.2g} (first three)"
