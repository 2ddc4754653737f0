"""DropMatch (arXiv 2603.03333): MC dropout on the LM head's input, K paths, a JS radius test, a vote.

    rule.py        DropMatch: Algorithm 1 as written, every path computed
    lazy.py        LazyDropMatch: the same decisions by exact shortcuts (paths only where needed)
"""
