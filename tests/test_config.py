"""config.json parsing (minispec/model/config.py): both RoPE spellings, Qwen2, Qwen3, and errors that name the field."""

import json
import re

import pytest

from minispec.model.config import ModelConfig, RopeScaling
from minispec.errors import ConfigError

BASE = {
    "model_type": "llama", "vocab_size": 32, "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_hub_and_transformers5_rope_spellings_agree():
    hub = ModelConfig.from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}})
    v5 = ModelConfig.from_hf({**BASE, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3}})
    old = ModelConfig.from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **LLAMA3}})
    assert hub == v5 == old
    assert hub.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192) and hub.rope_theta == 500000.0
    assert hub.head_dim == 8 and hub.num_kv_groups == 2 and not hub.qk_norm


def test_qwen3_needs_head_dim_and_has_qk_norm():
    cfg = ModelConfig.from_hf({**BASE, "model_type": "qwen3", "head_dim": 16, "rope_theta": 1e6})
    assert cfg.qk_norm and cfg.head_dim == 16
    with pytest.raises(ConfigError, match="missing field 'head_dim'"):
        ModelConfig.from_hf({**BASE, "model_type": "qwen3"})


def test_qwen2_as_transformers_writes_it_has_qkv_biases_and_a_derived_head_dim(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers writes the reference config.json")
    transformers.Qwen2Config(
        vocab_size=32, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ).save_pretrained(tmp_path)
    cfg = ModelConfig.from_hf(tmp_path)
    assert cfg.model_type == "qwen2" and cfg.head_dim == 8 and cfg.rope_theta == 1e6 and cfg.tie_word_embeddings
    assert cfg.qkv_bias and not cfg.attention_bias and not cfg.qk_norm  # q, k, v biased; o not; no QK-norm


def test_qwen2_ignores_attention_bias_as_transformers_does():
    # transformers' Qwen2 hard-codes its biases: a stray "attention_bias" must not add one to o_proj
    cfg = ModelConfig.from_hf({**BASE, "model_type": "qwen2", "attention_bias": True})
    assert cfg.qkv_bias and not cfg.attention_bias


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "mistral"}, "field 'model_type' = 'mistral'; expected one of"),
        ({"hidden_size": None}, "missing field 'hidden_size'"),
        ({"num_key_value_heads": 3}, "field 'num_key_value_heads' = 3; expected a positive divisor"),
        ({"hidden_size": 18, "head_dim": None}, "field 'hidden_size' = 18 does not divide into num_attention_heads"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "field 'rope_scaling.rope_type' = 'yarn'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
         "missing field 'rope_parameters.low_freq_factor'"),
        ({"hidden_act": "gelu"}, "field 'hidden_act' = 'gelu'"),
        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16},
         "field 'use_sliding_window' = true; sliding-window attention is not supported"),
        ({"vocab_size": "32"}, "field 'vocab_size' = '32'; expected an integer"),
        ({"num_attention_heads": 0}, "field 'num_attention_heads' = 0; expected a positive integer"),  # no head_dim
        ({"rope_scaling": "llama3"}, "field 'rope_scaling' = 'llama3'; expected an object"),
        ({"rope_parameters": [1]}, "field 'rope_parameters' = [1]; expected an object"),
        ({"rope_scaling": {"rope_type": "llama3", **LLAMA3, "factor": "8"}}, "field 'rope_scaling.factor' = '8'"),
        ({"rope_scaling": {"rope_type": "llama3", **LLAMA3, "high_freq_factor": 1.0}},
         "field 'rope_scaling.high_freq_factor' = 1.0; expected more than low_freq_factor=1.0"),
        ({"tie_word_embeddings": "false"}, "field 'tie_word_embeddings' = 'false'; expected true or false"),
        ({"mlp_bias": 1}, "field 'mlp_bias' = 1; expected true or false"),
        ({"head_dim": "8"}, "field 'head_dim' = '8'; expected an integer"),
        ({"num_key_value_heads": 0}, "field 'num_key_value_heads' = 0; expected a positive divisor"),
        ({"rms_norm_eps": float("inf")}, "field 'rms_norm_eps' = inf; expected a positive finite number"),
        ({"rope_theta": "1e4"}, "field 'rope_theta' = '1e4'; expected a number"),
        ({"use_sliding_window": "no"}, "field 'use_sliding_window' = 'no'; expected true or false"),
        ({"eos_token_id": "two"}, "field 'eos_token_id' = 'two'; expected a token id (an integer) or a list of them"),
        ({"eos_token_id": [2, 32]}, "field 'eos_token_id' = [2, 32]; expected token ids, each 0 <= id < vocab_size=32"),
        ({"bos_token_id": -1}, "field 'bos_token_id' = -1; expected a token id, 0 <= id < vocab_size=32"),
    ],
)
def test_config_errors_name_the_field(change, message):
    raw = {**BASE, **change}
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(err.value)


def test_eos_ids_are_read_as_a_tuple_of_ints():
    assert ModelConfig.from_hf({**BASE, "eos_token_id": 2}).eos_token_ids == (2,)
    assert ModelConfig.from_hf({**BASE, "eos_token_id": [2, 0]}).eos_token_ids == (2, 0)
    assert ModelConfig.from_hf({**BASE, "eos_token_id": None}).eos_token_ids == ()


@pytest.mark.parametrize("text, kind", [("[1, 2, 3]", "an array"), ("null", "null"), ('"llama"', "a string")])
def test_a_config_json_that_is_not_an_object_names_the_file(tmp_path, text, kind):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf(tmp_path)
    assert str(err.value) == f"{tmp_path / 'config.json'}: the top level is {kind}; expected a JSON object of fields"


@pytest.mark.parametrize("change", [{"tie_word_embeddings": "false"}, {"num_key_value_heads": 3}])
def test_errors_from_a_file_name_it_once(tmp_path, change):
    """A type error (found while reading) and a range error (found by the dataclass) both start with the path."""
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **change}))
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf(tmp_path)
    field = next(iter(change))
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: field '{field}' = ")


@pytest.mark.parametrize("source", [123, None, ["config.json"], 1.5])
def test_a_source_that_is_no_folder_file_or_dict_is_one_line(source):
    with pytest.raises(ConfigError, match=rf"^ModelConfig.from_hf: {type(source).__name__}; expected a checkpoint "
                                          "folder"):
        ModelConfig.from_hf(source)
