"""Acceptance over draft trees: walk down from the root, keep a path, emit the token after it.

A draft tree (minispec.trees.tree.DraftTree) holds N candidate nodes in topological order; the target
scores all of them in one pass of N+1 rows:

    target_logits [N+1, V]   row 0 scores the root's children, row i+1 node i's children
    p_target      [N+1, V]   the same rows post-processed (temperature, top-k, top-p)
    tree.q_draft  [N, V]     row i: the distribution tokens[i] was drawn from

A walk starts at the root (node u = -1, the last committed token) and at node u reads row u+1.
Either it accepts one child c of u and moves to c, or it stops and emits the token after u:

    path        the accepted nodes, the root's child first, each the parent of the next
    next_token  the correction where the walk stopped, or the bonus token after a fully
                accepted leaf (a leaf has no children to test: its row only gives the bonus)

and the loop commits [tokens[a] for a in path] + [next_token]. Children are tried in index
order, c_1..c_k, with x_j = tokens[c_j]:

    walk           at node u, p = row u+1                                        width 1 (DraftTree.chain)
    -------------  ------------------------------------------------------------  -------------------------
    greedy_walk    accept the child carrying argmax p; else emit argmax p          ExactMatch
    sampling_walk  recursive rejection sampling over the siblings; lossless        SpeculativeSampling
    typical_walk   accept the first x_j with p(x_j) > min(eps, delta exp(-H(p)))   TypicalAcceptance
    dropmatch_walk the first child DropMatch (K dropout heads at u's row) or the     DropMatch
                   base (greedy / sampling) accepts
    traversal_walk leaf to root: whole root-to-leaf sequences tested first, a node     TraversalVerification
                   only once its every continuation is rejected; lossless           (= BlockVerification)
    multipath_walk block verification on one path at a time, the residual it leaves   MultiPathBlockVerification
                   passed to the next path from where it stopped; lossless         (= BlockVerification)

On a width-1 tree each walk makes its chain policy's decision draw for draw (the same generator
state gives the same num_accepted = len(path) and next_token, and leaves the same state behind).
The rules themselves are the chain policies' functions, imported, not copied.

A policy's walk is looked up by its class, in a registry any policy can join, as `register`
gives a chain policy its name:

    @register_walk(MyPolicy)
    def my_walk(policy: MyPolicy, inp: TreeInput) -> TreeDecision: ...

`walk_for(policy)` finds it (None: greedy at T = 0, sampling at T > 0). The lookup is by the
exact class, not its bases: a walk is the tree form of one rule, and a subclass that changes
`decide` (dropmatch-lazy's shortcuts) has not shown that its tree form is its parent's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import torch

from minispec.acceptance.base import AcceptancePolicy, PolicyInputError, VerifyInput
from minispec.acceptance.block import TraversalVerification, block_weights, next_distribution, stop_probabilities
from minispec.acceptance.dropmatch.rule import DropMatch
from minispec.acceptance.exact import ExactMatch
from minispec.acceptance.multipath import MultiPathBlockVerification
from minispec.acceptance.sampling import SpeculativeSampling, acceptance_probability, residual_distribution
from minispec.acceptance.typical import TypicalAcceptance, typical_acceptances
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, greedy_token, logits_to_probs, sample_token
from minispec.trees.tree import DraftTree


@dataclass
class TreeInput:
    """What a walk sees after the tree's verify pass (N nodes, N+1 rows)."""

    tree: DraftTree  # tokens [N], parents [N], q_draft [N, V], logits [N, V] or None
    target_logits: torch.Tensor  # [N+1, V] the target's raw logits (row 0: the root's children)
    params: SamplingParams  # temperature / top-k / top-p, as for the chain
    generator: torch.Generator  # the walk's coins and draws
    hidden: torch.Tensor | None = None  # [N+1, d] the LM-head input of the pass (DropMatch re-runs the head)
    head: Callable[[torch.Tensor], torch.Tensor] | None = None  # the target's LM head

    @cached_property
    def target_logits64(self) -> torch.Tensor:
        """[N+1, V] target_logits in float64, what the sampling-based walks compute with (once per step)."""
        return self.target_logits.double()

    @cached_property
    def p_target(self) -> torch.Tensor:
        """[N+1, V] the target's post-processed distributions, in float64 (computed on first use)."""
        return logits_to_probs(self.target_logits64, self.params)


@dataclass
class TreeDecision:
    path: list[int]  # the accepted nodes, the root's child first
    next_token: int  # the correction where the walk stopped, or the bonus after an accepted leaf
    info: dict = field(default_factory=dict)  # the policy's diagnostics, summed into stats["policy_info"]


TreeWalk = Callable[[AcceptancePolicy, TreeInput], TreeDecision]
_WALKS: dict[type, TreeWalk] = {}


def register_walk(policy_class: type[AcceptancePolicy]):
    """Function decorator: `walk(policy, inp) -> TreeDecision` is the tree form of `policy_class`."""

    def add(walk: TreeWalk) -> TreeWalk:
        if policy_class in _WALKS and _WALKS[policy_class] is not walk:
            raise ValueError(f"policy class {policy_class.__name__} already has a tree walk: {_WALKS[policy_class]}")
        _WALKS[policy_class] = walk
        return walk

    return add


def walk_for(policy: AcceptancePolicy) -> TreeWalk:
    """The registered tree walk of `policy`'s class, else a one-line error naming the policies that have one."""
    walk = _WALKS.get(type(policy))
    if walk is None:
        raise MinispecError(f"policy {policy.name!r} has no tree form; expected {', '.join(walk_names())} or a "
                            "policy with a walk of its own (minispec.trees.walks.register_walk) with a tree, "
                            "or a chain: no tree")
    return walk


def check_tree_input(tree: DraftTree, **rows: torch.Tensor) -> None:
    """Shapes a walk can index without guarding, else a PolicyInputError.

    Each named row tensor is [N+1, V] with one V for all of them, tree.q_draft is [N, V], and
    every node token lies in [0, V). (The tree's own structure, parents before children and
    distinct siblings, is checked by DraftTree itself.)
    """
    n = tree.num_nodes
    vocab = None
    for name, value in rows.items():
        if value.dim() != 2 or value.shape[0] != n + 1 or (vocab is not None and value.shape[1] != vocab):
            width = "V" if vocab is None else f"V={vocab}"
            raise PolicyInputError(f"{name}: shape {list(value.shape)}; expected [N+1={n + 1}, {width}] "
                                   f"for a tree of N={n} nodes")
        vocab = value.shape[1]
    if tuple(tree.q_draft.shape) != (n, vocab):
        raise PolicyInputError(f"tree.q_draft: shape {list(tree.q_draft.shape)}; expected [N={n}, V={vocab}]")
    outside = [token for token in tree.tokens if not 0 <= token < vocab]
    if outside:
        raise PolicyInputError(f"tree.tokens: ids outside [0, {vocab}): {outside}")


def children_by_row(tree: DraftTree) -> list[list[int]]:
    """[N+1] lists: entry u+1 holds node u's children in index order (entry 0: the root's)."""
    children: list[list[int]] = [[] for _ in range(tree.num_nodes + 1)]
    for node, parent in enumerate(tree.parents):
        children[parent + 1].append(node)
    return children


def first_accepted_path(tree: DraftTree, accepted: list[bool]) -> list[int]:
    """From the root, move to the first accepted child (index order) until a node has none.

    accepted [N]: node i's verdict, judged against its parent's row. A verdict below a rejected
    node is never read (the prefix rule, on a tree).
    """
    children = children_by_row(tree)
    path, node = [], -1
    while True:
        child = next((c for c in children[node + 1] if accepted[c]), None)
        if child is None:
            return path
        path.append(child)
        node = child


def greedy_walk(tree: DraftTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Exact match over a tree: follow the target's argmax while a child carries it.

        y_u        = argmax_v target_logits[u+1, v]              lowest id on ties (greedy_token)
        accept c   iff tokens[c] == y_parent(c)                  at most one child: siblings differ
        next_token = y at the last accepted node (the root if none): the correction, or the bonus

    The emitted tokens are plain greedy decoding's for any tree. target_logits [N+1, V].
    """
    check_tree_input(tree, target_logits=target_logits)
    choice = greedy_token(target_logits).tolist()  # [N+1]: the target's argmax at every row
    accepted = [token == choice[parent + 1] for token, parent in zip(tree.tokens, tree.parents)]  # [N]
    path = first_accepted_path(tree, accepted)
    return path, choice[path[-1] + 1 if path else 0]


def sampling_walk(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
    """Lossless speculative sampling over a tree: recursive rejection sampling over siblings.

    p_target [N+1, V], tree.q_draft [N, V]. At node u, with p = p_target[u+1] and children
    c_1..c_k in index order, x_j = tokens[c_j] drawn from q_j = q_draft[c_j]:

        r_1 = p
        for j = 1..k:  accept x_j with probability a_j = min(1, r_j(x_j) / q_j(x_j)): move to c_j
                       else r_{j+1} = norm(max(0, r_j - q_j)) and try the next sibling
        none accepted: next_token y ~ r_{k+1}               (a leaf, k = 0: the bonus, y ~ p)

    (a_j = 1{r_j(x_j) > 0} where q_j(x_j) = 0, the chain's rule: acceptance_probability.)

    Why the token emitted at u is distributed exactly as p. Claim: from sibling j on, given
    everything drawn before it (x_1..x_{j-1} and their rejections), the emitted token is
    distributed as r_j. For j = k+1 it is the draw y ~ r_{k+1}. For j <= k, x_j is a draw from
    q_j given that history, tested with a coin nobody has read, and r_{j+1} depends on r_j and
    q_j only, not on x_j; so the chain's one-position argument applies with (p, q) := (r_j, q_j)
    and the claim for j+1:

        P(y) = q_j(y) a_j(y) + P(reject x_j) r_{j+1}(y)
             = min(r_j(y), q_j(y)) + max(0, r_j(y) - q_j(y)) = r_j(y),

    since P(reject x_j) = 1 - sum_x min(r_j(x), q_j(x)) = sum_z max(0, r_j(z) - q_j(z)) is
    r_{j+1}'s normaliser. At j = 1: the token emitted at u is distributed as r_1 = p. If it is
    x_j, the walk moves to c_j, whose row p_target[c_j+1] is the target's distribution after it
    and whose children were drawn from their q_draft rows after it: the same argument holds
    there, so by induction every emitted token, given the ones before it, is distributed as the
    target's. (A rejected x_j had r_j(x_j) < q_j(x_j), so r_{j+1}(x_j) = 0: the residual never
    offers a token already turned down.)

    q_j must be what x_j was really drawn from: q for i.i.d. siblings; for siblings drawn
    without replacement, q with x_1..x_{j-1} removed and renormalised (the drafter fills q_draft
    that way); one-hot for a drafter without probabilities (an n-gram trie), and then a_j = r_j(x_j)
    and r_{j+1} is r_j with x_j removed. Recording q where q_j was used breaks losslessness.

    Empty residual: if max(0, r_j - q_j) has no mass (r_j <= q_j everywhere, so r_j = q_j),
    a_j = 1 wherever q_j > 0 and x_j was accepted surely; should rounding reject it anyway,
    residual_distribution returns r_j itself, so the draw stays well defined (the chain's rule).

    At temperature 0 (one-hot p) a_j = 1 iff x_j is the argmax and every residual is p again:
    this is greedy_walk whenever q_j(x_j) > 0.

    Randomness, all from `generator`: N float64 uniforms up front, u_i being node i's coin
    (accept iff u_i < a), then one draw for next_token. A node is tested at most once (when its
    parent was accepted, after its elder siblings were rejected), so every coin is fresh when
    read; on a width-1 tree this is exactly SpeculativeSampling's order (gamma uniforms, one draw).
    """
    check_tree_input(tree, p_target=p_target)
    coins = node_coins(tree, generator)  # [N] u_i: node i's coin
    children = children_by_row(tree)
    path, node = [], -1
    while True:
        child, residual = recursive_rejection(tree, children[node + 1], p_target[node + 1], coins)
        if child is None:  # every child rejected (or none: a leaf)
            return path, sample_token(residual, generator)
        path.append(child)
        node = child


def node_coins(tree: DraftTree, generator: torch.Generator) -> list[float]:
    """[N] float64 uniforms, u_i for node i, drawn up front in one call (the chain's gamma uniforms)."""
    return torch.rand(tree.num_nodes, generator=generator, dtype=torch.float64, device=generator.device).tolist()


def recursive_rejection(tree: DraftTree, siblings: list[int], p_row: torch.Tensor,
                        coins: list[float]) -> tuple[int | None, torch.Tensor]:
    """One node's step of sampling_walk: test the siblings c_1..c_k in turn against r_j.

    p_row [V]: the target's distribution at their parent (r_1). Returns the first accepted
    sibling and r at that point, or (None, r_{k+1}): the residual to draw the correction from.
    """
    residual = p_row  # [V] r_1 = p
    for child in siblings:
        q_child = tree.q_draft[child].to(p_row.device)  # [V] q_j, what tokens[child] was drawn from
        token = torch.tensor([tree.tokens[child]], device=p_row.device)  # [1]
        accept_prob = float(acceptance_probability(residual[None], q_child[None], token)[0])  # a_j
        if coins[child] < accept_prob:
            return child, residual
        residual = residual_distribution(residual, q_child)  # [V] r_{j+1} = norm(max(0, r_j - q_j))
    return None, residual


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
    path, node, only_dm = [], -1, 0
    while True:
        siblings = children[node + 1]
        if params.greedy:
            base_child = next((c for c in siblings if tree.tokens[c] == int(clean_tokens[node + 1])), None)
        else:
            base_child, residual = recursive_rejection(tree, siblings, p_target[node + 1], coins)
        child = next((c for c in siblings if dm[c] or (policy.or_base and c == base_child)), None)
        if child is None:
            break
        only_dm += child != base_child
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


def child_weight(w_parent: float, p_x: float, q_x: float) -> float:
    """min(1, w_parent p(x) / q(x)); where q(x) = 0, 1 if p(x) > 0 and w_parent > 0 (block_weights' rule)."""
    return min(1.0, w_parent * p_x / q_x) if q_x > 0 else float(p_x > 0 and w_parent > 0)


def traverse(tree: DraftTree, p_target: torch.Tensor,
             accept: Callable[[int, float], bool]) -> tuple[list[int], torch.Tensor]:
    """traversal_walk with its tests left to `accept(node, weight) -> bool`.

    p_target [N+1, V] (row u+1 scores node u's children; row 0 the root's). Returns the accepted
    path (root's child first) and the distribution [V] float64 the next token is drawn from.
    With accept = (coin[node] < weight) this is traversal_walk; a test enumerates it exactly by
    answering each call both ways with probabilities weight and 1 - weight.
    """
    check_tree_input(tree, p_target=p_target)
    n = tree.num_nodes
    children = children_by_row(tree)  # entry u+1: node u's children, index order
    parents, tokens = tree.parents, tree.tokens
    q_draft = tree.q_draft.to(p_target.device, torch.float64)  # [N, V]
    rows = list(p_target.to(torch.float64).unbind(0))  # [N+1] of [V]: P_u at index u+1
    weight = [1.0] + [0.0] * n  # index u+1: w_u
    alive = [True] * n

    def reweigh(u: int) -> None:  # the weights of u's remaining subtrees, from w_u and P_u
        stack = [u]
        while stack:
            v = stack.pop()
            for c in children[v + 1]:
                if alive[c]:
                    weight[c + 1] = child_weight(weight[v + 1], float(rows[v + 1][tokens[c]]), float(q_draft[c, tokens[c]]))
                    stack.append(c)

    reweigh(-1)
    while True:
        node, path = -1, []
        while True:  # the first leaf in post-order
            child = next((c for c in children[node + 1] if alive[c]), None)
            if child is None:
                break
            node = child
            path.append(node)
        if node == -1 or accept(node, weight[node + 1]):
            return path, rows[node + 1]
        alive[node] = False
        u = parents[node]
        w_u = weight[u + 1]
        excess = (w_u * rows[u + 1] - q_draft[node]).clamp(min=0)  # [V]
        mass = float(excess.sum())
        if mass > 0:
            rows[u + 1] = excess / mass
        denominator = mass + 1.0 - w_u
        weight[u + 1] = min(1.0, mass / denominator) if denominator > 0 else 0.0
        reweigh(u)


def traversal_walk(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
    """Traversal verification (Weng et al., arXiv 2505.12398): block verification's tree form, lossless.

    Token-level tree verification (sampling_walk) walks down from the root and drops a whole
    subtree as soon as its root is rejected. Traversal verification starts from the leaves: it
    tests whole root-to-node sequences, deepest first, and only when a node's every continuation
    has been turned down does it test the node itself. On a chain it is block verification
    (block.py), draw for draw; on a tree it is lossless and, in exact computations on small trees
    (tests/test_policy_traversal.py), never accepts fewer tokens in expectation than token-level
    verification (the paper reports +2.2-5.7% acceptance length).

    The walk. Node u (the root is u = -1) keeps a weight w_u and a target row P_u (at first
    p_target[u+1]); node c was drawn from Q_c = tree.q_draft[c] (siblings without replacement: q
    with the elder siblings removed, renormalised; one-hot for an n-gram trie). With x_c = tokens[c]:

        weights   w_root = 1,  w_c = min(1, w_u P_u(x_c) / Q_c(x_c)) for c a child of u
                  (1 if P_u(x_c) > 0 and w_u > 0 where Q_c(x_c) = 0: block.py's rule)
        loop      a = the first leaf in post-order (the first remaining child, down to a leaf)
                  a is the root: stop there (every draft rejected)
                  u_a < w_a (node a's coin): accept the path root..a and stop
                  else delete a and, with u = a's parent and m = sum_v max(0, w_u P_u(v) - Q_a(v)):
                       P_u <- norm(max(0, w_u P_u - Q_a))              (kept as it is if m = 0)
                       w_u <- min(1, m / (m + 1 - w_u))                (0 where m + 1 - w_u = 0)
                       and the weights of u's remaining subtrees are recomputed from the new w_u, P_u
        next      y ~ P_a at the node the walk stopped at: the bonus after an untouched leaf, the
                  residual after a node whose children were all rejected

    On a chain the loop tests the leaf gamma with w_gamma, then each node j on the way up with
    m_j / (m_j + 1 - w_j): block verification's stop probabilities h_j, in its order (the largest j
    whose coin passes), with its residual norm(max(0, w_j p_j - q_j)) for the next token. Where the
    paper is silent we took block.py's decisions: the 0/0 value (m + 1 - w = 0 needs P_u = Q_a, and
    then a's subtree is rejected with probability 0), the q = 0 limit, float64 throughout.

    Randomness: N float64 uniforms up front, node i's coin read when node i is tested (each node at
    most once), then one token draw: on a chain, block verification's gamma uniforms and draw.

    Cost: one [V] residual per rejected node, so at most N; the weights are scalar work.
    """
    coins = node_coins(tree, generator)  # [N] u_i: node i's coin
    path, next_row = traverse(tree, p_target, lambda node, w: coins[node] < w)
    return path, sample_token(next_row, generator)


def multipath_block(tree: DraftTree, p_target: torch.Tensor,
                    accept: Callable[[int, float], bool]) -> tuple[list[int], torch.Tensor]:
    """multipath_walk with its tests left to `accept(node, stop probability) -> bool`.

    p_target [N+1, V]. Returns the accepted path (root's child first) and the distribution [V]
    float64 the next token is drawn from. Block verification on a path x_1..x_L asks, from the
    deepest depth j = L up, whether to stop at j (node x_j, probability h_j); the first yes
    gives tau = j, none gives tau = 0: its "largest j with u_j < h_j", one node's coin per test.
    """
    check_tree_input(tree, p_target=p_target)
    untried = [list(kids) for kids in children_by_row(tree)]  # entry u+1: node u's children not yet tried
    q_draft = tree.q_draft.to(p_target.device, torch.float64)  # [N, V]
    p_rows = p_target.to(torch.float64)  # [N+1, V]
    node, row, path = -1, p_rows[0], []  # u, T (the target row at u), the accepted nodes
    while untried[node + 1]:
        chain = [untried[node + 1][0]]
        while untried[chain[-1] + 1]:  # down the first children to a leaf (nothing below u was tried)
            chain.append(untried[chain[-1] + 1][0])
        targets = torch.stack([row] + [p_rows[c + 1] for c in chain])  # [L+1, V]: T, then p below
        drafts = q_draft[chain]  # [L, V]
        weights = block_weights(targets, drafts, torch.tensor([tree.tokens[c] for c in chain]))  # [L+1]
        stop = stop_probabilities(targets, drafts, weights)  # [L]
        tau = next((j for j in range(len(chain), 0, -1) if accept(chain[j - 1], float(stop[j - 1]))), 0)
        path += chain[:tau]
        if tau == len(chain):
            return path, targets[tau]  # the bonus after the leaf
        residual = next_distribution(targets, drafts, weights, tau)  # [V] norm(max(0, w_tau T_tau - Q))
        node = chain[tau - 1] if tau else node
        untried[node + 1].remove(chain[tau])
        mass = float(residual.sum())
        row = residual / mass if mass > 0 else row  # mass 0: a stop of probability 0 (block.py's note)
    return path, row


def multipath_walk(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
    """Greedy multi-path block verification (minispec/acceptance/multipath.py): lossless.

    Randomness: N float64 uniforms up front, node i's coin read when a path's block verification
    asks about the depth where node i sits (each node at most once: a path is tested once, and a
    rejected node's subtree is never tried again), then one token draw; on a chain, block
    verification's gamma uniforms and draw.
    """
    coins = node_coins(tree, generator)  # [N] u_i: node i's coin
    path, next_row = multipath_block(tree, p_target, lambda node, h: coins[node] < h)
    return path, sample_token(next_row, generator)


# ---------------------------------------------------------------- the built-in policies' tree forms


@register_walk(ExactMatch)
def exact_tree(policy: ExactMatch, inp: TreeInput) -> TreeDecision:
    """exact: greedy_walk at any temperature (as the chain rule, which is greedy at any T)."""
    return TreeDecision(*greedy_walk(inp.tree, inp.target_logits))


@register_walk(SpeculativeSampling)
def sampling_tree(policy: SpeculativeSampling, inp: TreeInput) -> TreeDecision:
    """sampling: recursive rejection over siblings (lossless at every T)."""
    return TreeDecision(*sampling_walk(inp.tree, inp.p_target, inp.generator))


@register_walk(TypicalAcceptance)
def typical_tree(policy: TypicalAcceptance, inp: TreeInput) -> TreeDecision:
    """typical: the first typical child, with the policy's eps, delta and criterion temperature."""
    return TreeDecision(*typical_walk(inp.tree, inp.target_logits64, inp.p_target, inp.params, inp.generator, policy.eps,
                                      policy.delta, policy.greedy_criterion_temperature))


@register_walk(TraversalVerification)
def traversal_tree(policy: TraversalVerification, inp: TreeInput) -> TreeDecision:
    """traversal: leaf to root, whole sequences first (lossless at every T)."""
    return TreeDecision(*traversal_walk(inp.tree, inp.p_target, inp.generator))


@register_walk(MultiPathBlockVerification)
def multipath_tree(policy: MultiPathBlockVerification, inp: TreeInput) -> TreeDecision:
    """multipath: block verification path by path, the residual passed on (lossless at every T)."""
    return TreeDecision(*multipath_walk(inp.tree, inp.p_target, inp.generator))


@register_walk(DropMatch)
def dropmatch_tree(policy: DropMatch, inp: TreeInput) -> TreeDecision:
    """dropmatch: K dropout heads judge each node at its parent's row, OR-ed with the base."""
    return TreeDecision(*dropmatch_walk(inp.tree, inp.target_logits64, inp.p_target, inp.hidden, inp.head, inp.params,
                                        inp.generator, policy))


def walk_names() -> list[str]:
    """The names of minispec's own policies with a tree walk, sorted (a user's registered walks
    are the error message's "a policy with a walk of its own")."""
    return sorted(cls.name for cls in _WALKS if cls.__module__.startswith("minispec."))
