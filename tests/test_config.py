"""config.json parsing (minispec/config.py): both RoPE spellings, Qwen2, Qwen3, and errors that name the field."""

import pytest

from minispec.config import ModelConfig, RopeScaling
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
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "field 'rope_scaling.rope_type' = 'yarn'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
         "missing field 'rope_parameters.low_freq_factor'"),
        ({"hidden_act": "gelu"}, "field 'hidden_act' = 'gelu'"),
        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16},
         "field 'use_sliding_window' = true; sliding-window attention is not supported"),
        ({"vocab_size": "32"}, "field 'vocab_size' = '32'; expected an integer"),
    ],
)
def test_config_errors_name_the_field(change, message):
    raw = {**BASE, **change}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as err:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(err.value)
