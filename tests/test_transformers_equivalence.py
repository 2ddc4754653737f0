"""Our model against transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM on
random tiny configs, each family drawn separately so every one is always compared.

The HF model is built from a random config, saved with save_pretrained (so the config.json is
written the way transformers >= 5 writes it), and loaded by our own loader. Tolerance: max
|logit diff| <= 1e-4 in float32 (the two implementations order their float32 operations
differently; observed differences are ~1e-6).
"""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minispec import kernels, load_model
from minispec.model.config import ModelConfig
from minispec.testing import model_configs, seeds

transformers = pytest.importorskip("transformers", reason="transformers is the test-only reference (pip install -e .[test])")


def hf_model(cfg: ModelConfig, seed: int):
    kwargs = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    if cfg.model_type != "qwen2":  # Qwen2's config has neither: head_dim is derived, the biases implied
        kwargs.update(head_dim=cfg.head_dim, attention_bias=cfg.attention_bias)
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": s.factor,
                "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings}
    config_cls, cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[cfg.model_type]
    torch.manual_seed(seed)
    model = cls(config_cls(rope_parameters=rope, **kwargs)).eval()
    with torch.no_grad():  # HF initialises norms to exactly 1 and biases to 0: perturb both so they are tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@settings(max_examples=4)
@given(data=st.data(), seed=seeds)
def test_logits_match_transformers(family, data, seed, tmp_path_factory):
    cfg = data.draw(model_configs(model_types=(family,)), label="cfg")
    reference = hf_model(cfg, seed)
    folder = tmp_path_factory.mktemp("hf")
    reference.save_pretrained(folder)
    ours = load_model(folder)
    # every field read back from transformers' config.json, biases and head_dim included (the
    # special-token ids are HF's per-family defaults, not drawn)
    assert replace(ours.config, bos_token_id=None, eos_token_ids=()) == cfg
    ids = torch.randint(0, cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = reference(ids).logits
        got = ours(ids)
        assert (got - want).abs().max().item() <= 1e-4
        # with a cache, in two chunks: the second at an offset
        cache = ours.new_cache(2, 40)
        chunked = torch.cat([ours(ids[:, :20], cache), ours(ids[:, 20:], cache)], dim=1)
        assert (chunked - want).abs().max().item() <= 1e-4
        # and the fast path (minispec.kernels "fast": packed, fused weights) against the same reference
        optimized = kernels.apply(load_model(folder), "fast", checkpoint=folder)
        assert (optimized(ids) - want).abs().max().item() <= 1e-4
