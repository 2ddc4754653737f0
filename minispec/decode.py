"""The front door: one `generate` for every chapter, handing each call to the loop it belongs to.

    generate(target, prompt_ids, **options)              one prompt, a chain or plain decoding:
                                                          minispec.chain.speculative.generate_chain
    generate(target, prompt_ids, tree=..., **options)    one prompt, draft trees:
                                                          minispec.trees.speculative.generate_tree
    generate(target, [prompt, ...], **options)           several prompts (or a 2-D tensor):
                                                          minispec.batch.speculative.generate_batch

The options are the chain's (draft, policy, gamma, draft_length, temperature, top_k, top_p,
seed, eos_token_ids, on_tokens, on_step, stop_when), each chapter adding its own (tree's shape;
a batch's batch_size and on_finish); each chapter's docstring says what it takes, and an option
a chapter cannot apply is a one-line error there.
"""

from __future__ import annotations

from minispec.batch.speculative import generate_batch, is_batch
from minispec.chain.speculative import generate_chain
from minispec.trees.speculative import generate_tree


def generate(target, prompt_ids, *, tree=None, **options):
    """Decode `prompt_ids` with `target`: a GenerationResult for one prompt, a BatchResult for several."""
    if is_batch(prompt_ids):
        return generate_batch(target, prompt_ids, tree=tree, **options)
    if tree is not None:
        return generate_tree(target, prompt_ids, tree=tree, **options)
    return generate_chain(target, prompt_ids, **options)
