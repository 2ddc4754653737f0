"""kernels/nf4.py: the nf4 kind. A lossy rewrite, so the checks are its definition (the levels, the
nearest-level rounding, the kernel's layout, each against an oracle that does not share the code:
the library's own dequantization, a brute-force argmin, a float64 matmul), the rows property
its docstring claims (a verify pass = one-row steps, bit for bit, so speculative greedy = plain
greedy) and the one-line refusals."""

import ctypes

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec import kernels
from minispec.decode import generate
from minispec.errors import MinispecError
from minispec.kernels import nf4
from minispec.testing import random_model, seeds, tiny_config

runs_here = pytest.mark.skipif(not nf4.available(), reason="no bitsandbytes, or a CPU without AVX512-BF16")
# every fused and single projection a multiple of the kernel's 32-row tiles and 64-weight blocks
CONFIG = tiny_config(model_type="qwen2", qkv_bias=True, vocab_size=64, hidden_size=64, intermediate_size=64,
                     num_heads=4, num_kv_heads=2, head_dim=16)  # Qwen2's q/k/v biases: the pair's models have them


def library_dequantize(indices: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    """The library's own NF4 dequantization (its standard layout: two indices a byte, the first in the
    high nibble; one float32 maximum per 64 consecutive weights): an oracle independent of `nf4.LEVELS`."""
    flat = indices.reshape(-1)
    packed = (flat[0::2] << 4 | flat[1::2]).contiguous()
    maxima = maxima.reshape(-1).float().contiguous()
    out = torch.empty(flat.numel())
    nf4.library().cdequantize_blockwise_cpu_nf4_fp32(
        ctypes.c_void_p(packed.data_ptr()), ctypes.c_void_p(maxima.data_ptr()), ctypes.c_void_p(out.data_ptr()),
        ctypes.c_longlong(nf4.BLOCK), ctypes.c_longlong(indices.shape[0]), ctypes.c_longlong(indices.shape[1]))
    return out.reshape(indices.shape)


@runs_here
def test_the_levels_are_the_librarys():
    """LEVELS, computed from the normal quantiles, equal the table the kernel multiplies by, to one
    float32 rounding (the library stores its table in float32 decimals)."""
    indices = torch.arange(16, dtype=torch.uint8).repeat(4).reshape(1, 64)
    theirs = library_dequantize(indices, torch.ones(1, 1))[0, :16]
    torch.testing.assert_close(nf4.LEVELS, theirs, rtol=0, atol=2 ** -23)
    assert nf4.LEVELS[0] == -1 and nf4.LEVELS[7] == 0 and nf4.LEVELS[15] == 1
    assert torch.all(nf4.LEVELS[1:] > nf4.LEVELS[:-1])


@settings(deadline=None, max_examples=30)
@given(seed=seeds, rows=st.integers(1, 4), blocks=st.integers(1, 3), scale=st.floats(1e-3, 1e3))
def test_quantize_picks_the_nearest_level_of_each_blocks_maximum(seed, rows, blocks, scale):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, blocks * nf4.BLOCK, generator=generator) * scale
    weight[0, :nf4.BLOCK] = 0  # a block of zeros: maximum 0, every weight 0
    indices, maxima = nf4.quantize(weight)
    assert indices.dtype == torch.uint8 and indices.shape == weight.shape and maxima.shape == (rows, blocks)
    blockwise = weight.reshape(rows, blocks, nf4.BLOCK)
    assert torch.equal(maxima, blockwise.abs().amax(-1))
    scaled = (blockwise / maxima.clamp(min=1e-30)[..., None]).reshape(rows, -1).double()  # [rows, in]
    distance = (scaled[..., None] - nf4.LEVELS.double()).abs()  # [rows, in, 16]
    chosen = distance.gather(-1, indices.long()[..., None])[..., 0]
    assert torch.all(chosen <= distance.min(-1).values + 1e-6)  # nearest, up to a float32 tie at a midpoint
    assert torch.all(nf4.dequantize(indices, maxima)[0, :nf4.BLOCK] == 0)


@runs_here
@settings(deadline=None, max_examples=20)
@given(seed=seeds, tiles=st.integers(1, 3), blocks=st.integers(1, 3))
def test_the_layer_multiplies_by_the_dequantized_weight(seed, tiles, blocks):
    """Nf4Linear's weight is quantize's through the kernel's layout and back, with the kernel's
    bfloat16 levels (quantize's own dequantization checked against the library's), and
    y = bf16(x) @ W^T + b up to the kernel's float32 sums and its bfloat16 result (half a unit in
    the last place, <= 2^-8 |y|): |error| <= 2^-8 |y| + 2^-16 sum |x||W|."""
    generator = torch.Generator().manual_seed(seed)
    out_features, in_features = tiles * nf4.TILE, blocks * nf4.BLOCK
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    layer = nf4.Nf4Linear(weight, bias)
    indices, maxima = nf4.quantize(weight)
    rounded = maxima.to(torch.bfloat16).float()  # the kernel takes the maxima in bfloat16
    assert torch.equal(layer.weight(), nf4.dequantize(indices, rounded, nf4.KERNEL_LEVELS))
    # to a few float32 roundings: the two tables differ by one rounding, the products by their own
    torch.testing.assert_close(nf4.dequantize(indices, rounded), library_dequantize(indices, rounded),
                               rtol=2 ** -20, atol=0)
    x = torch.randn(5, in_features, generator=generator)
    xb = x.to(torch.bfloat16).double()
    want = xb @ layer.weight().double().T  # [5, out]
    bound = 2 ** -8 * want.abs() + 2 ** -16 * (xb.abs() @ layer.weight().double().abs().T)
    got = layer(x) - bias
    assert got.dtype == torch.float32 and torch.all((got.double() - want).abs() <= bound + 1e-6)


@runs_here
@settings(deadline=None, max_examples=10)
@given(seed=seeds, rows=st.integers(2, 9))
def test_each_row_is_what_a_one_row_step_gives_it(seed, rows):
    """The kernel computes each row of x on its own: k rows at once = k one-row calls, bit for bit."""
    generator = torch.Generator().manual_seed(seed)
    layer = nf4.Nf4Linear(torch.randn(64, 128, generator=generator), None)
    x = torch.randn(rows, 128, generator=generator) * torch.logspace(-2, 2, rows)[:, None]
    assert torch.equal(layer(x), torch.cat([layer(x[i:i + 1]) for i in range(rows)]))


@runs_here
@settings(deadline=None, max_examples=10)
@given(seed=seeds, gamma=st.integers(1, 5))
def test_a_speculative_nf4_target_gives_its_own_plain_greedy_output(seed, gamma):
    target = kernels.apply(random_model(CONFIG, seed, dtype=torch.float32, scale=3.0), "nf4")
    draft = random_model(CONFIG, seed + 1, dtype=torch.float32)
    prompt = [3, 1, 4, 1, 5]
    plain = generate(target, prompt, max_new_tokens=16, eos_token_ids=[])
    speculative = generate(target, prompt, max_new_tokens=16, eos_token_ids=[], draft=draft, gamma=gamma)
    assert speculative.tokens == plain.tokens


@runs_here
def test_the_kind_is_the_model_with_each_weight_replaced_by_its_nf4_weight():
    """Blocks run along a row, so quantizing a fused projection = quantizing its parts: the nf4 model
    is the reference model whose every linear weight is nf4's (kernel levels, bfloat16 maxima),
    up to the bfloat16 rounding of each matmul's input and output (2^-9 relative each, seven
    matmuls a layer, two layers: 2% of the logits' scale), and much further from the original."""
    model = random_model(CONFIG, 0, dtype=torch.float32)
    nf4_weights = random_model(CONFIG, 0, dtype=torch.float32)
    with torch.no_grad():
        for module in nf4_weights.modules():
            if isinstance(module, torch.nn.Linear):
                indices, maxima = nf4.quantize(module.weight)
                module.weight.copy_(nf4.dequantize(indices, maxima.to(torch.bfloat16).float(), nf4.KERNEL_LEVELS))
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        original, want = model(ids), nf4_weights(ids)  # [1, 5, V]
        assert kernels.apply(model, "nf4") is model and kernels.kind_of(model) == "nf4"
        got = model(ids)
    scale = want.abs().max()
    assert (got - want).abs().max() < 0.02 * scale < (original - want).abs().max()


def test_sizes_the_kernel_cannot_take_are_one_line_before_any_change(monkeypatch):
    monkeypatch.setattr(nf4, "available", lambda: True)  # the size check must not depend on this CPU
    model = random_model(tiny_config(), 0, dtype=torch.float32)  # hidden 16: not a multiple of 64
    layers = list(model.layers)
    with pytest.raises(MinispecError, match=r"^kind='nf4': the fused q/k/v projection is \[64, 16\] \(\[out, in\]\); "
                                            r"expected out a multiple of 32 and in a multiple of 64"):
        kernels.apply(model, "nf4")
    assert kernels.kind_of(model) == "reference" and list(model.layers) == layers
    with pytest.raises(MinispecError, match=r"^kind='nf4': a linear layer is \[33, 64\]"):
        nf4.Nf4Linear(torch.ones(33, 64), None)


def test_a_cpu_or_install_without_the_kernel_is_one_line(monkeypatch):
    monkeypatch.setattr(nf4, "available", lambda: False)
    with pytest.raises(MinispecError, match=r"^kind='nf4': needs bitsandbytes \(pip install 'minispec\[nf4\]'\)"):
        kernels.apply(random_model(CONFIG, 0, dtype=torch.float32), "nf4")


@pytest.fixture(scope="module")
def compiled_pair():
    """An nf4 model and the same weights as nf4-compiled, warmed up for 5-row verify passes."""
    from torch._dynamo.utils import counters

    counters.clear()
    reference = random_model(CONFIG, 0, dtype=torch.float32, scale=3.0)
    eager = kernels.apply(random_model(CONFIG, 0, dtype=torch.float32, scale=3.0), "nf4")
    model = kernels.apply(reference, "nf4-compiled")
    kernels.compiled.warm_up(model, verify_rows=(5,))
    return eager, model


@runs_here
def test_nf4_compiled_is_nf4_with_the_steps_compiled(compiled_pair):
    """The same kernel calls on the same tiles; only the glue between them is compiled, which sums in
    another order (float32, ~1e-6 relative) and may so move a matmul input across a bfloat16 rounding
    boundary: one bfloat16 step (2^-8 relative) on an element, far below 2% of the logits' scale."""
    eager, model = compiled_pair
    assert kernels.kind_of(model) == "nf4-compiled"
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 3, 8, 1, 6, 2]])
    with torch.inference_mode():
        want = eager(ids)  # [1, 11, V]
        cache = model.new_cache(1, 16)
        got = torch.cat([model(ids[:, :5], cache), model(ids[:, 5:6], cache), model(ids[:, 6:11], cache)], 1)
    assert (got - want).abs().max() < 0.02 * want.abs().max()

    from torch._dynamo.utils import counters

    assert not counters["graph_break"]  # the kernel call is one opaque op inside the graph, not a break out of it


@runs_here
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_speculative_nf4_compiled_target_gives_its_own_plain_greedy_output(compiled_pair, seed):
    _, model = compiled_pair
    prompt = torch.randint(0, CONFIG.vocab_size, (8,), generator=torch.Generator().manual_seed(seed)).tolist() * 2
    plain = generate(model, prompt, max_new_tokens=16, eos_token_ids=[])
    speculative = generate(model, prompt, max_new_tokens=16, eos_token_ids=[], draft="ngram", gamma=4)
    assert speculative.tokens == plain.tokens


@runs_here
def test_a_draft_model_warmed_as_the_command_warms_it_compiles_nothing_while_it_drafts():
    """kernels.compiled.DRAFT_ROWS covers every pass a draft model runs in the loop (one-row steps, and
    2 rows after a step that kept every draft): nothing compiles during generation (a missed shape
    recompiled for tens of seconds inside the timed decode)."""
    from torch._dynamo.utils import counters

    from minispec import make_drafter

    target = kernels.apply(random_model(CONFIG, 0, dtype=torch.float32, scale=3.0), "nf4")
    draft = kernels.apply(random_model(CONFIG, 0, dtype=torch.float32, scale=3.0), "nf4-compiled")  # same weights
    kernels.compiled.warm_up(draft, verify_rows=kernels.compiled.DRAFT_ROWS)
    compiled_before = counters["stats"]["unique_graphs"]
    out = generate(target, [1, 5, 9, 2, 7], max_new_tokens=24, eos_token_ids=[], draft=make_drafter(draft, target),
                   gamma=3)
    assert out.stats["tau"] > 2  # the draft's own weights: most steps keep every draft, so 2-row passes ran
    assert counters["stats"]["unique_graphs"] == compiled_before


def test_nf4_compiled_without_a_compiler_is_one_line_before_any_change(monkeypatch):
    monkeypatch.setattr(nf4, "available", lambda: True)
    monkeypatch.setattr(kernels.compiled.shutil, "which", lambda name: None)
    model = random_model(CONFIG, 0, dtype=torch.float32)
    with pytest.raises(MinispecError, match="^kind='nf4-compiled': TorchInductor needs a C\\+\\+ compiler"):
        kernels.apply(model, "nf4-compiled")
    assert kernels.kind_of(model) == "reference"


@pytest.mark.parametrize("available", [True, False])
def test_dtype_auto_picks_nf4_for_large_targets_whose_sizes_fit_where_it_runs(monkeypatch, available):
    """kernels.auto_weights: nf4 (loaded in float32) exactly where the kernel runs, every projection is
    a multiple of its 32-row tiles and 64-weight blocks, and the linear layers hold >= 1e9 weights
    (counted here by hand: layers x (q, k, v, o, gate, up, down) + the head); else auto_dtype and "auto"."""
    monkeypatch.setattr(nf4, "available", lambda: available)
    want_else = (kernels.auto_dtype(), "auto")
    for layers, hidden, inter, vocab, heads, kv in ((28, 1536, 8960, 151936, 12, 2),  # the 1.5B: 1.54e9
                                                    (24, 896, 4864, 151936, 14, 2),  # the 0.5B: 0.49e9
                                                    (40, 1536, 8960, 151936, 12, 2),
                                                    (28, 1536, 8960 + 32, 151936, 12, 2),  # gate/up fit, down's in does not
                                                    (28, 1536, 8960, 151936 + 16, 12, 2)):  # the head's rows do not
        config = tiny_config(num_layers=layers, hidden_size=hidden, intermediate_size=inter, vocab_size=vocab,
                             num_heads=heads, num_kv_heads=kv, head_dim=128)
        weights = vocab * hidden + layers * hidden * (heads * 128 + 2 * kv * 128 + heads * 128 + 3 * inter)
        fit = inter % 64 == 0 and vocab % 32 == 0
        want = (torch.float32, "nf4") if available and fit and weights >= 10**9 else want_else
        assert kernels.auto_weights(config) == want, (layers, hidden, inter, vocab)


@pytest.mark.parametrize("available", [True, False], ids=["kernel", "no-kernel"])
def test_a_draft_beside_a_four_bit_target_is_four_bit_where_its_sizes_fit(monkeypatch, available):
    """kernels.auto_draft_kind: beside an nf4 or nf4-compiled target, a draft model whose projections the
    kernel takes runs nf4; a draft it cannot take, or one beside any other target, gets the 16-bit
    choice it gets without the nf4 rule (the same call, target 'fast')."""
    monkeypatch.setattr(nf4, "available", lambda: available)
    fitting = random_model(CONFIG, 0, dtype=torch.float32)
    odd = random_model(tiny_config(vocab_size=64, hidden_size=48, intermediate_size=64, num_heads=4,
                                   num_kv_heads=2, head_dim=12), 0, dtype=torch.float32)  # 48-weight rows
    assert not nf4.fits(odd.config)
    for model in (fitting, odd):
        sixteen_bit = kernels.auto_draft_kind(model, "fast")
        assert sixteen_bit in ("fast", "fp16", "reference")
        for target in ("nf4", "nf4-compiled"):
            want = "nf4" if available and model is fitting else sixteen_bit
            assert kernels.auto_draft_kind(model, target) == want, (target, model is fitting)
        for target in ("reference", "fast", "compiled", "fp16", "int8-dynamic"):
            assert kernels.auto_draft_kind(model, target) == sixteen_bit


@settings(max_examples=20, deadline=None)
@given(layers=st.integers(1, 3), kv=st.sampled_from([1, 2]), group=st.integers(1, 3), head_dim=st.sampled_from([8, 16]),
       inter=st.integers(1, 5), vocab=st.integers(8, 40), tied=st.booleans())
def test_linear_weights_counts_every_linear_layer_of_the_model_once(layers, kv, group, head_dim, inter, vocab, tied):
    """nf4.linear_weights(config) is what its docstring says, counted on a built model instead of from
    the config: every nn.Linear's weight (q, k, v, o, gate, up, down and the LM head, a tied head too,
    since nf4 rounds it), each shared tensor once. The 1e9 rule of --dtype auto reads this count."""
    heads = kv * group
    config = tiny_config(num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                         hidden_size=heads * head_dim, intermediate_size=16 * inter, vocab_size=vocab,
                         tie_word_embeddings=tied)
    model = random_model(config, 0, dtype=torch.float32)
    linear = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert nf4.linear_weights(model.config) == sum(linear.values())
