"""The fast kind: the same Transformer with packed CPU weights, as a load-time rewrite.

model.py is the model people read. `apply(model)` swaps its modules in place so that a decode
step costs close to reading its weights from memory once, and computes the same function
(float32: up to summation order, checked against the reference by the same tests; bfloat16:
closer to the float32 model than the reference bfloat16 path, see 3). Each change, and why:

1. Packed weights (`PackedLinear`). A decode step multiplies one row (a verify pass gamma + 1
   rows) by every weight matrix: it is bound by reading the weights, not by arithmetic.
   F.linear hands such shapes to a matrix-vector kernel on the dense [out, in] layout; oneDNN's
   inner product, given each weight reordered once into its own blocked layout, streams it
   faster for a few rows. The reorder is paid once, here.
2. Fused projections (`FastBlock`). q, k and v read the same input, so one
   [d -> (H + 2 H_kv) * hd] matmul replaces three; gate and up become one [d -> 2f]. The fused
   weight's rows (and bias, where there is one: Qwen2's q, k, v) are the rows of the separate
   ones, so the arithmetic is the same; what goes is the fixed cost of two calls in three, paid
   per layer per step.
3. Float32 activations. The residual stream, the norms, RoPE, the K/V cache and attention stay
   float32 even for bfloat16 weights; only each matmul's input is rounded to the weights' dtype.
   CPU attention with a few queries is much slower in bfloat16 than in float32, and as a side
   effect a bfloat16 model computes closer to its float32 original than the reference path,
   which rounds every activation to bfloat16.
4. Cheaper glue: a prefill from position 0 uses SDPA's is_causal path instead of an explicit
   mask; the norms are written out in float32 (`rms_norm`).
5. Memory. A tied LM head is packed into a copy of its own (vocab x d) while the embedding
   lookup still needs the dense rows. Given the checkpoint folder, `FastEmbedding` reads them from
   the file through a fresh memory map, so only the rows of tokens actually seen become resident;
   without one it keeps a private copy. Freed packing temporaries are handed back to the OS.

The rewritten model is a `FastTransformer`: a subclass of model.Transformer that overrides only
what differs, `dtype` (recorded: packed weights are opaque) and `new_cache` (float32 K/V). Its
forward_hidden / head / forward are model.py's own: the swapped modules take the same arguments,
and the embedding's float32 output sets the activations' dtype.

What changes for the user: the weights are no longer nn.Parameters under the Hugging Face
names (a rewritten model cannot be saved, trained or `.to()`-converted), and only float32 and
bfloat16 are supported (oneDNN has no float64 kernels; the float64 exactness properties run on
the reference model).

kernels/int8.py and kernels/compiled.py reuse this rewrite with other linear layers.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.errors import MinispecError
from minispec.model.kv_cache import KVCache
from minispec.model.transformer import Block, RMSNorm, Transformer, apply_rope

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


def packed_kernels_available() -> bool:
    """True when this torch build has oneDNN (mkldnn) and its packed inner-product op."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and runs `dtype` weights on this CPU: float32 wherever oneDNN is, bfloat16
    only with the instructions its kernels need (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only
    CPU has neither). Probed once per dtype on a 16 x 16 weight."""
    if dtype not in SUPPORTED_DTYPES or not packed_kernels_available():
        return False
    try:
        PackedLinear(torch.ones(16, 16, dtype=dtype), None)(torch.ones(1, 16))
    except RuntimeError:  # "... bf16 path needs the cpu support ...": oneDNN's own refusal
        return False
    return True


class PackedLinear(nn.Module):
    """y = x @ W^T + b with W stored once in oneDNN's own layout.

    weight: [out, in] (float32 or bfloat16); it is copied into an opaque packed tensor, so the
    dense one can be freed. x: [..., in] -> y: [..., out], in the weight's dtype.
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


def is_plain_causal(mask: torch.Tensor | None) -> bool:
    """Whether `mask` [T, S] is the causal mask of a pass from position 0 (S = T, lower triangle).

    A square mask is not enough: a draft tree fed at cache length 0 also has S = T, with
    ancestors-only rows (minispec.trees.tree.tree_mask). The check reads T*T booleans, once per layer,
    next to attention's own T*T*d work.
    """
    if mask is None or mask.dim() != 2 or mask.shape[0] != mask.shape[1]:  # a ragged batch's is [B, 1, T, S]
        return False
    return torch.equal(mask, torch.ones_like(mask).tril_())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim; x and weight float32."""
    return x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True) + eps) * weight


def _cat_bias(*linears: nn.Linear) -> torch.Tensor | None:
    """The fused layer's bias: the separate biases end to end, in the weights' row order, or None.

    The layers fused together have biases all or none (model.Attention gives q, k and v one
    setting; Qwen2's unbiased o_proj is not fused with them, so it does not matter here).
    """
    if linears[0].bias is None:
        return None
    return torch.cat([lin.bias.detach() for lin in linears])  # [sum of out_features]


class FastBlock(nn.Module):
    """model.Block with fused projections built from `linear` layers and float32 activations.

    Same arguments as model.Block: x [B, T, d] float32, cos / sin [T, hd] float32, mask, cache.
    Weights keep the model's dtype inside the linear layers; everything between the matmuls is
    float32 (module docstring, point 3). For a float32 model this is model.Block's math exactly,
    up to summation order.
    """

    def __init__(self, block: Block, linear: Callable[[torch.Tensor, torch.Tensor | None], nn.Module]) -> None:
        super().__init__()
        attn, mlp = block.self_attn, block.mlp
        self.layer_idx = attn.layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.eps = block.input_layernorm.eps
        f32 = lambda t: t.detach().to(torch.float32, copy=True)  # noqa: E731  (own memory: the old one is freed)
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
        if is_plain_causal(mask):  # prefill from position 0: SDPA's causal path, no mask read
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H)
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
    """The final RMSNorm in float32 (the LM-head input stays float32; the head's linear rounds it)."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.eps, self.weight = norm.eps, norm.weight.detach().to(torch.float32, copy=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x.float(), self.weight, self.eps)


class FastEmbedding(nn.Module):
    """Embedding lookup whose rows come out float32: it sets the activations' dtype.

    table: [vocab, d], either a view of the memory-mapped checkpoint file (in the file's dtype;
    only the rows looked up are ever read, so only their pages become resident) or a private
    copy. Rows are rounded to the model's weights dtype first, so a bfloat16 model embeds the
    values it was loaded with even from a float32 file.
    """

    def __init__(self, table: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = table  # a plain attribute, not a Parameter: it may be read-only file data
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight).to(self.dtype).float()  # [B, T] -> [B, T, d]


class FastTransformer(Transformer):
    """A Transformer after the rewrite: fused blocks, float32 activations, opaque weights.

    Never constructed: `rewrite` turns a loaded model.Transformer into one by swapping its
    modules and assigning `__class__`, so the object (and every reference to it, such as an
    early-exit drafter's) stays the same. Overrides only what differs from the reference.
    """

    kind = "fast"  # kernels.kind_of
    weights_dtype: torch.dtype  # recorded by `rewrite`

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights were loaded in (the packed tensors themselves are opaque)."""
        return self.weights_dtype

    def new_cache(self, batch_size: int = 1, max_seq_len: int | None = None, num_layers: int | None = None,
                  *, cache_class: type = KVCache):
        """As Transformer.new_cache, with K/V in float32: attention runs in float32 here."""
        c = self.config
        return cache_class(
            num_layers or c.num_layers, batch_size, c.num_kv_heads, max_seq_len or c.max_position_embeddings,
            c.head_dim, dtype=torch.float32, device=self.device,
        )


def check_supported(model: Transformer, kind: str) -> None:
    """Raise MinispecError unless `model` is a float32 or bfloat16 model on the CPU."""
    if model.dtype not in SUPPORTED_DTYPES:
        raise MinispecError(f"kind={kind!r}: the model is {model.dtype}; expected a float32 or bfloat16 model "
                            "(dtype=float32), or kind='reference'")
    if model.device.type != "cpu":
        raise MinispecError(f"kind={kind!r}: the model is on {model.device}; expected a CPU model "
                            "(device=cpu), or kind='reference'")


def rewrite(model: Transformer, linear: Callable[[torch.Tensor, torch.Tensor | None], nn.Module],
            cls: type[FastTransformer], checkpoint: str | Path | None = None) -> FastTransformer:
    """Swap `model`'s modules for FastBlock / FastFinalNorm / FastEmbedding with `linear` layers
    (blocks and LM head) and make it a `cls`; in place, returns the same object."""
    weights_dtype = model.dtype
    with torch.no_grad():
        embedding = _embedding(model, checkpoint, cls.kind)  # first: a bad checkpoint leaves the model as it was
        for i, block in enumerate(model.layers):
            model.layers[i] = FastBlock(block, linear)
        model.norm = FastFinalNorm(model.norm)
        # a tied head is copied into its own layout (the lookup keeps the dense rows, see
        # FastEmbedding); an untied head's dense weight is freed with the old module. A head
        # that is not one linear layer (kernels.frequent_head) rebuilds itself with `linear`.
        head = model.lm_head
        model.lm_head = head.rebuilt(linear) if hasattr(head, "rebuilt") else linear(head.weight, head.bias)
        model.embed_tokens = embedding
    model.__class__ = cls
    model.weights_dtype = weights_dtype
    _release_freed_memory()
    return model


def apply(model: Transformer, checkpoint: str | Path | None = None) -> FastTransformer:
    """The fast kind: packed, fused weights (module docstring); in place, returns the model."""
    check_supported(model, "fast")
    check_packs(model.dtype, "fast")
    return rewrite(model, PackedLinear, FastTransformer, checkpoint)


def check_packs(dtype: torch.dtype, kind: str) -> None:
    """Raise MinispecError unless oneDNN packs `dtype` weights here (packs)."""
    if not packed_kernels_available():
        raise MinispecError(f"kind={kind!r}: this torch build has no oneDNN (torch.backends.mkldnn); "
                            "expected a CPU build with it, or kind='reference'")
    if not packs(dtype):
        raise MinispecError(f"kind={kind!r}: this CPU's oneDNN has no packed {dtype} matmul (it needs AVX-512 "
                            "BW/VL/DQ or AVX-NE-CONVERT); expected dtype=float32, or kind='reference'")


def _embedding(model: Transformer, checkpoint: str | Path | None, kind: str) -> FastEmbedding:
    """The lookup table without a second resident copy of it where the file can serve it.

    With a checkpoint, the table is mapped afresh from the file: every page the loader or the
    packing touched is released with the old tensors, and lookups page in only the rows they
    read. Without one, a private copy: a view into the loader's own mapping would keep all its
    pages alive.
    """
    from minispec.checkpoints.load import map_tensor

    dense = model.embed_tokens.weight  # [vocab, d]
    if checkpoint is None:
        return FastEmbedding(dense.detach().clone(), dense.dtype)
    table = map_tensor(checkpoint, "embed_tokens.weight")
    rows = torch.tensor([0, dense.shape[0] - 1])
    if table is None or table.shape != dense.shape or not torch.equal(table[rows].to(dense.dtype), dense[rows]):
        raise MinispecError(f"kind={kind!r}: checkpoint={str(checkpoint)!r} does not hold this model's embedding "
                            "table; expected the folder the model was loaded from")
    return FastEmbedding(table, dense.dtype)


def _release_freed_memory() -> None:
    """Hand the rewrite's freed temporaries back to the OS (glibc otherwise keeps freed heap
    memory for reuse). A no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
