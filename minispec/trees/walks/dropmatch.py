"""DropMatch over a tree: K dropout heads judge each node at its parent's row, OR-ed with the base.

The walk and its registered tree form (minispec.trees.walks.base says what a walk is)."""

from __future__ import annotations

from typing import Callable

import torch

from minispec.acceptance.base import VerifyInput
from minispec.acceptance.dropmatch.rule import DropMatch
from minispec.model.sampling import SamplingParams, greedy_token, sample_token
from minispec.trees.tree import DraftTree

from minispec.trees.walks.sampling import node_coins, recursive_rejection
from minispec.trees.walks.base import (TreeDecision, TreeInput, check_tree_input, children_by_row, register_walk)


def dropmatch_walk(tree: DraftTree, target_logits: torch.Tensor, p_target: torch.Tensor, hidden: torch.Tensor,
                   head: Callable[[torch.Tensor], torch.Tensor], params: SamplingParams, generator: torch.Generator,
                   policy: DropMatch) -> tuple[list[int], int, dict]:
    """DropMatch over a tree: every node is judged as the chain judges a draft, at its parent's row.

    target_logits, p_target [N+1, V]; hidden [N+1, d] the LM-head input of the tree pass and
    `head` the LM head. With u = parent(i) and r = u + 1 (the row that scores node i):

        paths     l_k = policy.path_logits(hidden, head)[k]      [K, N+1, V]: ONE head call, masks for
                                                                 every row (the chain's draw order)
        dm_i      policy's criterion on tokens[i] with l_k[r]:    naive: tokens[i] in {argmax l_k[r]}
                                                                 majority: the heads' vote
                                                                 JS: JS(q_i || pbar_r) <= max_k JS(p_k,r || pbar_r)
        base_i    T = 0: tokens[i] == argmax target_logits[r]    (greedy_walk's verdict)
                  T > 0: node i is the sibling sampling_walk's recursive rejection accepts at u
        walk      from the root, move to the FIRST child (index order) with dm or (or_base and base)
        next      T = 0: argmax at the last accepted row (the correction, or the bonus after a leaf)
                  T > 0: y ~ r_{k+1}, the residual after the base rejected every child; or y ~ p_target
                         itself where the base accepted a child that DropMatch rejected (or_base=False:
                         the residual belongs to a rejection the base did not make; the chain's rule)

    The JS test reads node i's own draft distribution q_i = softmax(tree.logits[i] / T) (tree.q_draft[i]
    for a drafter without logits: one-hot). A model drafter's tree.logits[i] are its logits at the
    parent with the elder siblings' tokens removed (-inf), the distribution tokens[i] was the
    mode of at T = 0 (and drawn from at T > 0): on a chain, the draft's own distribution, so the
    test vouches for the draft's choice there; a second sibling passes it only if the draft
    WITHOUT its first choice is as close to the target as a dropout head is.

    On a width-1 tree this is DropMatch.decide draw for draw: the same masks ([K, N+1, d] in one
    call), the same coins (N uniforms up front), the same verdicts, correction and bonus.
    At p = 0 every head is the clean head, so (with or_base, or a criterion with a vote) the
    walk is greedy_walk at T = 0. Returns (path, next_token, info) with DropMatch.decide's info.
    """
    check_tree_input(tree, target_logits=target_logits, p_target=p_target)
    n = tree.num_nodes
    device = target_logits.device
    rows = torch.tensor([parent + 1 for parent in tree.parents], dtype=torch.long, device=device)  # [N]
    tokens = torch.tensor(tree.tokens, dtype=torch.long, device=device)  # [N]
    clean_tokens = greedy_token(target_logits)  # [N+1]
    path_logits = DropMatch.path_logits(policy, hidden, head, target_logits)  # [K, N+1, V]
    head_tokens = greedy_token(path_logits)  # [K, N+1]: y_k at every row
    nodes = VerifyInput(  # node i as draft i of a chain whose rows are its parents' rows
        draft_tokens=tokens, q_draft=tree.q_draft.to(device, p_target.dtype), target_logits=target_logits[rows],
        p_target=p_target[rows], params=params, generator=generator,
        draft_logits=None if tree.logits is None else tree.logits.to(device, target_logits.dtype))
    dm = DropMatch.verdicts(policy, nodes, path_logits[:, rows], head_tokens[:, rows]).tolist()  # [N]

    children = children_by_row(tree)
    coins = None if params.greedy else node_coins(tree, generator)
    path, node, only_dm = [], -1, []  # only_dm: per path position, whether only DropMatch accepted it
    while True:
        siblings = children[node + 1]
        if params.greedy:
            base_child = next((c for c in siblings if tree.tokens[c] == int(clean_tokens[node + 1])), None)
        else:
            base_child, residual = recursive_rejection(tree, siblings, p_target[node + 1], coins)
        child = next((c for c in siblings if dm[c] or (policy.or_base and c == base_child)), None)
        if child is None:
            break
        only_dm.append(child != base_child)
        path.append(child)
        node = child
    row = node + 1
    if params.greedy:
        next_token = int(clean_tokens[row])
    elif base_child is not None:  # only DropMatch rejected: the clean target's own draw
        next_token = sample_token(p_target[row], generator)
    else:
        next_token = sample_token(residual, generator)
    info = {"accepted_by_dropmatch_only": only_dm, "heads_agree": int((head_tokens == clean_tokens).all(dim=0).sum()),
            "positions": n + 1}
    return path, next_token, info


@register_walk(DropMatch)
def dropmatch_tree(policy: DropMatch, inp: TreeInput) -> TreeDecision:
    """dropmatch: K dropout heads judge each node at its parent's row, OR-ed with the base."""
    return TreeDecision(*dropmatch_walk(inp.tree, inp.target_logits64, inp.p_target, inp.hidden, inp.head, inp.params,
                                        inp.generator, policy))
