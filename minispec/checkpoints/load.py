"""Load a Hugging Face checkpoint (a folder, or a hub repo id via minispec.checkpoints.hub) into a minispec Transformer.

A folder holds config.json and either model.safetensors or a sharded set described by
model.safetensors.index.json ({"weight_map": {tensor name: shard file}}). Only safetensors are
read: no pickle, nothing from the checkpoint is ever executed.

Checks are strict, because a silently missing or mis-shaped tensor gives a model that runs and
talks nonsense: every expected tensor must be present with the expected shape and a
floating-point dtype (an integer tensor cast to float is not the weight it was quantized from), and
no unexpected tensor may be left over. The one tolerated extra is `lm_head.weight` in a checkpoint
whose config ties it to the embeddings (some exporters write the shared matrix twice). A file that
is not safetensors at all (truncated, empty, random bytes) is a CheckpointError naming it.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from minispec.model.config import ModelConfig
from minispec.errors import CheckpointError
from minispec.checkpoints.hub import resolve_checkpoint
from minispec.model.transformer import Transformer

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_placement(dtype, device) -> tuple[torch.dtype, torch.device]:
    """load_model's dtype (a floating torch.dtype) and device (usable_device), with one-line errors."""
    if not isinstance(dtype, torch.dtype) or dtype not in WEIGHT_DTYPES:
        names = ", ".join(f"torch.{str(d).removeprefix('torch.')}" for d in WEIGHT_DTYPES)
        hint = f" (torch.{dtype}, not the string)" if isinstance(dtype, str) and hasattr(torch, dtype) else ""
        raise CheckpointError(f"dtype = {dtype!r}{hint}: the weights are stored in a float dtype; expected one of "
                              f"{names} (an int8 copy: minispec.kernels 'int8' or draft 'self:int8')")
    return dtype, usable_device(device, "device")


def usable_device(device, name: str) -> torch.device:
    """`device` as a torch.device that can run a model here: a small computation on it must give a
    value (torch says why not in its own words: unknown type, not compiled with it, no such index)."""
    try:
        device = torch.device(device)
        if device.type == "meta":  # tensors without data: everything "runs", nothing is computed
            raise RuntimeError("meta tensors hold no data")
        torch.ones(2, device=device).add(1).sum().item()
    except Exception as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        reason = reason if len(reason) <= 100 else reason[:97] + "..."
        raise CheckpointError(f"{name} = {str(device)!r}: torch cannot use it on this machine ({reason}); expected "
                              "cpu, or an available accelerator such as cuda, cuda:1, mps") from None
    return device


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               revision: str | None = None) -> Transformer:
    """Read config.json and the safetensors weights in `path`; return the model in eval mode.

    `path`: a checkpoint folder or a hub repo id 'owner/name[@revision]' (minispec.checkpoints.hub).
    """
    dtype, device = check_placement(dtype, device)
    folder = resolve_checkpoint(path, revision, what="checkpoint")
    config = ModelConfig.from_hf(folder)

    with torch.device("meta"):  # no memory, no random init: every tensor comes from the file
        model = Transformer(config)
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")  # same tensor as model.embed_tokens.weight

    state = {}
    for name, tensor in _read_tensors(folder, set(expected), config.model_type):
        if tuple(tensor.shape) != expected[name]:
            raise CheckpointError(
                f"{folder}: tensor '{_hf_name(name)}' has shape {list(tensor.shape)}; expected {list(expected[name])} "
                f"from config.json's {shape_fields(name)}"
            )
        state[name] = tensor.to(device=device, dtype=dtype)
    missing = sorted(set(expected) - set(state))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        why = (" (config.json's tie_word_embeddings is false: the head is a tensor of its own; true if it shares "
               "the embedding)") if missing[0] == "lm_head.weight" else ""
        raise CheckpointError(f"{folder}: missing tensor '{_hf_name(missing[0])}'{more}{why}")

    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:  # assign=True replaced the parameters: tie them again
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


def map_tensor(folder: str | Path, name: str) -> torch.Tensor | None:
    """One tensor as a view of the memory-mapped checkpoint file, in the file's dtype; None if absent.

    Nothing is read until used: a page of the file becomes resident only when a row on it is read
    (minispec.kernels.packed keeps the embedding table this way: only the rows of tokens seen are
    paged in).
    """
    for file in _shard_files(Path(folder)):
        with _open(file) as f:
            for hf_name in (_hf_name(name), name):
                if hf_name in f.keys():
                    return _get_tensor(f, file, hf_name)
    return None


def _hf_name(name: str) -> str:
    """Our parameter name -> the checkpoint's (HF puts everything but lm_head under 'model.')."""
    return name if name.startswith("lm_head.") else "model." + name


SHAPE_FIELDS = {  # a tensor's name ends with -> the config.json fields its shape is made of
    "embed_tokens.weight": "vocab_size x hidden_size", "lm_head.weight": "vocab_size x hidden_size",
    "q_proj.weight": "num_attention_heads * head_dim x hidden_size", "q_proj.bias": "num_attention_heads * head_dim",
    "k_proj.weight": "num_key_value_heads * head_dim x hidden_size", "k_proj.bias": "num_key_value_heads * head_dim",
    "v_proj.weight": "num_key_value_heads * head_dim x hidden_size", "v_proj.bias": "num_key_value_heads * head_dim",
    "o_proj.weight": "hidden_size x num_attention_heads * head_dim", "q_norm.weight": "head_dim",
    "k_norm.weight": "head_dim", "gate_proj.weight": "intermediate_size x hidden_size",
    "up_proj.weight": "intermediate_size x hidden_size", "down_proj.weight": "hidden_size x intermediate_size",
    "norm.weight": "hidden_size", "layernorm.weight": "hidden_size",
}


def shape_fields(name: str) -> str:
    """The config.json fields that set tensor `name`'s shape (head_dim: hidden_size // num_attention_heads
    unless config.json gives it)."""
    return next((fields for end, fields in SHAPE_FIELDS.items() if name.endswith(end)), "fields")


def _read_tensors(folder: Path, expected: set[str], model_type: str):
    """Yield (our name, tensor) for every tensor in the folder's safetensors file(s): each in one
    file only, floating-point and finite (a NaN or inf weight is a broken file, not a model)."""
    seen: dict[str, Path] = {}
    for file in _shard_files(folder):
        with _open(file) as f:
            for hf_name in f.keys():
                if hf_name in seen:
                    raise CheckpointError(f"{file}: tensor '{hf_name}' is also in {seen[hf_name].name}; expected each "
                                          "tensor in one shard (which copy is meant cannot be told)")
                seen[hf_name] = file
                name = hf_name.removeprefix("model.")
                if name not in expected:
                    if name == "lm_head.weight":  # tied config, exporter wrote the head anyway
                        continue
                    if name.endswith("rotary_emb.inv_freq"):  # old exporters saved a derived buffer
                        continue
                    raise CheckpointError(f"{file}: unexpected tensor '{hf_name}'; not part of a '{model_type}' model as config.json describes it")
                tensor = _get_tensor(f, file, hf_name)
                if not tensor.dtype.is_floating_point:  # quantized or mislabelled: a cast would give garbage
                    raise CheckpointError(f"{file}: tensor '{hf_name}' is {str(tensor.dtype).removeprefix('torch.')}; "
                                          "expected a floating-point tensor (float32, bfloat16, float16, ...)")
                if not bool(torch.isfinite(tensor).all()):
                    bad = "NaN" if bool(torch.isnan(tensor).any()) else "inf"
                    raise CheckpointError(f"{file}: tensor '{hf_name}' holds {bad}; expected finite weights (fetch or "
                                          "convert the checkpoint again)")
                yield name, tensor


@contextmanager
def _open(file: Path):
    """safe_open, with a file that is not safetensors (truncated, empty, random bytes, a header
    larger than the file) reported as a CheckpointError naming it."""
    try:
        handle = safe_open(file, framework="pt")
    except SafetensorError as err:
        raise CheckpointError(f"{file}: not a readable safetensors file ({err}); expected a complete safetensors "
                              "file (fetch or convert it again)") from None
    with handle as f:
        yield f


def _get_tensor(f, file: Path, hf_name: str) -> torch.Tensor:
    try:
        return f.get_tensor(hf_name)
    except SafetensorError as err:
        raise CheckpointError(f"{file}: tensor '{hf_name}' cannot be read ({err}); expected a complete "
                              "safetensors file (fetch or convert it again)") from None


def _shard_files(folder: Path) -> list[Path]:
    single, index = folder / SINGLE_FILE, folder / INDEX_FILE
    for path in (single, index):
        if path.exists() and not path.is_file():
            raise CheckpointError(f"{path}: {'a folder' if path.is_dir() else 'not a regular file'}; expected the "
                                  "safetensors weights file")
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: expected JSON with a 'weight_map' object ({{tensor name: shard file}})")
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise CheckpointError(f"{index}: shard '{file.name}' listed in weight_map is "
                                      f"{'a folder' if file.is_dir() else 'missing'}; expected a safetensors file")
        return files
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise CheckpointError(f"{folder}: only pickle weights (*.bin/*.pt) found; expected {SINGLE_FILE} (safetensors)")
    raise CheckpointError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}; expected safetensors weights")
