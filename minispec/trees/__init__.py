"""Chapter 2, trees: draft several branches and score every one in one pass.

    tree.py          DraftTree: parents, depths, positions and the ancestors-only attention mask
    drafters.py      n-gram and model trees (static, or EAGLE-2's dynamic); TreeSpec
    walks.py         each acceptance policy as a walk down the tree, in a registry a policy can join
    speculative.py   the loop over trees (generate_tree)

It builds on chapter 1 (chain/ but not its loop), model/ and acceptance/; never on batch/.
"""
