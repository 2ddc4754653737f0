"""kernels/fbgemm.py: the fp16 and int8-dynamic kinds. Each is a lossy rewrite, so the checks are
its error bound against the reference model, the rewrite's bookkeeping, and that the torch API it
rests on (deprecated quantized-tensor constructors included) is still there."""

import warnings

import pytest
import torch

from minispec import kernels
from minispec.errors import MinispecError
from minispec.kernels import fbgemm
from minispec.testing import random_model, tiny_config

pytestmark = pytest.mark.skipif(not fbgemm.available(), reason="this torch build has no fbgemm (not an x86 build)")


def test_the_torch_api_the_kinds_rest_on_is_there():
    """Fails the day torch drops the ops or the per-channel qint8 constructor (module docstring)."""
    for op in fbgemm.OPS:
        assert hasattr(torch.ops.quantized, op), op
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(torch.ones(2, 4), torch.ones(2, dtype=torch.double),
                                       torch.zeros(2, dtype=torch.long), 0, torch.qint8)
    assert q.dtype == torch.qint8


@pytest.mark.parametrize("layer, bound", [(fbgemm.Fp16Linear, 2e-3), (fbgemm.DynamicInt8Linear, 4e-2)])
def test_each_linear_layer_is_close_to_the_float32_matmul(layer, bound):
    """fp16 weights: relative error ~2^-11 per weight; int8 weights and activations: ~1/127 each.
    The bound is on max |y - y_ref| / max |y_ref| over random [N, in] inputs, N = 1..9 rows."""
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(48, 32, generator=generator), torch.randn(48, generator=generator)
    linear = layer(weight, bias)
    for rows in (1, 3, 9):
        x = torch.randn(2, rows, 32, generator=generator)
        want = x @ weight.T + bias  # [2, rows, 48]
        got = linear(x)
        assert got.shape == want.shape and got.dtype == torch.float32
        assert (got - want).abs().max() / want.abs().max() < bound


@pytest.mark.parametrize("kind", ["fp16", "int8-dynamic"])
def test_the_kinds_rewrite_a_model_and_stay_close_to_it(kind):
    model = random_model(tiny_config(), 0, dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        want = model(ids, model.new_cache(1, 16))  # [1, 5, V]
        assert kernels.apply(model, kind) is model and kernels.kind_of(model) == kind
        got = model(ids, model.new_cache(1, 16))
    assert (got - want).abs().max() / want.abs().max() < (0.01 if kind == "fp16" else 0.1)
    with pytest.raises(MinispecError, match=f"already rewritten to '{kind}'"):
        kernels.apply(model, "fast")


def test_a_cpu_without_fbgemm_is_one_line(monkeypatch):
    monkeypatch.setattr(fbgemm, "available", lambda: False)
    with pytest.raises(MinispecError, match=r"^kind='fp16': this torch build or CPU has no fbgemm"):
        kernels.apply(random_model(tiny_config(), 0, dtype=torch.float32), "fp16")


def test_fp16_rounds_each_row_alone_and_int8_dynamic_by_the_whole_call():
    """What the module docstring says about rows: a verify pass of k rows gives each row of fp16
    what a one-row step would (to float32 summation order, 1e-5 of the output scale), while
    int8-dynamic's one activation scale per call lets a large row change the others."""
    torch.manual_seed(0)
    weight = torch.randn(64, 32)
    x = torch.randn(4, 32)
    x[3] *= 20  # one row of larger range: int8-dynamic's per-call scale grows with it
    fp16, int8 = fbgemm.Fp16Linear(weight, None), fbgemm.DynamicInt8Linear(weight, None)
    alone = torch.cat([fp16(x[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(fp16(x), alone, rtol=0, atol=1e-5 * alone.abs().max().item())
    first_alone, first_beside = int8(x[:1]), int8(x)[:1]
    assert (first_alone - first_beside).abs().max() > 0.05 * first_alone.abs().max()
