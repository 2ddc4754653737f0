"""minispec.fast: the packed, fused rewrite computes the reference model's function.

float32: fast == reference within 1e-4 * max(1, |logits|) on random tiny Llama/Qwen3 configs
(GQA, QK-norm, attention bias, tied/untied heads, llama3 RoPE scaling), in one pass and through
the KV cache in chunks. oneDNN and the reference kernels sum in different orders, so the two
agree to float32 round-off (~1e-6 relative here), not bitwise. bfloat16: the fast path keeps
activations in float32, so on the real checkpoint it must be at least as close to the float32
reference as the bfloat16 reference path is.
"""

import copy

import pytest
import torch
from hypothesis import given, settings

from minispec import fast
from minispec.drafters import self_draft
from minispec.errors import MinispecError
from minispec.testing import model_configs, random_model, seeds, tiny_config


def _tolerance(want: torch.Tensor) -> float:
    return 1e-4 * max(1.0, want.abs().max().item())


@settings(max_examples=15, deadline=None)
@given(cfg=model_configs(), seed=seeds)
def test_fast_equals_reference_float32(cfg, seed):
    reference = random_model(cfg, seed, dtype=torch.float32)
    optimized = fast.optimize(copy.deepcopy(reference))
    ids = torch.randint(0, cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = reference(ids)  # [2, 13, V]
        assert (optimized(ids) - want).abs().max().item() <= _tolerance(want)
        cache = optimized.new_cache(2, 16)  # prefill, one decode step, a verify-sized chunk
        chunks = [optimized(ids[:, :7], cache), optimized(ids[:, 7:8], cache), optimized(ids[:, 8:], cache)]
        assert (torch.cat(chunks, dim=1) - want).abs().max().item() <= _tolerance(want)
        cache.truncate(9)  # roll back and re-feed: the same rows again
        assert (optimized(ids[:, 9:], cache) - want[:, 9:]).abs().max().item() <= _tolerance(want)


def test_fast_bfloat16_is_at_least_as_close_to_float32_as_the_reference_bfloat16(real_ckpt, real_model, real_tokenizer):
    from minispec import load_model

    ids = torch.tensor([real_tokenizer.encode("The Roman Empire began when Augustus became the first emperor, and")])
    with torch.no_grad():
        want = real_model(ids).double()
        ref_bf16 = load_model(real_ckpt, dtype=torch.bfloat16)
        err_reference = (ref_bf16(ids).double() - want).abs().max().item()
        err_fast = (fast.optimize(ref_bf16)(ids).double() - want).abs().max().item()
    assert err_fast <= err_reference, (err_fast, err_reference)


def test_optimize_refuses_float64_with_one_clear_line():
    model = random_model(tiny_config(), 0, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"dtype torch.float64; expected float32 or bfloat16"):
        fast.optimize(model)


def test_optimize_is_idempotent_and_self_draft_needs_the_unoptimized_target():
    model = fast.optimize(random_model(tiny_config(), 0, dtype=torch.float32))
    assert fast.optimize(model) is model
    with pytest.raises(MinispecError, match="build the self-draft first"):
        self_draft(model, "bf16")


@pytest.mark.parametrize("rows", [3, 40])  # the int8 kernel (<= 32 rows) and the dequantized GEMM
def test_int8_linear_is_within_its_quantization_bound(rows):
    """|y_int8 - x W^T| <= sum|x| * s/2 (rounding W to the grid s) + bf16 rounding of s, q*s and y."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 48, generator=gen)  # [out, in]
    x = torch.randn(rows, 48, generator=gen).to(torch.bfloat16).float()  # exactly representable in bf16
    layer = fast.Int8Linear(weight, None)
    got = layer(x).double()  # [rows, 40]
    want = x.double() @ weight.double().T
    scale = weight.abs().amax(dim=1).double() / 127  # [40]
    grid = x.abs().double().sum(-1, keepdim=True) * scale / 2  # [rows, 40]
    magnitude = x.abs().double() @ weight.abs().double().T  # [rows, 40]: sum |x_i| |W_ji|
    rounding = (magnitude + want.abs() + grid) * 2 ** -7  # bf16 (2^-9 per rounding), with room
    assert ((got - want).abs() <= grid + rounding).all()
    assert layer.qweight.dtype == torch.int8 and layer.qweight.abs().max() == 127


def test_int8_linear_refuses_widths_its_kernel_gets_wrong():
    """torch._weight_int8pack_mm with bf16 input silently returns garbage unless in % 16 == 0."""
    with pytest.raises(ValueError, match="in_features = 24; expected a multiple of 16"):
        fast.Int8Linear(torch.randn(40, 24), None)
