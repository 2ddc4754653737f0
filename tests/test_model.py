"""Properties of the model and its KV cache on random tiny Llama / Qwen2 / Qwen3 models, in float64.

float64 because these are exactness properties: a chunked pass and a full pass run different
matmul shapes, whose float32 round-off differs at ~1e-6; in float64 the same mistake would
still show up, while the round-off shrinks to ~1e-14. Tolerance: 1e-9 absolute on logits.
"""

import pytest
import torch
from hypothesis import given, strategies as st

from minispec.errors import CacheOverflowError
from minispec.model.kv_cache import KVCache
from minispec.testing import make_cache_machine, model_configs, random_model, seeds, tiny_config

ATOL = 1e-9


def full_logits(model, tokens):
    return model(torch.tensor([tokens]))[0]  # [T, V]


@given(cfg=model_configs(), seed=seeds, data=st.data())
def test_chunked_prefill_equals_full_forward(cfg, seed, data):
    model = random_model(cfg, seed)
    tokens = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=1, max_size=20), label="tokens")
    cuts = sorted(data.draw(st.sets(st.integers(1, len(tokens) - 1), max_size=4), label="cuts")) if len(tokens) > 1 else []
    cache = model.new_cache(1, 32)
    pieces = []
    for a, b in zip([0] + cuts, cuts + [len(tokens)]):
        pieces.append(model(torch.tensor([tokens[a:b]]), cache)[0])
    assert cache.length == len(tokens)
    torch.testing.assert_close(torch.cat(pieces), full_logits(model, tokens), atol=ATOL, rtol=0)


@given(cfg=model_configs(), seed=seeds, data=st.data())
def test_truncate_then_refeed_equals_never_fed(cfg, seed, data):
    model = random_model(cfg, seed)
    vocab = st.integers(0, cfg.vocab_size - 1)
    prefix = data.draw(st.lists(vocab, min_size=1, max_size=12), label="prefix")
    rejected = data.draw(st.lists(vocab, min_size=1, max_size=6), label="rejected")
    accepted = data.draw(st.lists(vocab, min_size=1, max_size=6), label="accepted")
    cache = model.new_cache(1, 32)
    model(torch.tensor([prefix]), cache)
    model(torch.tensor([rejected]), cache)
    cache.truncate(len(prefix))
    got = model(torch.tensor([accepted]), cache)[0]
    torch.testing.assert_close(got, full_logits(model, prefix + accepted)[len(prefix):], atol=ATOL, rtol=0)


@given(cfg=model_configs(), seed=seeds, data=st.data())
def test_early_exit_through_its_own_smaller_cache_equals_a_full_early_exit_pass(cfg, seed, data):
    model = random_model(cfg, seed)
    n = data.draw(st.integers(1, cfg.num_layers), label="num_layers")
    tokens = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=2, max_size=12), label="tokens")
    cut = data.draw(st.integers(1, len(tokens) - 1), label="cut")
    cache = model.new_cache(1, 16, num_layers=n)  # what an early-exit draft with its own cache holds
    assert cache.num_layers == n
    pieces = [model.forward_hidden(torch.tensor([part]), cache, num_layers=n)[0] for part in (tokens[:cut], tokens[cut:])]
    want = model.forward_hidden(torch.tensor([tokens]), num_layers=n)[0]  # [T, d]
    torch.testing.assert_close(torch.cat(pieces), want, atol=ATOL, rtol=0)


@given(cfg=model_configs(), seed=seeds)
def test_batch_rows_are_independent(cfg, seed):
    model = random_model(cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (3, 7), generator=gen)
    both = model(ids)
    for b in range(3):
        torch.testing.assert_close(both[b], model(ids[b:b + 1])[0], atol=ATOL, rtol=0)


def test_hidden_state_is_lm_head_input():
    cfg = tiny_config()
    model = random_model(cfg, 0)
    ids = torch.tensor([[1, 2, 3]])
    logits, hidden = model(ids, return_hidden=True)
    assert hidden.shape == (1, 3, cfg.hidden_size)
    torch.testing.assert_close(logits, hidden @ model.lm_head.weight.T, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_runs_in_each_dtype(dtype):
    cfg = tiny_config(model_type="qwen3", qk_norm=True)
    model = random_model(cfg, 0, dtype=dtype)
    cache = model.new_cache(1, 8)
    logits = model(torch.tensor([[1, 2, 3]]), cache)
    assert logits.dtype == dtype and cache.k[0].dtype == dtype
    assert torch.isfinite(logits).all()


def test_qwen2_has_biases_on_q_k_v_only():
    attn = random_model(tiny_config(model_type="qwen2", qkv_bias=True), 0).layers[0].self_attn
    assert all(proj.bias is not None for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert attn.o_proj.bias is None and attn.q_norm is None


def test_writing_past_max_seq_len_is_an_error_not_corruption():
    model = random_model(tiny_config(), 0)
    cache = model.new_cache(1, 5)
    model(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(CacheOverflowError, match="max_seq_len=5"):
        model(torch.tensor([[1, 2, 3]]), cache)
    assert cache.length == 3  # nothing was half-written into the valid region


# The stateful test: append / verify-sized chunks / truncate, every output compared with a
# from-scratch forward (the machine lives in minispec.testing so users can run it on their caches).
test_cache_state_machine = make_cache_machine(KVCache).TestCase


def naive_attention_logits(model, tokens):
    """The whole model written out with explicit loops over heads: an oracle independent of
    SDPA's GQA mapping and of our mask builder (query head h reads kv head h // num_kv_groups)."""
    import torch.nn.functional as F

    from minispec.model.transformer import apply_rope, rope_cos_sin

    cfg = model.config
    T = len(tokens)
    cos, sin = rope_cos_sin(torch.arange(T), model._inv_freq, model.dtype)
    x = model.embed_tokens(torch.tensor([tokens]))  # [1, T, d]
    for block in model.layers:
        attn, h = block.self_attn, block.input_layernorm(x)
        q = attn.q_proj(h).view(1, T, cfg.num_heads, cfg.head_dim)
        k = attn.k_proj(h).view(1, T, cfg.num_kv_heads, cfg.head_dim)
        v = attn.v_proj(h).view(1, T, cfg.num_kv_heads, cfg.head_dim)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)  # [1, H, T, hd]
        v = v.transpose(1, 2)
        heads = []
        for head in range(cfg.num_heads):
            kv = head // cfg.num_kv_groups
            scores = q[0, head] @ k[0, kv].T / cfg.head_dim ** 0.5  # [T, T]
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            heads.append(F.softmax(scores, dim=-1) @ v[0, kv])  # [T, hd]
        x = x + attn.o_proj(torch.cat(heads, dim=-1)[None])
        x = x + block.mlp(block.post_attention_layernorm(x))
    return model.head(model.norm(x))[0]


@given(cfg=model_configs(), seed=seeds, data=st.data())
def test_model_equals_a_naive_per_head_reference(cfg, seed, data):
    model = random_model(cfg, seed)
    tokens = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=1, max_size=12), label="tokens")
    torch.testing.assert_close(full_logits(model, tokens), naive_attention_logits(model, tokens), atol=ATOL, rtol=0)
