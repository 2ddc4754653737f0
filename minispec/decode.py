"""The front door: one `generate` for every chapter, handing each call to the loop it belongs to.

    generate(target, prompt_ids, **options)              one prompt, a chain or plain decoding:
                                                          minispec.chain.speculative.generate_chain
    generate(target, prompt_ids, tree=..., **options)    one prompt, draft trees:
                                                          minispec.trees.speculative.generate_tree
    generate(target, [prompt, ...], **options)           several prompts (or a 2-D tensor):
                                                          minispec.batch.speculative.generate_batch

The options are the chain's (draft, policy, gamma, draft_length, temperature, top_k, top_p,
seed, eos_token_ids, on_tokens, on_step, stop_when), each chapter adding its own (tree's shape;
a batch's batch_size and on_finish); each chapter's signature declares what it takes. An option
given to a chapter that does not take it is a one-line error here (the chain's on_step and
draft_length with a tree; a tree or on_step with several prompts).
"""

from __future__ import annotations

from minispec.batch.speculative import generate_batch, is_batch
from minispec.errors import MinispecError
from minispec.chain.speculative import generate_chain
from minispec.trees.speculative import generate_tree


def generate(target, prompt_ids, *, tree=None, **options):
    """Decode `prompt_ids` with `target`: a GenerationResult for one prompt, a BatchResult for several."""
    if is_batch(prompt_ids):
        refuse("with several prompts (a batch decodes chains)", tree=tree, on_step=options.pop("on_step", None))
        return generate_batch(target, prompt_ids, **options)
    if tree is not None:
        refuse("with a tree (it records a chain step)", on_step=options.pop("on_step", None))
        if options.get("draft_length", "fixed") != "fixed":
            raise MinispecError(f"draft_length = {options['draft_length']!r} with a tree; expected 'fixed' (a tree's "
                                "depth is gamma)")
        options.pop("draft_length", None)
        return generate_tree(target, prompt_ids, tree=tree, **options)
    return generate_chain(target, prompt_ids, **options)


def refuse(where: str, **given) -> None:
    """A one-line error for an option the chapter a call goes to does not take (None: not given)."""
    for name, value in given.items():
        if value is not None:
            raise MinispecError(f"{name}: not available {where}; expected {name}=None")
