"""Convert a GGUF model file into the Hugging Face folder minispec reads.

    convert_gguf("model.gguf", "weights/my-model")                     # float32
    convert_gguf("model.gguf", "weights/my-model", dtype="bfloat16")   # half the disk, rounded

writes config.json, model.safetensors, generation_config.json, tokenizer.json and
tokenizer_config.json. Architectures: llama, qwen2, qwen3 (ARCHITECTURES). Tensor types: every
one llama.cpp's own `gguf` package dequantizes and minispec's tests cover (SUPPORTED_TYPES: F32,
F16, BF16, the legacy Q4_0 ... Q8_0 and the K-quants Q2_K ... Q6_K). Tokenizers: byte-level BPE
with the pre-tokenizer of the 'smollm' or the 'qwen2' recipe (PRE_TOKENIZERS).

Two passes over the file, so that a file it cannot convert costs nothing:
1. Plan (plan_tensors, hf_config, build_tokenizer): every tensor's Hugging Face name, shape and
   type, the config and the tokenizer, from the metadata alone. A tensor with no Hugging Face name,
   a type or architecture we do not convert, a pre-tokenizer we do not know: a CheckpointError
   naming the file and the field, before any weight is dequantized.
2. Write (write_safetensors): the safetensors header first (every offset is known from the plan),
   then one tensor at a time, dequantized to float32, rounded to the output dtype and appended.
   Peak memory is one tensor's float32 copy and gguf's temporaries for it (for the
   Qwen2.5-Coder-1.5B file: its 151,936 x 1536 embedding, 0.9 GB) plus the pages of the mapped
   GGUF file the kernel keeps; never the whole model, in any dtype.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from minispec.checkpoints.disk import require_free, write_failure
from minispec.cli import extra
from minispec.checkpoints.gguf_checks import check_against_tensors, check_finite, check_metadata
from minispec.errors import CheckpointError

if TYPE_CHECKING:  # torch, numpy and gguf load where a conversion needs them
    import torch

ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),  # NEOX RoPE in llama.cpp: stored as in HF
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False),
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {  # blk.N.<key> -> model.layers.N.<value>
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
CONTROL_TOKEN_TYPE = 3  # tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
OUTPUT_DTYPES = {"float32": "F32", "bfloat16": "BF16"}  # --dtype -> the safetensors dtype written
USER_DEFINED_TOKEN_TYPE = 4  # an added token that is not special (Qwen's <tool_call>): matched whole, not skipped


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the GGUF file as it will be written: name, torch shape, and how to get it."""

    name: str  # the Hugging Face name
    shape: tuple[int, ...]  # torch order: (rows, cols)
    source: object  # gguf's ReaderTensor
    unpermute_heads: int | None  # llama q/k: undo llama.cpp's row permutation with this many heads

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, dtype: str = "float32", quiet: bool = True,
                 on_weights_written: Callable[[], None] | None = None, shown_as: str | Path | None = None) -> Path:
    """Write the HF folder (weights, config, tokenizer) for the GGUF file at `gguf_path` into `out_dir`.

    dtype: "float32" (the dequantized values exactly) or "bfloat16" (each rounded to nearest
    even: half the disk, and what a bfloat16 model would round them to anyway).
    on_weights_written: called once model.safetensors is complete, before the other files.
    shown_as: the folder as error messages name it (default: `out_dir`; ensure_checkpoint writes
    into a temp folder and names the destination).

    Room is checked before anything is written (a one-line CheckpointError); a write that fails
    anyway (the disk filled meanwhile) removes what this call wrote and is a one-line
    CheckpointError too.
    """
    if dtype not in OUTPUT_DTYPES:
        raise CheckpointError(f"dtype={dtype!r}: not a dtype the converter writes; expected one of "
                              f"{', '.join(OUTPUT_DTYPES)}")
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader, meta = open_gguf(gguf_path)
    arch = meta["general.architecture"]
    check_metadata(meta)  # sizes, ids and token types, before anything reads them (gguf_checks.py)
    plan = plan_tensors(reader, meta)
    check_against_tensors(meta, plan)
    config = hf_config(meta, {t.name for t in plan}, dtype)
    tokenizer = build_tokenizer(meta)
    special = {key: config[f"{key}_token_id"] for key in ("bos", "eos", "pad")}
    token_name = {None: None} | dict(enumerate(meta["tokenizer.ggml.tokens"]))
    tokenizer_config = {
        "tokenizer_class": "GPT2Tokenizer",
        **{f"{key}_token": token_name[token_id] for key, token_id in special.items()},
        "add_bos_token": False,  # both recipes: the chat template writes <|im_start|> itself
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # decode must give back the exact text
        "model_max_length": config["max_position_embeddings"],
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    if meta.get("tokenizer.ggml.add_bos_token", False):
        raise CheckpointError(f"{gguf_path}: tokenizer.ggml.add_bos_token is true; expected false (minispec's "
                              "tokenizer adds no BOS, the chat template writes its own)")

    params = sum(t.numel for t in plan)
    weight_bytes = params * (4 if dtype == "float32" else 2)
    shown = Path(shown_as) if shown_as is not None else out_dir
    require_free(out_dir, weight_bytes, f"the {dtype} weights, config and tokenizer",
                 "free some space, or convert into another folder (dest=)", shown_as=shown)
    _say(f"converting {len(plan)} tensors ({arch}, {params / 1e6:.0f}M parameters) from {gguf_path.name} "
         f"to {dtype} ...", quiet)
    json_files = {"config.json": config, "tokenizer_config.json": tokenizer_config,
                  "generation_config.json": {f"{key}_token_id": token_id for key, token_id in special.items()}}
    made_folder = not out_dir.exists()
    written: list[Path] = []  # what this call wrote, removed again if a later write fails
    file = "model.safetensors"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written.append(out_dir / file)
        write_safetensors(out_dir / file, plan, dtype, _progress(len(plan), quiet), gguf_path=gguf_path)
        if on_weights_written is not None:
            on_weights_written()
        for file, content in json_files.items():
            written.append(out_dir / file)
            (out_dir / file).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        file = "tokenizer.json"
        written.append(out_dir / file)
        save_tokenizer(tokenizer, out_dir / file)
    except BaseException as error:  # Ctrl-C and bugs too: never leave a half-written folder
        for path in written:
            path.unlink(missing_ok=True)
        if made_folder:
            shutil.rmtree(out_dir, ignore_errors=True)
        if isinstance(error, OSError):  # a full disk, a folder made read-only meanwhile: the user's to fix
            raise write_failure(shown, file, error) from None
        raise
    return out_dir


def save_tokenizer(tokenizer, path: Path) -> None:
    """tokenizer.save, with its failed write (the tokenizers library raises a plain Exception,
    "No space left on device (os error 28)") as the OSError it is."""
    try:
        tokenizer.save(str(path))
    except Exception as error:
        if "os error" not in str(error):
            raise
        raise OSError(str(error)) from None


def open_gguf(gguf_path: Path):
    """(gguf.GGUFReader, GGUFMetadata) for the file; a missing package or a bad file is one line."""
    gguf = extra("gguf", "gguf", f"reading {gguf_path}")
    if not gguf_path.is_file():
        found = "a folder" if gguf_path.is_dir() else "not a regular file" if gguf_path.exists() else "no such file"
        raise CheckpointError(f"{gguf_path}: {found}; expected a GGUF model file")
    try:
        reader = gguf.GGUFReader(gguf_path)
    except Exception as error:  # bad magic, truncated or garbled: gguf has no error type of its own
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise CheckpointError(f"{gguf_path}: not a valid GGUF file ({reason}); expected a complete GGUF model file") from None
    meta = GGUFMetadata(reader, gguf_path)
    arch = meta["general.architecture"]
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{gguf_path}: general.architecture is '{arch}'; expected one of {sorted(ARCHITECTURES)}")
    return reader, meta


def plan_tensors(reader, meta: GGUFMetadata) -> list[PlannedTensor]:
    """Every tensor of the file under its HF name and torch shape, checked before any is read.

    GGUF lists dims fastest-first (ggml's ne[]), so torch's (rows, cols) is the reverse.
    """
    arch = meta["general.architecture"]
    qk_permuted = ARCHITECTURES[arch][2]
    heads = {"q_proj": meta[f"{arch}.attention.head_count"], "k_proj": meta[f"{arch}.attention.head_count_kv"]}
    plan, seen = [], set()
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise CheckpointError(f"{meta.path}: tensor '{tensor.name}' has no Hugging Face name; "
                                  "expected token_embd, output_norm, output or blk.N.<attn_*|ffn_*>")
        if name in seen:
            raise CheckpointError(f"{meta.path}: tensor '{tensor.name}' appears twice; expected each tensor once")
        seen.add(name)
        kind = tensor.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise CheckpointError(f"{meta.path}: tensor '{tensor.name}' is {kind}; expected one of "
                                  f"{', '.join(SUPPORTED_TYPES)} (the types minispec converts)")
        shape = tuple(int(d) for d in reversed(tensor.shape))
        projection = name.split(".")[-2]  # model.layers.N.self_attn.<q_proj>.weight
        unpermute = heads[projection] if qk_permuted and projection in heads else None
        if unpermute is not None and (unpermute < 1 or shape[0] % (2 * unpermute) != 0):
            raise CheckpointError(f"{meta.path}: tensor '{tensor.name}' has {shape[0]} rows; expected a multiple "
                                  f"of 2 x {unpermute} (the head count in the metadata)")
        plan.append(PlannedTensor(name, shape, tensor, unpermute))
    return plan


def read_tensor(planned: PlannedTensor) -> torch.Tensor:
    """One planned tensor, dequantized to float32, in HF row order."""
    import torch

    from gguf.quants import dequantize

    tensor = planned.source
    array = dequantize(tensor.data, tensor.tensor_type).reshape(planned.shape)  # float32
    if not array.flags.writeable:  # F32 tensors come back as read-only views of the mapped file
        array = array.copy()
    weight = torch.from_numpy(array)
    if planned.unpermute_heads is not None:
        weight = unpermute_qk(weight, planned.unpermute_heads)
    return weight.contiguous()


def write_safetensors(path: Path, plan: list[PlannedTensor], dtype: str,
                      progress: Callable[[int], None] | None = None, gguf_path: Path | None = None) -> None:
    """Write `plan`'s tensors into a safetensors file at `path`, one tensor in memory at a time.

    The format: an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
    data_offsets: [begin, end]}} (offsets into the data that follows, here in the plan's order,
    padded with spaces to a multiple of 8 bytes), then the raw little-endian data. A tensor with
    NaN or infinite values is a one-line CheckpointError naming it (and `gguf_path`).
    """
    import torch

    st_dtype = OUTPUT_DTYPES[dtype]
    width = 4 if st_dtype == "F32" else 2
    header, offset = {}, 0
    for planned in plan:
        size = planned.numel * width
        header[planned.name] = {"dtype": st_dtype, "shape": list(planned.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for i, planned in enumerate(plan):
            weight = read_tensor(planned)
            check_finite(gguf_path or path, getattr(planned.source, "name", planned.name), weight)
            if st_dtype == "BF16":
                weight = weight.to(torch.bfloat16).view(torch.int16)  # numpy has no bfloat16: write its bits
            f.write(memoryview(weight.numpy()).cast("B"))
            del weight
            if progress is not None:
                progress(i + 1)


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for an unknown name."""
    stem, _, suffix = gguf_name.rpartition(".")  # suffix: weight | bias
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{suffix}"
    if stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{suffix}"
    return None



def unpermute_qk(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation of a Llama q_proj or k_proj weight (or bias).

    Why: llama.cpp's "normal" RoPE rotates adjacent pairs (x0, x1), (x2, x3), ... of each head,
    while HF Llama's rotate_half pairs x_i with x_{i + head_dim/2}. So convert_hf_to_gguf.py
    reorders the rows of each head, w.reshape(n_head, 2, hd/2, in).swapaxes(1, 2), making rows
    i and i + hd/2 adjacent. Here we apply the inverse, per head (n_head = query heads for q,
    key/value heads for k). Forgetting it is quiet: position 0 is unaffected and text stays
    semi-fluent, only the NLL gets much worse. Architectures llama.cpp runs with NEOX RoPE
    (qwen2, qwen3) are stored unpermuted and must not go through this.
    """
    out_features, rest = weight.shape[0], weight.shape[1:]
    head_dim = out_features // n_head
    per_pair = weight.reshape(n_head, head_dim // 2, 2, *rest)  # (heads, hd/2, 2, in): adjacent pairs
    return per_pair.transpose(1, 2).reshape(out_features, *rest).contiguous()  # (heads*[first half; second half], in)


class GGUFMetadata:
    """A GGUF file's key/value metadata as Python values; a missing required key names the file.

    Reads ReaderField.parts directly: ReaderField.contents() only exists in recent gguf releases.
    """

    def __init__(self, reader, path: Path):
        self.reader, self.path = reader, path

    def get(self, key: str, default=None):
        """str/int/float/bool, or a list of them for an array; `default` if the key is absent."""
        from gguf import GGUFValueType

        field = self.reader.fields.get(key)
        if field is None:
            return default
        is_string = field.types[-1] == GGUFValueType.STRING  # types: [ARRAY, element type] or [scalar type]
        try:
            values = [bytes(field.parts[i]).decode("utf-8") if is_string else field.parts[i].item() for i in field.data]
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.path}: '{key}' is not UTF-8 text; not a valid GGUF file") from None
        return values if field.types[0] == GGUFValueType.ARRAY else values[0]

    def __getitem__(self, key: str):
        value = self.get(key)
        if value is None:
            raise CheckpointError(f"{self.path}: no '{key}' in the GGUF metadata; "
                                  f"expected it in a {'/'.join(ARCHITECTURES)} model")
        return value




def hf_config(meta: GGUFMetadata, names: set[str], dtype: str = "float32") -> dict:
    """config.json in the form transformers writes for LlamaForCausalLM (or Qwen2/3), from the GGUF metadata."""
    arch = meta["general.architecture"]
    hf_class, model_type, _ = ARCHITECTURES[arch]
    hidden, n_head = meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"]
    return {
        "architectures": [hf_class],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": meta[f"{arch}.feed_forward_length"],
        "num_hidden_layers": meta[f"{arch}.block_count"],
        "num_attention_heads": n_head,
        "num_key_value_heads": meta[f"{arch}.attention.head_count_kv"],
        "head_dim": meta.get(f"{arch}.attention.key_length", hidden // n_head),
        "rms_norm_eps": _float32_as_decimal(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": _float32_as_decimal(meta[f"{arch}.rope.freq_base"]),
        "rope_scaling": None,
        "max_position_embeddings": meta[f"{arch}.context_length"],
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": "lm_head.weight" not in names,  # no output.weight: the head is the embedding
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "hidden_act": "silu",
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in names,
        "mlp_bias": False,
        "torch_dtype": dtype,
    }


def _float32_as_decimal(value: float) -> float:
    """1e-05 rather than 9.999999747378752e-06: the shortest decimal that reads back as the same float32."""
    import numpy as np

    return float(str(np.float32(value)))



def _smollm_pre_tokenizer():
    """SmolLM2 ('smollm'): digits one by one, then GPT-2's byte-level regex."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


# Qwen2's split: contractions, letters with at most one leading non-letter, single digits,
# punctuation runs with their newlines, newline runs, then spaces (all but the last of a run).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _qwen2_pre_tokenizer():
    """Qwen2 / Qwen2.5 ('qwen2'): QWEN2_SPLIT, then bytes to GPT-2's alphabet (no regex of its own).

    No NFC normalizer: llama.cpp applies none for this recipe (the published tokenizer.json has
    one), so text is tokenized as llama.cpp and transformers' GGUF loader do.
    """
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


PRE_TOKENIZERS = {"smollm": _smollm_pre_tokenizer, "qwen2": _qwen2_pre_tokenizer}  # tokenizer.ggml.pre -> recipe


def build_tokenizer(meta: GGUFMetadata):
    """The byte-level BPE tokenizer that reproduces llama.cpp's ids for this model.

    The pre-tokenizer comes from tokenizer.ggml.pre (PRE_TOKENIZERS; any other is refused, not
    guessed); the control tokens (token_type 3) become special tokens and the user-defined ones
    (token_type 4) added tokens, both matched whole in any text; no BOS is added.
    """
    from tokenizers import AddedToken, Tokenizer, decoders
    from tokenizers.models import BPE

    kind = (meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre"))
    if kind[0] != "gpt2" or kind[1] not in PRE_TOKENIZERS:
        raise CheckpointError(f"{meta.path}: tokenizer.ggml.model/pre are {kind[0]!r}/{kind[1]!r}; expected 'gpt2' "
                              f"with one of {', '.join(repr(k) for k in PRE_TOKENIZERS)} (the tokenizer recipes "
                              "minispec knows)")
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ")) for merge in meta["tokenizer.ggml.merges"]]  # "Ġ t" -> ("Ġ", "t")
    if any(len(pair) != 2 for pair in merges):
        raise CheckpointError(f"{meta.path}: tokenizer.ggml.merges has an entry without exactly one space; "
                              "expected 'left right'")
    tokenizer = Tokenizer(BPE({token: i for i, token in enumerate(tokens)}, merges, byte_fallback=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[kind[1]]()
    tokenizer.decoder = decoders.ByteLevel()
    token_types = meta["tokenizer.ggml.token_type"]
    control = [tokens[i] for i, kind in enumerate(token_types) if kind == CONTROL_TOKEN_TYPE]
    user_defined = [tokens[i] for i, kind in enumerate(token_types) if kind == USER_DEFINED_TOKEN_TYPE]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in control])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in user_defined])
    return tokenizer


def _progress(total: int, quiet: bool) -> Callable[[int], None]:
    """A progress callback: a line at every tenth of the tensors written (none when quiet)."""
    marks = {max(1, round(total * k / 10)) for k in range(1, 11)}

    def report(done: int) -> None:
        if done in marks and done < total:
            _say(f"  {done}/{total} tensors written", quiet)

    return report


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"minispec: {message}", file=sys.stderr, flush=True)
