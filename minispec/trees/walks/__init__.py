"""Acceptance over draft trees, one rule's walk per file (as acceptance/ holds one rule per file).

    base.py        what a walk sees and returns, the registry (register_walk, walk_for), the helpers
    exact.py       greedy_walk: the target's argmax while a child carries it          ExactMatch
    sampling.py    sampling_walk: recursive rejection over siblings; lossless         SpeculativeSampling
    typical.py     typical_walk: the first typical child                             TypicalAcceptance
    dropmatch.py   dropmatch_walk: K dropout heads at the parent's row, or the base   DropMatch
    traversal.py   traversal_walk: leaf to root, whole sequences first; lossless     TraversalVerification
    multipath.py   multipath_walk: block verification path by path; lossless         MultiPathBlockVerification

Importing the package registers every built-in walk.
"""

from minispec.trees.walks.base import (TreeDecision, TreeInput, TreeWalk, check_tree_input, children_by_row,
                                       first_accepted_path, register_walk, walk_for, walk_names)
from minispec.trees.walks.dropmatch import dropmatch_walk
from minispec.trees.walks.exact import greedy_walk
from minispec.trees.walks.multipath import multipath_block, multipath_walk
from minispec.trees.walks.sampling import node_coins, recursive_rejection, sampling_walk
from minispec.trees.walks.traversal import child_weight, traversal_walk, traverse
from minispec.trees.walks.typical import typical_walk

__all__ = ["TreeDecision", "TreeInput", "TreeWalk", "check_tree_input", "children_by_row", "first_accepted_path",
           "register_walk", "walk_for", "walk_names", "greedy_walk", "sampling_walk", "node_coins",
           "recursive_rejection", "typical_walk", "dropmatch_walk", "child_weight", "traverse", "traversal_walk",
           "multipath_block", "multipath_walk"]
