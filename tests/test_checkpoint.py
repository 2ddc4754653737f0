"""The loader (minispec/checkpoints/load.py): round trips of single and sharded, tied and untied
checkpoints, and its strict checks with one-line errors."""

import json

import pytest
import torch
from safetensors.torch import save_file

from minispec import load_model
from minispec.model.config import ModelConfig
from minispec.errors import CheckpointError, ConfigError
from minispec.testing import random_model

BASE = {
    "model_type": "llama", "vocab_size": 32, "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
}


def write_checkpoint(folder, cfg_raw, model, drop=(), reshape=None, sharded=False):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg_raw))
    state = {("lm_head.weight" if k == "lm_head.weight" else "model." + k): v.contiguous()
             for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    for name in drop:
        state.pop(name)
    if reshape:
        state[reshape] = state[reshape][:-1]
    if sharded:
        names = sorted(state)
        half = len(names) // 2
        parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for file, keys in parts.items():
            save_file({k: state[k] for k in keys}, folder / file)
        index = {"weight_map": {k: f for f, keys in parts.items() for k in keys}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        save_file(state, folder / "model.safetensors")
    return folder


@pytest.fixture
def tiny(tmp_path):
    raw = {**BASE, "tie_word_embeddings": False}
    model = random_model(ModelConfig.from_hf(raw), seed=0, dtype=torch.float32)
    return raw, model


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_single_and_sharded_tied_and_untied(tmp_path, sharded, tied):
    raw = {**BASE, "tie_word_embeddings": tied}
    model = random_model(ModelConfig.from_hf(raw), seed=1, dtype=torch.float32)
    loaded = load_model(write_checkpoint(tmp_path / "ck", raw, model, sharded=sharded))
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == tied
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)


def test_tied_config_tolerates_a_written_lm_head(tmp_path):
    raw = {**BASE, "tie_word_embeddings": True}
    model = random_model(ModelConfig.from_hf(raw), seed=2, dtype=torch.float32)
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    state = {"model." + k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["lm_head.weight"] = model.lm_head.weight.clone()
    save_file(state, folder / "model.safetensors")
    loaded = load_model(folder)
    assert loaded.lm_head.weight is loaded.embed_tokens.weight


def test_loads_in_bfloat16(tmp_path, tiny):
    raw, model = tiny
    loaded = load_model(write_checkpoint(tmp_path / "ck", raw, model), dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16 and loaded.lm_head.weight.dtype == torch.bfloat16


def one_line(err):
    assert "\n" not in str(err.value)
    return str(err.value)


def test_missing_config_json(tmp_path):
    (tmp_path / "ck").mkdir()
    with pytest.raises(ConfigError) as err:
        load_model(tmp_path / "ck")
    assert "config.json: file not found" in one_line(err)


def test_unknown_model_type(tmp_path, tiny):
    raw, model = tiny
    folder = write_checkpoint(tmp_path / "ck", {**raw, "model_type": "gpt2"}, model)
    with pytest.raises(ConfigError) as err:
        load_model(folder)
    assert "config.json: field 'model_type' = 'gpt2'" in one_line(err)


def test_tensor_of_the_wrong_shape(tmp_path, tiny):
    raw, model = tiny
    folder = write_checkpoint(tmp_path / "ck", raw, model, reshape="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    assert "tensor 'model.layers.1.mlp.up_proj.weight' has shape [23, 32]; expected [24, 32]" in one_line(err)


def test_missing_tensor(tmp_path, tiny):
    raw, model = tiny
    folder = write_checkpoint(tmp_path / "ck", raw, model, drop=["lm_head.weight", "model.norm.weight"])
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    assert "missing tensor 'lm_head.weight' (and 1 more)" in one_line(err)


def test_unexpected_tensor(tmp_path, tiny):
    raw, model = tiny
    folder = write_checkpoint(tmp_path / "ck", {**raw, "num_hidden_layers": 1}, model)
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    assert "unexpected tensor 'model.layers.1." in one_line(err)


def test_no_weights_and_pickle_only(tmp_path, tiny):
    raw, _ = tiny
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        load_model(folder)
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match=r"only pickle weights"):
        load_model(folder)


@pytest.mark.parametrize("content", [
    pytest.param(lambda data: data[:100], id="truncated-header"),
    pytest.param(lambda data: data[:-100], id="truncated-data"),
    pytest.param(lambda data: b"", id="empty"),
    pytest.param(lambda data: bytes(range(256)) * 4, id="random-bytes"),
    pytest.param(lambda data: (2**40).to_bytes(8, "little") + b"{}", id="oversized-header"),
])
def test_a_file_that_is_not_safetensors_names_it(tmp_path, tiny, content):
    """Corrupt weights are a CheckpointError naming the file, from load_model and map_tensor alike."""
    from minispec.checkpoints.load import map_tensor

    raw, model = tiny
    folder = write_checkpoint(tmp_path / "ck", raw, model)
    weights = folder / "model.safetensors"
    weights.write_bytes(content(weights.read_bytes()))
    for load in (lambda: load_model(folder), lambda: map_tensor(folder, "embed_tokens.weight")):
        with pytest.raises(CheckpointError) as err:
            load()
        assert one_line(err).startswith(f"{weights}: not a readable safetensors file (")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool, torch.complex64])
def test_a_tensor_that_is_not_floating_point_is_refused(tmp_path, tiny, dtype):
    """Casting integer (quantized) weights to float gives a model that runs and talks nonsense."""
    from safetensors.torch import load_file

    raw, model = tiny
    folder = write_checkpoint(tmp_path / "ck", raw, model)
    state = load_file(folder / "model.safetensors")
    state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"].to(dtype)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    name = str(dtype).removeprefix("torch.")
    assert one_line(err) == (f"{folder / 'model.safetensors'}: tensor 'model.layers.0.mlp.up_proj.weight' is {name}; "
                             "expected a floating-point tensor (float32, bfloat16, float16, ...)")


@pytest.mark.parametrize("index", ['{"weight_map": ["a"]}', '{"weight_map": {"x": 1}}', "[]", "{"])
def test_a_shard_index_without_a_weight_map_object(tmp_path, tiny, index):
    raw, _ = tiny
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match="expected JSON with a 'weight_map' object"):
        load_model(folder)
