"""The fast path: the same Transformer with CPU-friendly weights, as a load-time rewrite.

`model.py` is the model people read. `optimize(model)` rewrites a loaded model in place so that
a decode step costs close to what streaming its weights from memory costs, and computes the same
function (float32: up to summation order, checked against the reference and transformers by the
same tests; bfloat16: more precisely than the reference path, see 3). Each change below came
from a profile of a decode step on the 2-core AMD EPYC this was built on (docs/benchmarks.md
has the numbers and `python -m minispec.bench_speed` re-measures them):

1. Packed weights (`PackedLinear`). The reference decode step spent 87% of its time in aten::mm:
   F.linear with 1-9 rows goes to a BLAS matrix-vector kernel that streams fp32 weights at
   ~11 GB/s here, and ~6 GB/s with 5-9 rows (a verify pass). oneDNN's inner product, given each
   weight reordered once into its own blocked layout, streams ~18-30 GB/s for 1-9 rows.
2. Fused projections (`FastBlock`): q, k and v read the same input, so one [d -> (H+2H_kv)*hd]
   matmul replaces three; gate and up become one [d -> 2f]. A packed matmul has ~14 us of fixed
   cost per call; this takes a step from 211 calls to 121.
3. float32 activations around the matmuls: the residual stream, the norms, RoPE, the K/V cache
   and attention are float32 even for bf16 weights; only matmul inputs are rounded to bf16. Why:
   CPU SDPA in bf16 with one query is 7-10x slower than in fp32 (0.1 ms vs 14 us per layer at
   130 keys, 0.9 ms vs 85 us at 1200). As a side effect a bf16 model computes closer to its
   float32 original than the reference bf16 path (max |logit error| 0.41 vs 1.06 on a test prompt).
4. The prefill from position 0 uses SDPA's is_causal path (8.1 -> 6.4 ms per layer at 700
   tokens); the norms are written out (12 us for one 576-vector; F.rms_norm's CPU fallback took
   20 us and more).
5. Memory. A tied LM head is packed into a second copy (vocab x d), so the embedding table would
   be resident twice; `MappedEmbedding` reads rows from the checkpoint file through a fresh memory
   map instead, so only rows of tokens actually seen are paged in. Freed packing temporaries
   are handed back to the OS.

`optimize(model, weights="int8")` is the int8 self-draft's variant (`Int8Linear`: weight-only
int8, lossy; see drafters.self_draft). `optimize(model, weights="dense")` keeps plain weights
(`DenseLinear`) for minispec.compiled, which lets TorchInductor choose their layout.

What stays the same: parameter values (repacked), the KVCache, RoPE angles, the
`forward_hidden` / `head` / `forward` signatures. What changes: the weights are no longer
`nn.Parameter`s under the HF names (the model cannot be saved, trained or `.to()`-converted after
`optimize`), and float64 is not supported (oneDNN has no float64 kernels; the float64 exactness
properties run on the reference path).

Usage:
    model = minispec.load_model(path, dtype=torch.bfloat16)
    minispec.fast.optimize(model)          # in place; returns the model
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.kv_cache import KVCache
from minispec.model import Block, RMSNorm, Transformer, apply_rope

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


def packed_kernels_available() -> bool:
    """True when this torch build has oneDNN (mkldnn) and its packed inner-product op."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """y = x @ W^T + b with W stored once in oneDNN's own layout.

    weight: [out, in] (any float dtype the model uses); it is copied into an opaque packed
    tensor, so the dense one can be freed. x: [..., in] -> y: [..., out].
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.dtype = weight.dtype
        # the batch-size argument is a layout hint; the packed weight works for any number of rows
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)
        self.bias = None if bias is None else bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [..., in] -> [..., out]; the input rounded to the weight dtype (a no-op for float32)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Linear(nn.Module):
    """Weight-only int8: y = (x @ q^T) * s + b, for the int8 self-draft (drafters.self_draft).

    Symmetric per output row: s[j] = max_i |W[j, i]| / 127, q = round(W / s) in [-127, 127].
    Each weight is off by at most s[j] / 2 (~0.4% of its row's largest entry). Activations are
    rounded to bfloat16 (PyTorch's CPU int8 weight kernel, torch._weight_int8pack_mm, is fast for
    bf16 activations only). weight: [out, in] -> q int8 [out, in], s bf16 [out].

    That kernel is a few-rows kernel: for a 700-token prefill it is 2x slower than a bf16 GEMM,
    so above `max_kernel_rows` rows the weight is dequantized (q * s, rounded to bf16) first.
    """

    max_kernel_rows = 32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        if self.in_features % 16:  # the bf16 kernel returns garbage otherwise (torch 2.13, unchecked there)
            raise ValueError(f"minispec.fast.Int8Linear: in_features = {self.in_features}; expected a multiple of 16")
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # [out]
        self.qweight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()  # [out, in]
        self.scale = scale.to(torch.bfloat16)  # [out]
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [N, in]
        if rows.shape[0] <= self.max_kernel_rows:
            y = torch._weight_int8pack_mm(rows, self.qweight, self.scale)  # [N, out]
        else:  # a prefill: the int8 kernel is built for a few rows; dequantize and use a bf16 GEMM
            y = F.linear(rows, self.qweight.to(torch.bfloat16) * self.scale[:, None])  # [N, out]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class DenseLinear(nn.Module):
    """y = x @ W^T + b with W kept dense, as a frozen Parameter: the form torch.compile can see
    (minispec.compiled). Eagerly it is F.linear; inductor with freezing repacks W itself."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.weight = nn.Parameter(weight.detach().contiguous().clone(), requires_grad=False)  # [out, in]
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)  # [..., in] -> [..., out]


LINEAR_KINDS = {"packed": PackedLinear, "int8": Int8Linear, "dense": DenseLinear}


def _cat_bias(*linears: nn.Linear) -> torch.Tensor | None:
    if linears[0].bias is None:
        return None
    return torch.cat([lin.bias.detach() for lin in linears])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, all in float32.

    Written out: on CPU this is ~12 us for one 576-vector; F.rms_norm's fallback is slower.
    """
    return x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True) + eps) * weight


class FastBlock(nn.Module):
    """One decoder block (model.Block) with fused, packed projections and float32 activations.

    Weights keep the model's dtype (float32 or bfloat16); the residual stream, the norms, RoPE,
    the K/V cache and attention are float32; only the matmul inputs are rounded to the weight
    dtype. For a float32 model this is model.Block's math exactly (up to summation order);
    for a bfloat16 model it is *more* precise than the reference path, which rounds every
    activation to bfloat16 (see `optimize`).
    """

    def __init__(self, block: Block, linear: type[nn.Module] = PackedLinear) -> None:
        super().__init__()
        attn, mlp = block.self_attn, block.mlp
        self.layer_idx = attn.layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.eps = block.input_layernorm.eps
        f32 = lambda t: t.detach().to(torch.float32, copy=True)  # noqa: E731  (own memory: see optimize)
        self.input_norm_weight = f32(block.input_layernorm.weight)  # [d]
        self.post_norm_weight = f32(block.post_attention_layernorm.weight)  # [d]
        self.q_norm_weight = None if attn.q_norm is None else f32(attn.q_norm.weight)  # [hd] (Qwen3)
        self.k_norm_weight = None if attn.k_norm is None else f32(attn.k_norm.weight)
        self.qkv_proj = linear(
            torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),  # [(H+2Hkv)*hd, d]
            _cat_bias(attn.q_proj, attn.k_proj, attn.v_proj),
        )
        self.o_proj = linear(attn.o_proj.weight, attn.o_proj.bias)
        self.gate_up_proj = linear(
            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), _cat_bias(mlp.gate_proj, mlp.up_proj)
        )  # [2f, d]
        self.down_proj = linear(mlp.down_proj.weight, mlp.down_proj.bias)

    def attention(self, x, cos, sin, mask, cache: KVCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        H, Hkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x).float().view(B, T, H + 2 * Hkv, hd)  # [B, T, H+2Hkv, hd]
        if self.q_norm_weight is not None:  # Qwen3 QK-norm, before RoPE
            qkv = torch.cat([rms_norm(qkv[:, :, :H], self.q_norm_weight, self.eps),
                             rms_norm(qkv[:, :, H:H + Hkv], self.k_norm_weight, self.eps), qkv[:, :, H + Hkv:]], 2)
        qkv = qkv.transpose(1, 2)  # [B, H+2Hkv, T, hd]
        qk = apply_rope(qkv[:, :H + Hkv], cos, sin)  # q and k heads rotated in one call
        q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + Hkv:]
        if cache is not None:
            k, v = cache.write(self.layer_idx, k, v)  # [B, Hkv, S, hd]
        if mask is not None and mask.shape[0] == mask.shape[1]:  # prefill from position 0: plain causal,
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H)  # SDPA's faster path
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)  # [B, H, T, hd]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * hd))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [B, T, f] each
        return self.down_proj(F.silu(gate) * up)

    def forward(self, x, cos, sin, mask, cache):  # x: [B, T, d] float32
        x = x + self.attention(rms_norm(x, self.input_norm_weight, self.eps), cos, sin, mask, cache)
        return x + self.mlp(rms_norm(x, self.post_norm_weight, self.eps))


class FastFinalNorm(nn.Module):
    """The final RMSNorm in float32 (the LM-head input stays float32; PackedLinear rounds it)."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.eps, self.weight = norm.eps, norm.weight.detach().to(torch.float32, copy=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x.float(), self.weight, self.eps)


def optimize(model: Transformer, weights: str = "packed") -> Transformer:
    """Rewrite `model` in place for fast CPU inference (see the module docstring); returns it.

    weights: "packed" (the model's own values, oneDNN layout), "int8" (weight-only int8 with
    bf16 activations into the matmuls: lossy, for a self-draft) or "dense" (the model's own values
    as plain frozen Parameters, the form minispec.compiled hands to torch.compile). Raises ValueError for a dtype
    oneDNN cannot pack (float64, float16) or a build without it. Idempotent: optimizing an
    optimized model does nothing.
    """
    if getattr(model, "optimized", False):
        return model
    if weights not in LINEAR_KINDS:
        raise ValueError(f"minispec.fast.optimize: weights = {weights!r}; expected one of {sorted(LINEAR_KINDS)}")
    linear = LINEAR_KINDS[weights]
    weights_dtype = model.dtype
    if model.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"minispec.fast.optimize: dtype {model.dtype}; expected float32 or bfloat16")
    if model.device.type != "cpu" or not packed_kernels_available():
        raise ValueError("minispec.fast.optimize: needs a CPU torch build with oneDNN (torch.backends.mkldnn)")
    with torch.no_grad():
        for i, block in enumerate(model.layers):
            model.layers[i] = FastBlock(block, linear)
        model.norm = FastFinalNorm(model.norm)
        # A tied head keeps its dense copy in embed_tokens (the lookup table needs rows);
        # the packed copy costs vocab*d more memory. An untied head's dense weight is freed.
        model.lm_head = linear(model.lm_head.weight, model.lm_head.bias)
        model.embed_tokens = _embedding(model)
    model.weights_dtype = weights_dtype
    model.compute_dtype = torch.float32  # activations, RoPE, K/V cache (module docstring, point 4)
    _release_freed_memory()
    model.optimized = weights
    return model


class MappedEmbedding(nn.Module):
    """Embedding lookup from a table that may be a view of the memory-mapped checkpoint file.

    table: [vocab, d], in the file's dtype. Only the rows looked up are ever read, so only their
    pages become resident. Rows come out in the table's dtype; forward_hidden casts them to the
    compute dtype (float32 on the fast path).
    """

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.weight = table  # a plain attribute, not a Parameter: it is read-only file data

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # [B, T] -> [B, T, d]


def _embedding(model: Transformer) -> nn.Module:
    """The embedding table for the fast path, without keeping a second resident copy of it.

    A tied head has just been packed: its dense weight, the embedding table, is now needed only
    for lookups. If the model came from a checkpoint, map the table from the file afresh: every
    weight page the packing touched is released with the old tensors, and the lookups page in
    only the rows they read (SmolLM2-135M fp32: 113 MB that would otherwise sit next to the
    packed head). A float32 file gives float32 rows, which the fast path computes in anyway.
    Otherwise keep a private copy (a view into the old file mapping would pin all its pages).
    """
    from minispec.checkpoint import map_tensor

    dense = model.embed_tokens.weight
    table = map_tensor(model.source, "embed_tokens.weight") if model.source is not None else None
    if table is None or tuple(table.shape) != tuple(dense.shape):
        return MappedEmbedding(dense.detach().clone())
    return MappedEmbedding(table)


def _release_freed_memory() -> None:
    """Hand the packing's freed temporaries back to the OS (glibc keeps freed heap memory for
    reuse otherwise: ~35-50 MB here). A no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def optimize_drafter(drafter) -> None:
    """Optimize a drafter's own model, if it has one that is not optimized yet (early exit
    shares the target, already optimized; n-gram has none)."""
    model = getattr(drafter, "model", None)
    if isinstance(model, Transformer) and model.dtype in SUPPORTED_DTYPES:
        optimize(model)
