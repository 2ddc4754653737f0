"""A draft model's LM head over its most frequent tokens only (FR-Spec, arXiv 2502.14856).

With a vocabulary of 151,936 tokens, a small draft model's LM head is a large part of its step:
for Qwen2.5-Coder-0.5B the head is 151,936 x 896 = 136M of its 630M weights, read in full for
every drafted token. FR-Spec restricts the draft's head to the N most frequent tokens:

    logits_draft[v] = W[v] . h   for v in keep (N rows)      -inf for every other v

so a draft step reads N / V of the head. The draft can then never propose a token outside
`keep`; where the target wants one, the draft is rejected there and the target supplies it. The
verify is the target's and unchanged, so the output is what the acceptance policy makes of it:
exact match and speculative sampling stay lossless (q_draft is 0 outside `keep`, which the
residual max(0, p - q) covers), only tau can fall.

Which tokens: a byte-level BPE vocabulary is numbered in merge order, and merges are learned most
frequent first, so the lowest ids are the tokenizer corpus's most frequent tokens. We keep ids
0 .. N-1 and every added token above them (<|im_end|> and the other control tokens: the draft
must be able to propose the end of an answer). FR-Spec counts frequencies on a corpus instead;
`token_ids=` takes any such list.

    draft = load_model(folder, dtype=torch.bfloat16)
    kernels.frequent_head.apply(draft, 32768, tokenizer.added_token_ids)   # then, if wanted:
    kernels.apply(draft, "int8")                                            # the kept rows in int8

A kernels rewrite afterwards (fast, int8, compiled) puts the kept rows in a layer of its kind.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minispec.errors import MinispecError
from minispec.model.transformer import Transformer


class FrequentHead(nn.Module):
    """logits [..., V] from a linear layer over `token_ids` (N of the V rows); -inf elsewhere.

    linear: [..., d] -> [..., N], the kept rows; as built by `apply`, a dense layer
    (kernels.compiled.DenseLinear). A kernels rewrite (packed.rewrite) asks `rebuilt(its linear)`
    for the same head with those rows in its own layer.
    """

    def __init__(self, linear: nn.Module, token_ids: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.linear, self.vocab_size = linear, vocab_size
        self.register_buffer("token_ids", token_ids, persistent=False)  # [N], ascending

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept = self.linear(hidden)  # [..., N]
        logits = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))  # [..., V]
        logits[..., self.token_ids] = kept
        return logits

    def rebuilt(self, make_linear) -> "FrequentHead":
        """The same head with its dense rows moved into `make_linear(weight, bias)`'s layer."""
        return FrequentHead(make_linear(self.linear.weight, None), self.token_ids, self.vocab_size)

    def extra_repr(self) -> str:
        return f"kept={self.token_ids.numel()}, vocab_size={self.vocab_size}"


def frequent_token_ids(keep: int, added_ids: list[int]) -> torch.Tensor:
    """ids 0 .. keep-1 and every id in `added_ids`, ascending and once each: [N]."""
    return torch.cat([torch.arange(keep), torch.tensor(added_ids, dtype=torch.long)]).unique()


def checked_ids(name: str, ids, vocab: int, nonempty: bool = False) -> torch.Tensor:
    """`ids` (a list, tuple or 1-D integer tensor) as an int64 tensor [N], each in [0, vocab); else one line."""
    try:
        tensor = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError):
        tensor = None
    if tensor is None or tensor.dim() != 1 or (tensor.numel() and (tensor.dtype.is_floating_point or
                                                                    tensor.dtype in (torch.bool, torch.complex64))):
        raise MinispecError(f"frequent_head.apply: {name} = {ids!r}; expected a list or 1-D tensor of token ids")
    tensor = tensor.to(torch.long)
    if nonempty and tensor.numel() == 0:
        raise MinispecError(f"frequent_head.apply: {name} is empty; expected at least one token id")
    outside = tensor[(tensor < 0) | (tensor >= vocab)]
    if outside.numel():
        raise MinispecError(f"frequent_head.apply: {name} holds {outside[:5].tolist()} outside [0, {vocab}); "
                            "expected ids of the draft's vocabulary")
    return tensor


def apply(model: Transformer, keep: int, added_ids: list[int] = (), *,
          token_ids: torch.Tensor | None = None) -> Transformer:
    """Give `model` (a draft, as loaded: before any kernels.apply) a FrequentHead over its `keep`
    most frequent tokens, ids 0 .. keep-1, and the `added_ids` (its tokenizer's added tokens:
    minispec.checkpoints.tokenizer.Tokenizer.added_token_ids); in place, returns the model.

    token_ids: the ids to keep instead (a list or 1-D tensor, e.g. counted on a corpus as FR-Spec does).
    Ids outside the vocabulary, in either argument, are one line (not dropped).
    A kernels.apply afterwards puts the kept rows in its own layer.
    """
    from minispec import kernels
    from minispec.kernels.compiled import DenseLinear

    vocab = model.config.vocab_size
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= vocab:
        raise MinispecError(f"keep={keep!r}: expected a whole number of tokens in [1, {vocab}] "
                            "(the draft's vocabulary size)")
    if kernels.kind_of(model) != "reference" or isinstance(model.lm_head, FrequentHead):
        raise MinispecError("frequent_head.apply: expected a freshly loaded draft model (before kernels.apply, and "
                            "with its full head)")
    if token_ids is None:
        token_ids = frequent_token_ids(keep, checked_ids("added_ids", added_ids, vocab).tolist())
    else:
        token_ids = checked_ids("token_ids", token_ids, vocab, nonempty=True).unique()  # sorted, each once
    rows = model.lm_head.weight[token_ids]  # [N, d]; DenseLinear keeps its own copy
    model.lm_head = FrequentHead(DenseLinear(rows, None), token_ids, vocab)
    return model
