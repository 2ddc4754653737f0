"""DropMatch over draft trees (minispec.trees.walks.dropmatch_walk), float64.

Three properties: on a width-1 tree the walk IS DropMatch.decide, draw for draw (same masks,
coins, verdicts, next token, info, and the generators left in the same state); on any tree it
decides as a reference written from the definition (the chain's reference verdicts of
test_dropmatch_definition.py, applied to each node at its parent's row, then the walk: the first
child accepted by DropMatch or by the base, greedy's argmax at T = 0, recursive rejection over
the siblings at T > 0); and at p = 0 the whole tree loop equals the greedy tree loop (so plain
greedy decoding) for every criterion that has a vote or is OR-ed with the base.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_dropmatch_definition import argmax_lowest, build_input, dropmatch_cases, reference_verdicts, softmax

from minispec.acceptance import DropMatch, LazyDropMatch, TypicalAcceptance
from minispec.chain.stats import info_counts
from minispec.trees.walks import dropmatch_walk
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, logits_to_probs, sample_token
from minispec.decode import generate
from minispec.testing import loop_setups, random_model, seeds, tiny_config
from minispec.trees.tree import DraftTree
from minispec.trees.drafters import ModelTreeDrafter, NgramTreeDrafter
from minispec.trees.speculative import decide_tree, generate_tree


def mask_seed(seed: int) -> int:
    """The mask generator's seed as the rule's docstring writes it (not read from the code): another
    stream than the verify generator's, which is seeded with `seed` itself."""
    return (seed + 0x9E3779B97F4A7C15) % 2**64


F64 = torch.float64


def policy_for(options: dict) -> DropMatch:
    return DropMatch(**options)


# ============================================================== width 1: the chain policy


@given(case=dropmatch_cases())
def test_dropmatch_walk_on_a_chain_is_dropmatch_draw_for_draw(case):
    options, temperature, weight, steps = case
    params = SamplingParams(temperature)
    chain_policy, tree_policy = policy_for(options), policy_for(options)
    for hidden, draft_logits, draft_seed, verify_seed in steps:  # masks move on between steps in both
        inp = build_input(weight, hidden, draft_logits, draft_seed, verify_seed, params)
        walk_generator = torch.Generator().manual_seed(verify_seed)
        decision = chain_policy(inp)
        tree = DraftTree.chain(inp.draft_tokens.tolist(), inp.q_draft, inp.draft_logits)
        path, next_token, info = dropmatch_walk(tree, inp.target_logits, inp.p_target, hidden, inp.head, params,
                                                walk_generator, tree_policy)
        assert (path, next_token) == (list(range(decision.num_accepted)), decision.next_token)
        assert info_counts(info, len(path)) == info_counts(decision.info, decision.num_accepted)
        assert torch.equal(walk_generator.get_state(), inp.generator.get_state())
        assert torch.equal(tree_policy._generator.get_state(), chain_policy._generator.get_state())


# ============================================================== any tree: the definition


@st.composite
def dropmatch_trees(draw):
    """A tree over a linear toy head: hidden [N+1, d] and weight [V, d] small integers (ties
    common), each node's children picked from its own draft logits with the elder siblings
    removed (top-k at T = 0, draws without replacement at T > 0), or one-hot n-gram nodes."""
    options, temperature, weight, _ = draw(dropmatch_cases())
    params = SamplingParams(temperature)
    vocab, hidden_size = weight.shape
    gen = torch.Generator().manual_seed(draw(seeds))
    model_draft = draw(st.booleans())
    tokens, parents, q_rows, logit_rows = [], [], [], []
    frontier = [-1]
    while frontier and len(tokens) < 10:
        parent = frontier.pop(0)
        k = int(torch.randint(0, min(3, vocab) + 1, (1,), generator=gen))
        draft_logits = torch.randint(-2, 3, (vocab,), generator=gen).to(F64)  # [V]
        remaining = logits_to_probs(draft_logits, params)  # [V]
        masked = draft_logits.clone()
        for _ in range(k):
            if model_draft:
                if params.greedy:
                    q_row = torch.softmax(masked, dim=-1)
                    token = int(torch.argmax(masked))
                else:
                    if float(remaining.sum()) <= 0:
                        break
                    q_row = remaining / remaining.sum()
                    token = sample_token(q_row, gen)
                    remaining = remaining.clone()
                    remaining[token] = 0.0
                logit_rows.append(masked)
                masked = masked.clone()
                masked[token] = float("-inf")
            else:
                free = [t for t in range(vocab) if (parent, t) not in set(zip(parents, tokens))]
                token = free[int(torch.randint(len(free), (1,), generator=gen))]
                q_row = torch.nn.functional.one_hot(torch.tensor(token), vocab).to(F64)
            tokens.append(token)
            parents.append(parent)
            q_rows.append(q_row)
            frontier.append(len(tokens) - 1)
    n = len(tokens)
    q_draft = torch.stack(q_rows) if n else torch.zeros(0, vocab, dtype=F64)
    logits = torch.stack(logit_rows) if model_draft and n else None
    scale = draw(st.sampled_from([1.0, 0.25, 500.0]))
    hidden = scale * torch.randint(-3, 4, (n + 1, hidden_size), generator=gen).to(F64)  # [N+1, d]
    return options, params, weight, DraftTree(tokens, parents, q_draft, logits), hidden, draw(seeds)


def reference_walk(options, params, weight, tree, hidden, verify_seed):
    """(path, next_token) from the definition, or None where a JS round-off tie leaves it open."""
    target_logits = hidden @ weight.T  # [N+1, V]
    p_target = logits_to_probs(target_logits, params)
    n = tree.num_nodes
    masks = (torch.rand((options["paths"], n + 1, weight.shape[1]), generator=torch.Generator().manual_seed(
        mask_seed(options["seed"])), dtype=torch.float32) < 1.0 - options["p"]).to(F64)  # [K, N+1, d]
    temperature = options["js_temperature"] if params.greedy else params.temperature
    rows = [parent + 1 for parent in tree.parents]
    draft_rows = [softmax(tree.logits[i].tolist(), temperature) if tree.logits is not None else tree.q_draft[i].tolist()
                  for i in range(n)]
    verdicts = reference_verdicts(options, hidden[rows] if n else hidden[:0], weight, masks[:, rows], tree.tokens,
                                  draft_rows, temperature)
    if any(len(v) > 1 for v in verdicts):
        return None
    dm = [v == {True} for v in verdicts]
    verify = torch.Generator().manual_seed(verify_seed)
    coins = None if params.greedy else torch.rand(n, generator=verify, dtype=F64).tolist()
    path, node = [], -1
    while True:
        siblings = [i for i in range(n) if tree.parents[i] == node]
        residual = p_target[node + 1].clone()
        base_child = None
        for child in siblings:
            x = tree.tokens[child]
            if params.greedy:
                if x == argmax_lowest(target_logits[node + 1].tolist()):
                    base_child = child
                    break
                continue
            p_x, q_x = float(residual[x]), float(tree.q_draft[child, x])
            if coins[child] < (min(1.0, p_x / q_x) if q_x > 0 else float(p_x > 0)):
                base_child = child
                break
            excess = (residual - tree.q_draft[child]).clamp(min=0)
            residual = excess / excess.sum() if float(excess.sum()) > 0 else residual
        chosen = [c for c in siblings if dm[c] or (options["or_base"] and c == base_child)]
        if not chosen:
            break
        path.append(chosen[0])
        node = chosen[0]
    if params.greedy:
        return path, argmax_lowest(target_logits[node + 1].tolist())
    if base_child is not None:
        return path, sample_token(p_target[node + 1], verify)
    return path, sample_token(residual, verify)


@settings(max_examples=8 * settings.default.max_examples)  # cheap examples; the boundaries need many
@given(case=dropmatch_trees())
def test_dropmatch_walk_decides_as_its_definition_on_any_tree(case):
    options, params, weight, tree, hidden, verify_seed = case
    expected = reference_walk(options, params, weight, tree, hidden, verify_seed)
    assume(expected is not None)
    target_logits = hidden @ weight.T
    path, next_token, _ = dropmatch_walk(tree, target_logits, logits_to_probs(target_logits, params), hidden,
                                         lambda rows: rows @ weight.T, params,
                                         torch.Generator().manual_seed(verify_seed), policy_for(options))
    assert (path, next_token) == expected


def one_node_walk(token, q_row, logits_row, target_row, params, policy, seed=0):
    """A tree of one node under the root, a toy identity head: hidden rows ARE the logits."""
    tree = DraftTree([token], [-1], q_row[None], None if logits_row is None else logits_row[None])
    target_logits = torch.stack([target_row, target_row])  # [2, V]
    return dropmatch_walk(tree, target_logits, logits_to_probs(target_logits, params), target_logits, lambda h: h,
                          params, torch.Generator().manual_seed(seed), policy)


def test_the_js_test_reads_the_nodes_own_draft_logits_not_q_draft():
    """p = 0: the radius is 0, so JS accepts exactly when the node's draft distribution is the
    target's. The node carries a non-argmax token; its logits row equals the target's, its q row
    is uniform: accepted (JS = 0) through the logits, rejected if q_draft were read instead."""
    target_row = torch.tensor([3.0, 1.0, 0.5, -1.0], dtype=F64)
    uniform = torch.full((4,), 0.25, dtype=F64)
    policy = DropMatch(p=0.0, criterion="js", or_base=False)
    assert one_node_walk(1, uniform, target_row.clone(), target_row, SamplingParams(), policy)[0] == [0]
    assert one_node_walk(1, uniform, target_row + torch.tensor([0.0, 2.0, 0.0, 0.0], dtype=F64), target_row,
                         SamplingParams(), policy)[0] == []
    assert one_node_walk(1, uniform, None, target_row, SamplingParams(), policy)[0] == []  # no logits: q_draft


def test_a_correction_after_a_rejection_only_dropmatch_made_comes_from_p_target():
    """or_base=False, T = 1, two siblings. The base surely rejects the first (a = 0) and surely
    accepts the second from the residual r_2 = [0, .6, .4, 0]; DropMatch's naive vote at p = 0
    rejects both (neither is the argmax, token 0). The token that follows is a draw from p_target
    itself, so over seeds it is token 0 half the time, where r_2 has no mass."""
    p_row = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=F64)
    q_rows = torch.tensor([[0.5, 0.0, 0.0, 0.5], [0.0, 0.6, 0.0, 0.4]], dtype=F64)  # tokens 3, then 1
    tree = DraftTree([3, 1], [-1, -1], q_rows)
    target_logits = torch.stack([p_row.log(), p_row.log(), p_row.log()])  # [3, V]
    p_target = logits_to_probs(target_logits, SamplingParams(1.0))
    policy = DropMatch(p=0.0, criterion="naive", or_base=False)
    drawn = []
    for seed in range(200):
        path, token, _ = dropmatch_walk(tree, target_logits, p_target, target_logits, lambda h: h,
                                        SamplingParams(1.0), torch.Generator().manual_seed(seed), policy)
        assert path == []
        drawn.append(token)
    assert set(drawn) == {0, 1, 2} and 60 <= drawn.count(0) <= 140


# ============================================================== p = 0: greedy on trees


@given(setup=loop_setups(), n_new=st.integers(1, 14), kind=st.sampled_from(["random", "early-exit", "ngram"]),
       rule=st.sampled_from([("naive", True), ("naive", False), ("majority", False), ("js_or_majority", True)]))
def test_dropmatch_at_p0_on_trees_is_greedy_on_trees(setup, n_new, kind, rule):
    """Tiny random Llama and Qwen3 models; the drafts: another random model, the target's first
    layer (early exit) and the n-gram trie (one-hot nodes)."""
    criterion, or_base = rule
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)

    def drafter():
        if kind == "ngram":
            return NgramTreeDrafter(max_ngram=2)
        model = target if kind == "early-exit" else random_model(cfg, seed + 1, scale=3.0)
        return ModelTreeDrafter(model, num_layers=1 if kind == "early-exit" else None, branching=(3, 2, 1))

    greedy = generate_tree(target, prompt, max_new_tokens=n_new, draft=drafter(), tree=8, gamma=3,
                           eos_token_ids=[])
    dropmatch = generate_tree(target, prompt, max_new_tokens=n_new, draft=drafter(), tree=8, gamma=3,
                              policy=DropMatch(p=0.0, criterion=criterion, or_base=or_base), eos_token_ids=[])
    assert dropmatch.tokens == greedy.tokens == generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[]).tokens
    assert dropmatch.stats["policy_info"].get("accepted_by_dropmatch_only", 0) == 0
    assert dropmatch.stats["verify_steps"] == greedy.stats["verify_steps"]


def test_dropmatch_accepts_more_of_a_tree_at_p_above_zero():
    """Not a tautology of the p = 0 case: with dropout the naive rule accepts nodes greedy rejects."""
    cfg = tiny_config(vocab_size=12)
    target, other = random_model(cfg, 3, scale=1.0), random_model(cfg, 4, scale=1.0)
    prompt = [1, 5, 2, 7, 3]
    runs = {p: generate_tree(target, prompt, max_new_tokens=24, draft=ModelTreeDrafter(other, branching=(3, 2)),
                             tree=8, gamma=2, policy=DropMatch(p=p, criterion="naive"), eos_token_ids=[])
            for p in (0.0, 0.5)}
    assert runs[0.5].stats["policy_info"]["accepted_by_dropmatch_only"] > 0
    assert runs[0.5].stats["tau"] > runs[0.0].stats["tau"]


# ============================================================== the loop's policy map


def test_policies_without_a_tree_form_are_one_line_errors():
    tree = DraftTree([1], [-1], torch.full((1, 4), 0.25))
    logits = torch.zeros(2, 4)
    with pytest.raises(MinispecError, match="dropmatch-lazy.*no tree form"):
        decide_tree(LazyDropMatch(), tree, logits, torch.zeros(2, 3), lambda h: h, SamplingParams(), torch.Generator())
    decision = decide_tree(TypicalAcceptance(eps=0.1, delta=1.0), tree, logits, torch.zeros(2, 3), lambda h: h,
                           SamplingParams(), torch.Generator())
    assert decision.path == [0]  # a flat target row: every token is typical
