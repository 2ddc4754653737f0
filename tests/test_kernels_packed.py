"""minispec.kernels: the fast rewrite computes the reference model's function; apply's contract.

float32: fast == reference within 1e-4 * max(1, |logits|) on random tiny Llama/Qwen3 configs
(GQA, QK-norm, attention bias, tied/untied heads, llama3 RoPE scaling), in one pass and through
the KV cache in chunks. oneDNN and the reference kernels sum in different orders, so the two
agree to float32 round-off, not bitwise. bfloat16: the fast kind keeps activations in float32,
so on the real checkpoint it must be at least as close to the float32 reference as the
bfloat16 reference path is. The int8 kind is lossy: its layer is held to its quantization bound.
"""

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from minispec import kernels, load_model
from minispec.chain.drafters import ModelDrafter, NgramDrafter, self_draft
from minispec.errors import MinispecError
from minispec.kernels import packed
from minispec.kernels.int8 import Int8Linear
from minispec.batch.ragged_cache import RaggedKVCache
from minispec.testing import model_configs, random_model, seeds, tiny_config

NEEDS_BF16_PACKING = pytest.mark.skipif(not packed.packs(torch.bfloat16),
                                        reason="this CPU's oneDNN has no packed bfloat16 matmul "
                                               "(no AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")
from minispec.trees.tree import DraftTree, tree_mask, tree_positions

INT8_CONFIG = tiny_config(hidden_size=32, intermediate_size=48)  # widths the int8 kernel takes (multiples of 16)


def _tolerance(want: torch.Tensor) -> float:
    return 1e-4 * max(1.0, want.abs().max().item())


@settings(max_examples=15, deadline=None)
@given(cfg=model_configs(), seed=seeds, start=st.sampled_from([0, 1, 5]))
def test_fast_tree_passes_equal_the_reference_at_any_cache_length(cfg, seed, start):
    """A draft tree's pass (positions by depth, ancestors-only mask), also at cache length 0 where
    its mask is square like a prefill's, gives the reference's logits on the fast kernels."""
    reference = random_model(cfg, seed, dtype=torch.float32)
    fast = kernels.apply(copy.deepcopy(reference), "fast")
    tree = DraftTree([1, 2, 3, 4, 0], [-1, -1, 0, 0, 1], torch.zeros(5, cfg.vocab_size))
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, cfg.vocab_size, (1, start), generator=gen)
    ids = torch.tensor([[int(torch.randint(0, cfg.vocab_size, (1,), generator=gen))] + tree.tokens])  # [1, N+1]
    with torch.no_grad():
        outputs = []
        for model in (reference, fast):
            cache = model.new_cache(1, start + 8)
            if start:
                model(prefix, cache)
            outputs.append(model.head(model.forward_hidden(ids, cache, positions=tree_positions(tree, start),
                                                          mask=tree_mask(tree, start))))
    want, got = outputs
    assert (got - want).abs().max().item() <= _tolerance(want)


@settings(max_examples=15, deadline=None)
@given(cfg=model_configs(), seed=seeds, lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
       new=st.integers(1, 4))
def test_fast_ragged_batch_passes_equal_the_reference(cfg, seed, lengths, new):
    """A ragged batch (rows at their own lengths, per-row positions and [B, 1, T, S] mask) on the
    fast kernels: each row's logits are the reference's for that row alone."""
    reference = random_model(cfg, seed, dtype=torch.float32)
    fast = kernels.apply(copy.deepcopy(reference), "fast")
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, cfg.vocab_size, (n + new,), generator=gen).tolist() for n in lengths]
    with torch.no_grad():
        cache = fast.new_cache(len(rows), max(lengths) + new + 1, cache_class=RaggedKVCache)
        longest = max(lengths)
        fast(torch.tensor([r[:n] + [0] * (longest - n) for r, n in zip(rows, lengths)]), cache)  # padded prefill
        cache.truncate(lengths)
        got = fast(torch.tensor([r[n:] for r, n in zip(rows, lengths)]), cache)  # [B, new, V]
        for b, row in enumerate(rows):
            want = reference(torch.tensor([row]))[0, -new:]
            assert (got[b] - want).abs().max().item() <= _tolerance(want)


@settings(max_examples=15, deadline=None)
@given(cfg=model_configs(), seed=seeds)
def test_fast_equals_reference_float32(cfg, seed):
    reference = random_model(cfg, seed, dtype=torch.float32)
    fast = kernels.apply(copy.deepcopy(reference), "fast")
    ids = torch.randint(0, cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = reference(ids)  # [2, 13, V]
        assert (fast(ids) - want).abs().max().item() <= _tolerance(want)
        cache = fast.new_cache(2, 16)  # prefill, one decode step, a verify-sized chunk
        chunks = [fast(ids[:, :7], cache), fast(ids[:, 7:8], cache), fast(ids[:, 8:], cache)]
        assert (torch.cat(chunks, dim=1) - want).abs().max().item() <= _tolerance(want)
        cache.truncate(9)  # roll back and re-feed: the same rows again
        assert (fast(ids[:, 9:], cache) - want[:, 9:]).abs().max().item() <= _tolerance(want)


@NEEDS_BF16_PACKING
def test_fast_bfloat16_is_at_least_as_close_to_float32_as_the_reference_bfloat16(real_ckpt, real_model, real_tokenizer):
    ids = torch.tensor([real_tokenizer.encode("The Roman Empire began when Augustus became the first emperor, and")])
    with torch.no_grad():
        want = real_model(ids).double()
        ref_bf16 = load_model(real_ckpt, dtype=torch.bfloat16)
        err_reference = (ref_bf16(ids).double() - want).abs().max().item()
        # the embedding rows come from the float32 file, rounded to the model's bfloat16
        err_fast = (kernels.apply(ref_bf16, "fast", checkpoint=real_ckpt)(ids).double() - want).abs().max().item()
    assert err_fast <= err_reference, (err_fast, err_reference)


def test_the_real_fast_model_maps_its_embedding_and_matches_the_reference(real_model, real_fast_model, real_tokenizer):
    ids = torch.tensor([real_tokenizer.encode("Speculative decoding drafts cheaply and verifies in one pass.")])
    with torch.no_grad():
        want = real_model(ids)
        assert (real_fast_model(ids) - want).abs().max().item() <= _tolerance(want)


def _write_tiny_checkpoint(folder, model):
    cfg = model.config
    raw = {"model_type": "llama", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
           "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
           "tie_word_embeddings": True}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    state = {"model." + name: t.contiguous() for name, t in model.state_dict().items() if name != "lm_head.weight"}
    save_file(state, folder / "model.safetensors")


def test_a_mapped_embedding_gives_what_a_private_copy_gives_and_a_foreign_checkpoint_is_refused(tmp_path):
    cfg = tiny_config(tie_word_embeddings=True, hidden_size=32, intermediate_size=48)
    _write_tiny_checkpoint(tmp_path / "ckpt", random_model(cfg, 0, dtype=torch.float32))
    reference = load_model(tmp_path / "ckpt")
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        want = kernels.apply(copy.deepcopy(reference), "fast")(ids)  # private copy of the table
        got = kernels.apply(copy.deepcopy(reference), "fast", checkpoint=tmp_path / "ckpt")(ids)
    torch.testing.assert_close(got, want, atol=0, rtol=0)

    other = load_model(tmp_path / "ckpt")
    with torch.no_grad():
        other.embed_tokens.weight[0] += 1.0  # no longer the file's table
    with pytest.raises(MinispecError, match=r"^kind='fast': checkpoint=.* does not hold this model's embedding table"):
        kernels.apply(other, "fast", checkpoint=tmp_path / "ckpt")
    assert kernels.kind_of(other) == "reference"  # refused before anything changed


def test_apply_keeps_identity_and_an_early_exit_drafter_sees_the_rewrite():
    target = random_model(tiny_config(), 0, dtype=torch.float32)
    early_exit = ModelDrafter(target, num_layers=1, share_cache=True)
    assert kernels.apply(target, "fast") is target
    assert early_exit.model is target and kernels.kind_of(early_exit.model) == "fast"
    assert kernels.apply(target, "fast") is target  # the kind it has already: nothing to do
    kernels.apply_drafter(early_exit, "fast")  # the target is no longer a reference model: untouched
    assert kernels.kind_of(target) == "fast"


def test_apply_drafter_rewrites_only_a_separate_reference_draft_model():
    draft = ModelDrafter(random_model(tiny_config(), 1, dtype=torch.float32))
    kernels.apply_drafter(draft, "fast")
    assert kernels.kind_of(draft.model) == "fast"
    kernels.apply_drafter(NgramDrafter(vocab_size=32), "fast")  # no model: nothing to do

    target = random_model(INT8_CONFIG, 0, dtype=torch.float32)
    int8_draft = ModelDrafter(self_draft(target, "int8"))
    kernels.apply_drafter(int8_draft, "fast")
    assert kernels.kind_of(int8_draft.model) == "int8" and kernels.kind_of(target) == "reference"


@NEEDS_BF16_PACKING
def test_the_reference_model_keeps_its_dtype_everywhere_and_fast_computes_in_float32():
    model = random_model(tiny_config(), 0, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 2, 3]])
    assert kernels.kind_of(model) == "reference"
    cache = model.new_cache(1, 8)
    _, hidden = model(ids, cache, return_hidden=True)
    assert cache.k[0].dtype == hidden.dtype == torch.bfloat16
    kernels.apply(model, "fast")
    cache = model.new_cache(1, 8, num_layers=1)  # an early-exit draft's cache
    hidden = model.forward_hidden(ids, cache, num_layers=1)
    assert model.dtype == torch.bfloat16  # the weights' dtype, recorded
    assert cache.k[0].dtype == hidden.dtype == torch.float32 and cache.num_layers == 1


def test_self_draft_needs_the_reference_target():
    model = kernels.apply(random_model(tiny_config(), 0, dtype=torch.float32), "fast")
    with pytest.raises(MinispecError, match="build the self-draft first"):
        self_draft(model, "bf16")


def _one_line_error(model, kind, match, **kwargs):
    with pytest.raises(MinispecError, match=match) as err:
        kernels.apply(model, kind, **kwargs)
    assert "\n" not in str(err.value) and str(err.value).startswith("kind=")


@pytest.mark.parametrize("kind", ["fast", "compiled", "int8"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_apply_refuses_dtypes_without_kernels_and_leaves_the_model_as_it_was(kind, dtype):
    model = random_model(tiny_config(), 0, dtype=dtype)
    _one_line_error(model, kind, rf"^kind={kind!r}: the model is {dtype}; expected a float32 or bfloat16 model")
    assert kernels.kind_of(model) == "reference" and model.new_cache(1, 4).k[0].dtype == dtype


def test_apply_errors_name_the_flag_and_what_is_expected(monkeypatch):
    model = random_model(INT8_CONFIG, 0, dtype=torch.float32)
    _one_line_error(model, "turbo", r"^kind='turbo': unknown kind; expected one of reference, fast, compiled, int8")
    _one_line_error(copy.deepcopy(model).to("meta"), "fast", r"on meta; expected a CPU model")
    _one_line_error(kernels.apply(copy.deepcopy(model), "int8"), "fast",
                    r"^kind='fast': the model was already rewritten to 'int8'; expected a freshly loaded")
    _one_line_error(kernels.apply(copy.deepcopy(model), "fast"), "reference", r"already rewritten to 'fast'")
    model = random_model(tiny_config(), 0, dtype=torch.float32)
    _one_line_error(model, "int8", r"^kind='int8': intermediate_size = 24; expected a multiple of 16")
    monkeypatch.setattr(packed, "packed_kernels_available", lambda: False)
    _one_line_error(model, "fast", r"^kind='fast': this torch build has no oneDNN")
    assert kernels.kind_of(model) == "reference"


def test_a_dtype_this_cpu_cannot_pack_is_refused_and_auto_runs_it_as_fp16(monkeypatch):
    """oneDNN packs bfloat16 only on CPUs with the instructions its kernels need: elsewhere "fast" on a
    bfloat16 model is one line naming dtype=, and --kernels auto runs that model as fp16 (fbgemm) instead."""
    bf16 = random_model(tiny_config(), 0, dtype=torch.bfloat16)
    fp32 = random_model(tiny_config(), 0, dtype=torch.float32)
    monkeypatch.setattr(packed, "packs", lambda dtype: dtype == torch.float32)
    _one_line_error(bf16, "fast", r"^kind='fast': this CPU's oneDNN has no packed torch.bfloat16 matmul .*"
                                  r"expected dtype=float32, or kind='reference'$")
    assert kernels.kind_of(bf16) == "reference"
    assert kernels.auto_kind(fp32) == "fast"  # and bfloat16 runs as fp16 where fbgemm is, else as written
    assert kernels.auto_kind(bf16) == ("fp16" if kernels.fbgemm.available() else "reference")


def test_the_packing_probe_says_what_this_cpu_can_do():
    """float32 packs wherever oneDNN is; the bfloat16 answer is the CPU's, and it is what apply obeys."""
    assert packed.packs(torch.float32) == packed.packed_kernels_available()
    assert not packed.packs(torch.float64)
    model = random_model(tiny_config(), 0, dtype=torch.bfloat16)
    if packed.packs(torch.bfloat16):
        assert kernels.kind_of(kernels.apply(model, "fast")) == "fast"
    else:
        _one_line_error(model, "fast", r"no packed torch.bfloat16 matmul")


@pytest.mark.parametrize("rows", [3, 40])  # the int8 kernel (<= 32 rows) and the dequantized GEMM
def test_int8_linear_is_within_its_quantization_bound(rows):
    """|y_int8 - x W^T| <= sum|x| * s/2 (rounding W to the grid s) + bf16 rounding of s, q*s and y."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 48, generator=gen)  # [out, in]
    x = torch.randn(rows, 48, generator=gen).to(torch.bfloat16).float()  # exactly representable in bf16
    layer = Int8Linear(weight, None)
    got = layer(x).double()  # [rows, 40]
    want = x.double() @ weight.double().T
    scale = weight.abs().amax(dim=1).double() / 127  # [40]
    grid = x.abs().double().sum(-1, keepdim=True) * scale / 2  # [rows, 40]
    magnitude = x.abs().double() @ weight.abs().double().T  # [rows, 40]: sum |x_i| |W_ji|
    rounding = (magnitude + want.abs() + grid) * 2 ** -7  # bf16 (2^-9 per rounding), with room
    assert ((got - want).abs() <= grid + rounding).all()
    assert layer.qweight.dtype == torch.int8 and layer.qweight.abs().max() == 127


@given(out=st.integers(1, 8), blocks=st.integers(1, 3), seed=seeds, log_scale=st.floats(-12, 6))
def test_int8_weights_are_the_nearest_grid_point_of_their_row(out, blocks, seed, log_scale):
    """Per output row, step s = max |W_j| / 127 and q_ji = round(W_ji / s): every weight within half a
    step of its grid point (|W/s - q| <= 1/2, to float32 division), the row's largest at +-127, and
    the stored step s rounded to bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, 16 * blocks, generator=gen) * 2.0 ** log_scale  # [out, in]
    layer = Int8Linear(weight, None)
    step = weight.abs().amax(dim=1) / 127  # [out]
    assert ((weight / step[:, None] - layer.qweight.float()).abs() <= 0.5 + 1e-5).all()
    assert (layer.qweight.abs().amax(dim=1) == 127).all()
    assert torch.equal(layer.scale, step.to(torch.bfloat16))


def test_int8_linear_refuses_widths_its_kernel_gets_wrong():
    """torch._weight_int8pack_mm with bf16 input silently returns garbage unless in % 16 == 0."""
    with pytest.raises(MinispecError, match="in_features = 24; expected a multiple of 16"):
        Int8Linear(torch.randn(40, 24), None)
