"""What the converter reads from a GGUF file, checked before it is used: one line per fault.

A GGUF file's metadata is data, not code: a value of the wrong type, out of range, or at odds
with the tensors would otherwise end in a traceback, or in a folder that converts without a word
and that only the loader refuses (and converting again cannot mend). The converter calls:

    check_metadata(meta)              before any tensor is planned: every size a positive int (a
                                      string "4" or a 0 is refused), the head counts consistent,
                                      the norm epsilon and RoPE base finite and > 0, the token list
                                      strings, one token type per token (types covering only some
                                      tokens would silently make <|im_end|> an ordinary token), the
                                      bos / eos / padding ids inside the vocabulary
    check_against_tensors(meta, plan) the tensors' shapes against the metadata: the embedding (and
                                      an untied head) has one row per token and embedding_length
                                      columns, and the blk.N tensors number exactly block_count
    check_finite(path, name, weight)  while writing: a tensor with NaN or infinite values once
                                      dequantized (a damaged block scale) stops the conversion

Every message names the file and the key or tensor, and says what was expected.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from minispec.errors import CheckpointError

SIZES = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
         "attention.head_count_kv", "context_length")  # under "<arch>.": each a positive integer
OPTIONAL_SIZES = ("attention.key_length",)
POSITIVE_FLOATS = ("attention.layer_norm_rms_epsilon", "rope.freq_base")
SPECIAL_IDS = ("bos", "eos", "padding")  # tokenizer.ggml.<name>_token_id, each optional
LARGEST_SIZE = 2**31 - 1  # a size past this is a damaged field, not a model


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_metadata(meta) -> None:
    """CheckpointError (one line) unless the metadata the converter reads is well typed and consistent.

    meta: convert.GGUFMetadata (get(key) -> value or None; [key] -> value or a one-line error)."""
    path, arch = meta.path, meta["general.architecture"]
    sizes = {}
    for key in SIZES + OPTIONAL_SIZES:
        full = f"{arch}.{key}"
        value = meta[full] if key in SIZES else meta.get(full)
        if value is None:
            continue
        if not (is_int(value) and 1 <= value <= LARGEST_SIZE):
            raise CheckpointError(f"{path}: {full} is {value!r}; expected a positive integer")
        sizes[key] = value
    heads, kv_heads = sizes["attention.head_count"], sizes["attention.head_count_kv"]
    if heads % kv_heads:
        raise CheckpointError(f"{path}: {arch}.attention.head_count_kv is {kv_heads}; expected a divisor of "
                              f"{arch}.attention.head_count ({heads})")
    if "attention.key_length" not in sizes and sizes["embedding_length"] % heads:
        raise CheckpointError(f"{path}: {arch}.embedding_length is {sizes['embedding_length']}; expected a multiple "
                              f"of {arch}.attention.head_count ({heads}), or a {arch}.attention.key_length")
    for key in POSITIVE_FLOATS:
        value = meta[f"{arch}.{key}"]
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise CheckpointError(f"{path}: {arch}.{key} is {value!r}; expected a finite number > 0")
    tokens = meta["tokenizer.ggml.tokens"]
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{path}: tokenizer.ggml.tokens is not a non-empty list of strings; expected the "
                              "vocabulary")
    first_id: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if first_id.setdefault(token, i) != i:  # a tokenizer.json vocabulary maps each string to ONE id
            raise CheckpointError(f"{path}: tokenizer.ggml.tokens holds {token!r} twice (ids {first_id[token]} and {i}); "
                                  "expected each token once")
    types = meta["tokenizer.ggml.token_type"]
    if not isinstance(types, list) or len(types) != len(tokens) or not all(is_int(t) for t in types):
        count = len(types) if isinstance(types, list) else type(types).__name__
        raise CheckpointError(f"{path}: tokenizer.ggml.token_type has {count} entries for {len(tokens)} tokens; "
                              "expected one integer type per token")
    for name in SPECIAL_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        value = meta.get(key)
        if value is not None and not (is_int(value) and 0 <= value < len(tokens)):
            raise CheckpointError(f"{path}: {key} is {value!r}; expected a token id in [0, {len(tokens)})")


def check_against_tensors(meta, plan) -> None:
    """CheckpointError unless the planned tensors (convert.PlannedTensor: name, torch shape) agree
    with the metadata: the embedding and an untied head [vocab, embedding_length], and the
    model.layers.N tensors for exactly N = 0..block_count-1."""
    path, arch = meta.path, meta["general.architecture"]
    vocab, hidden = len(meta["tokenizer.ggml.tokens"]), meta[f"{arch}.embedding_length"]
    shapes = {t.name: t.shape for t in plan}
    for name, gguf_name in (("model.embed_tokens.weight", "token_embd.weight"), ("lm_head.weight", "output.weight")):
        if name in shapes and shapes[name] != (vocab, hidden):
            raise CheckpointError(f"{path}: tensor '{gguf_name}' is {list(shapes[name])}; expected [{vocab}, {hidden}] "
                                  f"(tokenizer.ggml.tokens has {vocab} tokens, {arch}.embedding_length is {hidden})")
    if "model.embed_tokens.weight" not in shapes:
        raise CheckpointError(f"{path}: no tensor 'token_embd.weight'; expected the token embedding")
    layers = {int(m.group(1)) for name in shapes if (m := re.match(r"model\.layers\.(\d+)\.", name))}
    blocks = meta[f"{arch}.block_count"]
    if layers != set(range(blocks)):
        found = f"blk.0..blk.{max(layers)}" if layers else "no blk.N tensors"
        raise CheckpointError(f"{path}: {arch}.block_count is {blocks} but the file has {found} "
                              f"({len(layers)} blocks); expected tensors for blk.0..blk.{blocks - 1}")


def check_finite(path: Path, name: str, weight) -> None:
    """CheckpointError if `weight` (a dequantized tensor) holds NaN or an infinity."""
    import torch

    if not bool(torch.isfinite(weight).all()):
        raise CheckpointError(f"{path}: tensor {name} holds NaN or infinite values once dequantized (a damaged block "
                              "scale?); expected finite weights: the file is damaged, fetch it again")
