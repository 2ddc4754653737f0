"""Typical acceptance over a tree: the first typical child at each node.

The walk and its registered tree form (minispec.trees.walks.base says what a walk is)."""

from __future__ import annotations


import torch

from minispec.acceptance.typical import TypicalAcceptance, typical_acceptances
from minispec.model.sampling import SamplingParams, greedy_token, logits_to_probs, sample_token
from minispec.trees.tree import DraftTree

from minispec.trees.walks.base import (TreeDecision, TreeInput, check_tree_input, first_accepted_path, register_walk)


def typical_walk(tree: DraftTree, target_logits: torch.Tensor, p_target: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator, eps: float = 0.09, delta: float = 0.3,
                 greedy_criterion_temperature: float = 1.0) -> tuple[list[int], int]:
    """Medusa's typical acceptance over a tree: move to the first child the target finds typical.

    target_logits, p_target [N+1, V]. With c the criterion distribution at node u's row,

        c          = p_target[u+1]                                            T > 0
                   = softmax(target_logits[u+1] / greedy_criterion_temperature) T = 0 (one-hot p
                     would make this exact match: TypicalAcceptance's convention)
        accept c_j iff c(x_j) > min(eps, delta * exp(-H(c)))   the FIRST such child in index order
        next_token = argmax target_logits[row] (T = 0)  or  y ~ p_target[row] (T > 0)

    where row is the last accepted node's (0, the root's, if none): the correction, or the bonus
    after a fully accepted leaf. Lossy, like the chain rule. Options are checked as
    TypicalAcceptance checks them (a MinispecError); eps=0.09, delta=0.3 are Medusa's defaults.
    """
    rule = TypicalAcceptance(eps, delta, greedy_criterion_temperature)  # the chain policy's option checks
    check_tree_input(tree, target_logits=target_logits, p_target=p_target)
    if params.greedy:
        raw = SamplingParams(temperature=greedy_criterion_temperature)  # plain softmax(logits / T)
        criterion_probs = logits_to_probs(target_logits, raw)  # [N+1, V]
    else:
        criterion_probs = p_target  # [N+1, V]
    device = criterion_probs.device
    parent_rows = torch.tensor([parent + 1 for parent in tree.parents], dtype=torch.long, device=device)  # [N]
    tokens = torch.tensor(tree.tokens, dtype=torch.long, device=device)  # [N]
    accepted = typical_acceptances(criterion_probs[parent_rows], tokens, rule.eps, rule.delta).tolist()  # [N]
    path = first_accepted_path(tree, accepted)
    row = path[-1] + 1 if path else 0
    if params.greedy:
        return path, int(greedy_token(target_logits[row]))
    return path, sample_token(p_target[row], generator)


@register_walk(TypicalAcceptance)
def typical_tree(policy: TypicalAcceptance, inp: TreeInput) -> TreeDecision:
    """typical: the first typical child, with the policy's eps, delta and criterion temperature."""
    return TreeDecision(*typical_walk(inp.tree, inp.target_logits64, inp.p_target, inp.params, inp.generator, policy.eps,
                                      policy.delta, policy.greedy_criterion_temperature))
