"""Draft trees: several continuations drafted at once, verified in ONE target pass.

A chain drafts d_1..d_g and the target keeps a prefix. A tree drafts several candidates per
position (the top-k tokens of a draft model, every earlier n-gram match), so when the first
choice is wrong a sibling may be right. The tree is kept as flat arrays, nodes in topological
order (a parent before its children):

    node i:  tokens[i]       its token
             parents[i]      its parent node, or -1 for a child of the root (the last committed
                             token, `last`, which nobody has scored yet)
             depth(i)        1 + depth(parent), 1 for the root's children
             q_draft[i]      [V] the drafter's distribution at the parent, the one tokens[i] came from

Verification feeds [last, node 0, ..., node N-1] in one pass (N+1 rows). Row 0 is the root, at
position P = cache.length; node i sits at position P + depth(i), its depth, not its index, since
it continues the sequence there. Each row attends to the cache (everything committed) and to its
own ancestors (and itself) only, never to a sibling or a cousin:

    tree_mask: [N+1, P+N+1] bool    row r sees keys [0, P) and the rows on its path to the root

So row 0's logits score the root's children, and row i+1's score node i's children (or give the
bonus token after node i if it is a leaf): each node's logits equal those of a plain forward of
its path, which is what makes one tree pass as good as one chain pass per branch.

After the policy picks a path (nodes a_1..a_n, each the parent of the next), the cache holds
P + 1 + N rows, most of them for rejected branches. keep_path moves the rows of the accepted
nodes into place, P+1 .. P+n, and truncates after them: the cache then equals a cache built by
feeding the accepted sequence alone.

A chain is the width-1 tree: parents = [-1, 0, 1, ..., g-2] (DraftTree.chain).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec.errors import MinispecError


@dataclass
class DraftTree:
    tokens: list[int]  # [N] node tokens, topological order
    parents: list[int]  # [N] parent node index, -1 = child of the root (the last committed token)
    q_draft: torch.Tensor  # [N, V] the drafter's distribution at each node's parent
    logits: torch.Tensor | None = None  # [N, V] the drafter's raw logits there (None for model-free drafters)

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.tokens):
            raise MinispecError(f"DraftTree: {len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise MinispecError(f"DraftTree: node {i} has parent {parent}; expected -1 <= parent < {i} "
                                    "(nodes in topological order)")
        seen = set()
        for i, (parent, token) in enumerate(zip(self.parents, self.tokens)):
            if (parent, token) in seen:
                raise MinispecError(f"DraftTree: node {i} repeats token {token} under parent {parent}; "
                                    "siblings must differ")
            seen.add((parent, token))
        self.depths = []  # [N] depth of each node: 1 for the root's children
        for parent in self.parents:
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)

    @staticmethod
    def chain(tokens: list[int], q_draft: torch.Tensor, logits: torch.Tensor | None = None) -> "DraftTree":
        """The width-1 tree of a chain draft d_1..d_g."""
        return DraftTree(list(tokens), list(range(-1, len(tokens) - 1)), q_draft, logits)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """The children of `node` (-1: the root), in index order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`, inclusive."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]


def tree_positions(tree: DraftTree, start: int, device=None) -> torch.Tensor:
    """RoPE positions of the verify rows [last, node 0..N-1]: [N+1], the root at `start`, a node at start + depth."""
    return torch.tensor([start] + [start + d for d in tree.depths], device=device)


def tree_mask(tree: DraftTree, start: int, device=None) -> torch.Tensor:
    """Which keys each verify row may attend to: [N+1, start+N+1] bool, True = visible.

    Every row sees the whole cache [0, start) and the root (column start); node i also sees its
    ancestors and itself (columns start+1+a for a on its path), and nothing else.
    """
    n = tree.num_nodes
    mask = torch.zeros(n + 1, start + n + 1, dtype=torch.bool, device=device)
    mask[:, : start + 1] = True  # the cache and the root
    for i in range(n):
        mask[i + 1, [start + 1 + a for a in tree.path(i)]] = True
    return mask


def keep_path(cache, start: int, path: list[int]) -> None:
    """After a tree pass at offset `start`: keep the root's row and the rows of the accepted nodes.

    The cache holds [0, start) + [root, node 0, ..., node N-1]. The accepted nodes' keys and values
    move to start+1 .. start+len(path) in every layer, and the cache is cut after them.
    """
    source = torch.tensor([start + 1 + node for node in path], dtype=torch.long)
    for layer in range(cache.num_layers):
        for buffer in (cache.k[layer], cache.v[layer]):  # [B, H_kv, S, hd]
            rows = buffer.index_select(2, source.to(buffer.device))  # a copy: sources and targets may overlap
            buffer.narrow(2, start + 1, len(path)).copy_(rows)
    cache.truncate(start + 1 + len(path))
