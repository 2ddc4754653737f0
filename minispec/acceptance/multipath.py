"""Greedy multi-path block verification: block verification over several draft paths, lossless.

Block verification (block.py) judges one draft path as a block. With several candidate paths (a
draft tree, or K chains that part at the root), Thomas & Pal (arXiv 2602.16961, ICML 2026) show
that a greedy extension accepts more tokens per step; they call it GBV. The construction here is
ours, written from the guarantees the paper states (lossless; block verification with one path;
never fewer tokens in expectation than block verification on the same drafts), not from its
pseudocode. It runs block verification on one path at a time, and sends the residual that path
leaves to the next path that continues the accepted prefix:

    u = the root, T = p_u (the target's row at u), path = []
    loop  c = u's first untried child; none: emit y ~ T, stop
          the path: c, then the first child of each node down to a leaf: x_1..x_L
          block verification on it, with T as its first target row (p below it) and the
          draft rows the nodes were drawn from: accepted length tau, weight w_tau
          tau = L: accept x_1..x_L, emit the bonus y ~ p after x_L, stop
          else   accept x_1..x_tau; u' = the node at depth tau (u itself if tau = 0);
                 T <- norm(max(0, w_tau T_tau - Q_{tau+1})), where T_tau is the path's target row
                 at u' (T if tau = 0, else p at u') and Q_{tau+1} the rejected node's draft row;
                 u's untried children lose the rejected node; u <- u'

Why it is lossless. Block verification on one path is lossless for any target (Sun et al.): its
output is the target's path distribution when the token after the accepted prefix is drawn from
its residual norm(max(0, w_tau T_tau - Q_tau+1)). The loop replaces that one draw by another
lossless procedure for the residual followed by the target: block verification of an untried
subtree of u', whose first token was drawn from its recorded draft row given everything tried
before it (siblings without replacement: the drafter records q with the elder siblings removed)
and whose deeper tokens from the draft after it, with coins nobody has read. A rejected node
never comes back, and the residual gives it no mass when its draft row was one-hot (n-gram).
tests/test_policy_multipath.py enumerates the output exactly on small trees.

What it guarantees, and what the tests check exactly:
- lossless at every temperature (p and q post-processed identically);
- on one path (a chain) it is block verification, draw for draw: the same coins, in its order;
- never fewer accepted tokens than block verification on the first path of the same tree,
  draw for draw: the first round is that block verification, and later rounds only add.
Unlike traversal verification (Weng et al., the tree form of `traversal`), which tries every
continuation of a node before stopping at the node, this rule stops at the first node block
verification picks on each path and only then tries that node's other children; on a chain the
two coincide. Which accepts more on a given tree is measured, not assumed (docs/rules.md).

Randomness: one float64 uniform per node, drawn up front (node i's coin is read when block
verification asks whether to stop at depth j with node i at that depth), then one token draw.
Its tree walk is minispec.trees.walks.multipath_walk; on a chain `decide` is block verification's.
"""

from __future__ import annotations

from minispec.acceptance.base import register
from minispec.acceptance.block import BlockVerification


@register("multipath")
class MultiPathBlockVerification(BlockVerification):
    """Greedy multi-path block verification: on a tree, minispec.trees.walks.multipath_walk (lossless);
    on a chain, block verification draw for draw (`decide` is inherited)."""

    lossless = True
