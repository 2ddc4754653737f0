"""The draft-then-verify loop over trees: the second chapter, read after the chain (speculative.py).

The chain loop drafts d_1..d_g and keeps a prefix. Here a drafter proposes a tree of candidates
(minispec.trees.tree.DraftTree), the target scores every node in ONE pass (each node sees only its
ancestors), and the policy walks down from the root:

    draft:    tree      = drafter.propose_tree(seq, budget, depth)   N nodes, at most `depth` deep
    verify:   logits    = target([last, node 0..N-1])                N+1 rows, tree positions and mask
    decide:   path, y   = walk(tree, logits)                         the accepted nodes, then y
    rollback: keep_path(cache, path)                                 the accepted rows move into place
    stats:    tau = tokens emitted per verify step; nodes verified per step; accepted depth

Greedy walk (temperature 0): at the root, y = argmax of row 0; if a child of the root carries y,
accept it and look at that child's row next; else y is the correction. A fully accepted leaf
ends with its row's argmax as the bonus token. So the output equals plain greedy decoding for
any tree, exactly as the chain's exact match does, and a width-1 tree IS the chain.

Sampling walk (T > 0): multi-draft speculative sampling over siblings (SpecInfer's recursive
rejection, minispec.trees.walks.sampling_walk): each sibling is tested against what the
target would still emit after the siblings before it were rejected, so the output is distributed
exactly as sampling from the target, whatever the tree.

Other policies walk the tree in their own way, looked up by the policy's class
(minispec.trees.walks.walk_for; a policy of your own joins with register_walk): typical
acceptance moves to the first typical child; DropMatch judges each node with K dropout heads at
its parent's row, OR-ed with the greedy or sampling base.

Budget: a tree of N nodes costs one verify pass of N+1 rows (a chain of gamma costs gamma+1), so
trees and chains compare at equal N+1. generate_tree takes the chain's arguments plus
`tree=TreeSpec(budget, branching, width)` (the CLI's --tree / --branching / --tree-width), builds
the tree form of the chain's draft (minispec.trees.drafters.make_tree_drafter) and drafts trees
gamma deep.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from minispec import acceptance
from minispec.acceptance import AcceptancePolicy, ExactMatch, SpeculativeSampling
from minispec.trees.walks import TreeDecision, TreeInput, walk_for
from minispec.checks import check_gamma, is_int
from minispec.errors import MinispecError
from minispec.chain.request import GenerationResult, StopCondition, TokenCallback, check_request
from minispec.chain.speculative import PhaseTimer, commit, first_token
from minispec.model.memory import check_fits, kv_cache_bytes, verify_bytes
from minispec.model.transformer import Transformer
from minispec.model.sampling import SamplingParams
from minispec.chain.stats import run_stats
from minispec.trees.tree import DraftTree, keep_path, tree_mask, tree_positions
from minispec.trees.drafters import TreeDrafter, TreeSpec, make_tree_drafter

__all__ = ["generate_tree", "tree_decode", "decide_tree", "TreeSpec"]


@torch.inference_mode()
def generate_tree(
    target: Transformer,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    draft=None,
    tree: TreeSpec | int = TreeSpec(),
    gamma: int = 5,
    policy: str | AcceptancePolicy | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    on_tokens: TokenCallback | None = None,
    stop_when: StopCondition | None = None,
) -> GenerationResult:
    """Tree-speculative decoding: draft a tree, verify it in one pass, walk it with the policy.

    The arguments are the chain's (minispec.chain.speculative.generate_chain), and:
    draft: what can branch: "ngram[:N]", "early-exit:N", "self:bf16|int8", a draft model or a
      checkpoint folder (made into a tree drafter by make_tree_drafter), or a tree drafter itself.
    tree: a TreeSpec, or an int: its budget (the most nodes per tree: one verify pass of budget+1
      rows); gamma: how deep a tree goes.
    policy: a policy with a tree walk (minispec.trees.walks.walk_for), or None: the greedy
      walk at T = 0 (output = plain greedy decoding), multi-draft speculative sampling at T > 0
      (output distributed as sampling from the target: minispec.trees.walks.sampling_walk).
    Randomness: one torch.Generator seeded with `seed` (the draft's draws and the walk's coins)
    and the policy's own (DropMatch's masks, reset(seed)).
    Stats: the chain loop's (minispec.chain.stats: a step's "drafted" is its tree's depth, the most it
    could accept), and nodes_per_step, accepted_depth_histogram (over all steps).
    """
    if is_int(tree):
        tree = TreeSpec(budget=int(tree))
    if not isinstance(tree, TreeSpec):
        raise MinispecError(f"tree = {tree!r}; expected None, a TreeSpec or an integer budget >= 1")
    if draft is None:
        raise MinispecError("tree: a tree needs a draft; expected draft='ngram', 'early-exit:N', 'self:int8', "
                            "a draft model or a tree drafter")
    max_depth = check_gamma(gamma)
    prompt, params, generator, eos = check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                                   seed, eos_token_ids)
    policy = acceptance.get(policy) if policy is not None else ExactMatch() if params.greedy else SpeculativeSampling()
    walk_for(policy)  # a policy without a tree form fails here, before any work
    policy.reset(seed, gamma=max_depth)  # a path down the tree holds at most max_depth drafts
    drafter = make_tree_drafter(draft, target, tree, depth=max_depth)
    budget = usable_budget(target, drafter, tree.budget, max_depth, len(prompt) + max_new_tokens)
    return tree_decode(target, drafter, policy, budget, max_depth, prompt, max_new_tokens, params, generator,
                       eos, on_tokens, stop_when)


def usable_budget(target: Transformer, drafter: TreeDrafter, budget: int, depth: int, max_context: int) -> int:
    """The nodes per tree this run can use, bounded before anything is allocated. The budget is a
    ceiling: the drafter's trees hold at most drafter.max_nodes(...) nodes at this depth (4 + 8 + 8
    for branching 4,2,1; every earlier match of the context for n-grams), so no more is allocated
    or computed, whatever the flag says. What is left must fit in memory: the target's cache of
    max_context + budget positions, the drafter's, and one verify pass of budget + 1 rows."""
    most = drafter.max_nodes(depth, max_context, target.config.vocab_size)
    used = budget if most is None else min(budget, most)
    nbytes = kv_cache_bytes(target.config, 1, max_context + used, target.dtype) + verify_bytes(
        target.config, used + 1, max_context, target.dtype)
    if drafter.model is not None:
        nbytes += kv_cache_bytes(drafter.model.config, 1, max_context + used, drafter.model.dtype,
                                 getattr(drafter, "num_layers", None))
    check_fits(nbytes, f"tree={budget} (the budget): its caches and one verify pass of {used + 1} rows",
               target.device, "a smaller budget, or fewer max_new_tokens")
    return used


def tree_decode(target: Transformer, drafter: TreeDrafter, policy: AcceptancePolicy,
                budget: int, max_depth: int, prompt: list[int], max_new_tokens: int, params: SamplingParams,
                generator: torch.Generator, eos: set[int], on_tokens: TokenCallback | None = None,
                stop_when: StopCondition | None = None) -> GenerationResult:
    """The loop over trees. Invariant at the top of every step, as the chain's:

        seq    = prompt + tokens                    everything committed so far
        cache  holds seq[:-1]                       the last token, the tree's root, is not scored yet
    """
    vocab = target.config.vocab_size
    cache = target.new_cache(1, len(prompt) + max_new_tokens + budget)  # rejected branches sit there for one pass
    drafter.start(len(prompt) + max_new_tokens + budget)
    timer = PhaseTimer("draft", "verify", "policy")
    steps = []  # (drafted, accepted, committed, info) per step: minispec.chain.stats counts them
    t0 = time.perf_counter()
    tokens, reason, t_prefill = first_token(target, prompt, cache, params, generator, eos, max_new_tokens, stop_when,
                                            on_tokens)
    nodes_verified = 0
    depth_histogram = [0] * (max_depth + 1)

    while reason is None:
        seq = prompt + tokens
        # 1. Draft a tree no deeper than the tokens still to emit (a path of d nodes emits d + 1).
        depth = min(max_depth, max_new_tokens - len(tokens) - 1)
        with timer("draft"):
            tree = (drafter.propose_tree(seq, budget, depth, vocab, params, generator) if depth > 0
                    else DraftTree([], [], torch.zeros(0, vocab)))

        # 2. Verify every node in one pass: positions by depth, each node sees its ancestors only.
        with timer("verify"):
            start = cache.length  # == len(seq) - 1: the cache holds everything but `last`
            ids = torch.tensor([[seq[-1]] + tree.tokens], device=target.device)  # [1, N+1]
            hidden = target.forward_hidden(ids, cache, positions=tree_positions(tree, start, target.device),
                                           mask=tree_mask(tree, start, target.device))[0]  # [N+1, d]
            target_logits = target.head(hidden)  # [N+1, V]

        # 3. Decide, 4. keep the accepted path's rows.
        with timer("policy"):
            decision = decide_tree(policy, tree, target_logits, hidden, target.head, params, generator)
        keep_path(cache, start, decision.path)

        # 5. Commit and count, as the chain loop does (a step's g is the tree's depth, n the path's length).
        path = decision.path
        emitted, reason = commit(tokens, [tree.tokens[node] for node in path] + [decision.next_token], eos,
                                 max_new_tokens, stop_when)
        tree_depth = max(tree.depths, default=0)  # the most this step could accept
        steps.append((tree_depth, len(path), len(emitted), decision.info))
        nodes_verified += tree.num_nodes
        depth_histogram[min(len(path), len(emitted))] += 1
        if on_tokens is not None:
            on_tokens(emitted, min(len(path), len(emitted)), tree_depth)

    stats = run_stats(len(prompt), len(tokens), t_prefill, time.perf_counter() - t0, reason, steps,
                      positions=max(1, min(max_depth, max_new_tokens - 1)), phase_seconds=timer.totals,
                      nodes_per_step=nodes_verified / len(steps) if steps else 0.0,
                      accepted_depth_histogram=depth_histogram, target_forwards=1 + len(steps),
                      draft_forwards=drafter.forwards, drafter=drafter.name, policy=policy.name,
                      gamma=max_depth, budget=budget, max_depth=max_depth, tree=True)
    return GenerationResult(tokens=tokens, stats=stats)


def decide_tree(policy: AcceptancePolicy, tree: DraftTree, target_logits: torch.Tensor, hidden: torch.Tensor,
                head, params: SamplingParams, generator: torch.Generator) -> TreeDecision:
    """The policy's tree walk (minispec.trees.walks.walk_for): the accepted path and the token after it."""
    return walk_for(policy)(policy, TreeInput(tree, target_logits, params, generator, hidden, head))
