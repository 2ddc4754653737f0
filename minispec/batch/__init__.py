"""Chapter 3, batches: several prompts at once, each row exactly as if it ran alone.

    ragged_cache.py  RaggedKVCache: one cache with a length, positions and a mask per row
    drafters.py      drafting for every row at once
    speculative.py   the loop over a batch (generate_batch)

It builds on chapter 1 (chain/ but not its loop), model/ and acceptance/; never on trees/.
"""
