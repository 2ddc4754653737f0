"""Hypothesis strategies for tiny random Llama / Qwen2 / Qwen3 models, prompts and seeds.

Configs are drawn shape-first: the number of kv heads and the group size first, then
num_heads = kv_heads * groups, an even head_dim, and only then the widths that depend on them.
Weights come from a drawn seed through a torch.Generator, so a failing example shrinks and
replays deterministically.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from minispec.model.config import ModelConfig, RopeScaling
from minispec.model.transformer import Transformer


@st.composite
def model_configs(draw, model_types=("llama", "qwen2", "qwen3"), max_layers: int = 2,
                  vocab_size: int | None = None) -> ModelConfig:
    """A tiny ModelConfig: GQA ratios 1-3, head_dim 4-16, optional llama3 RoPE scaling,
    q/k/v biases for qwen2, QK-norm for qwen3, tied or untied LM head, optional attention bias
    (qwen3)."""
    model_type = draw(st.sampled_from(model_types))
    num_kv_heads = draw(st.integers(1, 2))
    num_heads = num_kv_heads * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    # Llama and Qwen2 checkpoints have hidden_size = num_heads * head_dim (Llama: transformers
    # insists; Qwen2: its config has no head_dim); Qwen3 sets head_dim explicitly, so its
    # hidden_size is free.
    hidden_size = draw(st.sampled_from([16, 24, 32])) if model_type == "qwen3" else num_heads * head_dim
    scaling = None
    if draw(st.booleans()):
        low = draw(st.sampled_from([1.0, 2.0]))
        scaling = RopeScaling(factor=draw(st.sampled_from([2.0, 8.0])), low_freq_factor=low,
                              high_freq_factor=low * 4, original_max_position_embeddings=draw(st.sampled_from([16, 64])))
    return ModelConfig(
        model_type=model_type,
        vocab_size=vocab_size or draw(st.integers(8, 48)),
        hidden_size=hidden_size,
        intermediate_size=draw(st.sampled_from([8, 24, 40])),
        num_layers=draw(st.integers(1, max_layers)),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        rope_theta=draw(st.sampled_from([100.0, 10000.0])),
        rope_scaling=scaling,
        max_position_embeddings=128,
        tie_word_embeddings=draw(st.booleans()),
        qk_norm=model_type == "qwen3",
        attention_bias=draw(st.booleans()) if model_type == "qwen3" else False,
        qkv_bias=model_type == "qwen2",
    )


def tiny_config(**overrides) -> ModelConfig:
    """One fixed tiny Llama config (GQA 2:1, llama3 RoPE scaling off), for example-based tests."""
    fields = dict(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
                  rope_scaling=None, max_position_embeddings=128, tie_word_embeddings=False, qk_norm=False)
    fields.update(overrides)
    return ModelConfig(**fields)


def random_model(config: ModelConfig, seed: int, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> Transformer:
    """A Transformer whose every weight is drawn from a generator seeded with `seed`.

    Linear weights ~ N(0, scale^2 / fan_in) so activations stay O(1); norm weights ~ 1 + N(0, 0.1^2)
    so the norms are exercised (all-ones would hide a missing norm weight). `scale` > 1 gives
    peakier next-token distributions.
    """
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif param.dim() == 1:  # biases
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * scale / param.shape[-1] ** 0.5)
    return model.to(dtype).eval().requires_grad_(False)


def token_lists(vocab_size: int, min_size: int = 1, max_size: int = 24):
    """Lists of token ids in [0, vocab_size)."""
    return st.lists(st.integers(0, vocab_size - 1), min_size=min_size, max_size=max_size)


seeds = st.integers(0, 2**31 - 1)


@st.composite
def loop_setups(draw, max_layers: int = 2):
    """(config, seed, prompt) for a run of the loop: a random tiny model's config, a seed for its
    weights, and a prompt over the first 6 ids (repetitive, so an n-gram drafter finds matches)."""
    cfg = draw(model_configs(max_layers=max_layers))
    seed = draw(seeds)
    prompt = draw(st.lists(st.integers(0, min(cfg.vocab_size, 6) - 1), min_size=1, max_size=16))
    return cfg, seed, prompt
