"""Chapter 1, the chain: draft gamma tokens, verify them in one pass of gamma + 1 rows, keep a prefix.

    speculative.py   the loop (generate_chain): prefill, draft, verify, decide, roll back
    loop.py          what every loop shares (results, checks, prefill, commit); trees and batches use it
    stats.py         tau, acceptance and timings, defined once
    drafters.py      the drafter interface and its kinds: a model, a lower-precision self, early exit, n-grams
    draft_length.py  how many to draft at each step (fixed or adaptive; the lab's priced and fallback
                     schedules plug in the same way)

It builds on model/ and acceptance/. The tree and batch chapters build on it, never on speculative.py.
"""
