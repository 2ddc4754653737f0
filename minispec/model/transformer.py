"""A Llama / Qwen2 / Qwen3 decoder-only transformer, written to be read.

    input_ids [B, T]
      -> embed_tokens                              x: [B, T, d]
      -> num_layers x Block:
             x = x + Attention(RMSNorm(x))          (RoPE, grouped-query, causal with offset)
             x = x + MLP(RMSNorm(x))                (SwiGLU)
      -> final RMSNorm                             hidden: [B, T, d]   (the LM-head input)
      -> lm_head                                   logits: [B, T, vocab]

With a KVCache the T tokens are placed at absolute positions [cache.length, cache.length+T):
that is what lets a speculative verify pass score gamma+1 tokens at any offset in one call.
Qwen2 differs from Llama only in biases on the q, k and v projections (o has none); Qwen3 only
in an RMSNorm over head_dim on q and k, applied before RoPE.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.model.config import ModelConfig, RopeScaling
from minispec.model.kv_cache import KVCache, causal_mask
from minispec.model.memory import check_fits, kv_cache_bytes


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, the mean over the last dim, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_f = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # upcast low precision only
        x_f = x_f * torch.rsqrt(x_f.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x_f.to(x.dtype)


# ---------------------------------------------------------------------------------------- RoPE


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/head_dim), i = 0..head_dim/2-1, in float64: [head_dim/2].

    With Llama-3 scaling, a frequency whose wavelength 2*pi/f is longer than
    original_max / low_freq_factor is divided by `factor`; one shorter than
    original_max / high_freq_factor is kept; in between, with
    s = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor),
    f' = (1 - s) * f / factor + s * f.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim))
    if scaling is None:
        return inv_freq
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    interpolated = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, interpolated)
    return torch.where(wavelen < high_freq_wavelen, inv_freq, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency for rotate-half RoPE: two [..., T, head_dim] tensors.

    positions: [T] (one sequence, or a batch at equal offsets) or [B, T] (a ragged batch: each
    row at its own positions). Angles are computed in float64 from absolute positions, so
    position p gets the same rotation whether it arrives in a prefill, a decode step, a verify
    chunk or a batch.
    """
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [..., T, head_dim/2]
    angles = torch.cat([angles, angles], dim=-1)  # [..., T, head_dim]: halves share frequencies
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + head_dim/2]) by their angle: x*cos + rotate_half(x)*sin.

    x: [B, H, T, head_dim]; cos, sin: [T, head_dim], or [B, 1, T, head_dim] for a ragged batch. This is the "rotate-half" (NeoX / HF)
    pairing; llama.cpp's GGUF files store Llama q/k rows permuted for adjacent pairs instead,
    which the converter in minispec.checkpoints.fetch undoes.
    """
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


# ------------------------------------------------------------------------------- the blocks


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE, writing to and reading from a KVCache."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        d = cfg.hidden_size
        qkv_bias = cfg.attention_bias or cfg.qkv_bias  # Qwen2: q, k, v biased, o not
        self.q_proj = nn.Linear(d, cfg.num_heads * cfg.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * cfg.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * cfg.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, d, bias=cfg.attention_bias)
        # Qwen3: per-head RMSNorm over head_dim on q and k, before RoPE
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [B, T, d]
        cos: torch.Tensor,  # [T, head_dim]
        sin: torch.Tensor,  # [T, head_dim]
        mask: torch.Tensor | None,  # [T, S] or [B, 1, T, S] bool, True = may attend; None = all (single query)
        cache: KVCache | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)  # [B, T, H, hd]
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, Hkv, hd]
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, Hkv, hd]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H(kv), T, hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        if cache is not None:  # store K/V before the GQA repeat; get every valid position back
            k, v = cache.write(self.layer_idx, k, v)  # [B, Hkv, S, hd], S = start + T
        # enable_gqa: query head h reads kv head h // num_kv_groups, without materialising the repeat
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads
        )  # [B, H, T, hd]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, f, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(d, f, bias=bias)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


# --------------------------------------------------------------------------- the transformer


class Transformer(nn.Module):
    """Llama / Qwen2 / Qwen3 causal LM. Parameter names match Hugging Face checkpoints exactly."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # float64, outside the module's buffers so .to(bfloat16) never rounds the frequencies
        self._inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype; activations, RoPE tables and the K/V cache use it too."""
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def new_cache(self, batch_size: int = 1, max_seq_len: int | None = None, num_layers: int | None = None,
                  *, cache_class: type = KVCache):
        """An empty KVCache for this model (or another class with its constructor, e.g. a batch's
        minispec.batch.ragged_cache.RaggedKVCache): the one way to build one.

        max_seq_len defaults to max_position_embeddings; num_layers (an early-exit draft's N)
        defaults to every layer. K/V are stored in the activations' dtype, here the weights'.
        """
        c = self.config
        positions = max_seq_len or c.max_position_embeddings
        check_fits(kv_cache_bytes(c, batch_size, positions, self.dtype, num_layers),
                   f"a KV cache of {batch_size} x {positions} positions", self.device,
                   "fewer rows (batch_size=), a shorter prompt or fewer new tokens (max_new_tokens=)")
        return cache_class(
            num_layers or c.num_layers, batch_size, c.num_kv_heads, positions,
            c.head_dim, dtype=self.dtype, device=self.device,
        )

    def forward_hidden(
        self, input_ids: torch.Tensor, cache: KVCache | None = None, *,
        num_layers: int | None = None, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states (after the final norm, i.e. the LM-head input): [B, T, d].

        input_ids: [B, T]. With a cache, the tokens go where the cache says (`cache.positions(T)`,
        under `cache.mask(T)`: a KVCache puts them at [length, length+T), causally; a batch's
        RaggedKVCache puts row b's at [lengths[b], lengths[b]+T)) and the cache advances by T.
        Without one they are positions 0..T-1. `num_layers` runs only the first
        N blocks (early exit); the cache must then have at least N layers. A draft tree
        (minispec.trees.tree) passes its own RoPE `positions` [T] (by depth) and attention `mask`
        [T, start+T] (ancestors only); the keys and values still go into the cache in row order.
        """
        B, T = input_ids.shape
        if cache is not None:
            cache.check_room(T)
        x = self.embed_tokens(input_ids)  # [B, T, d]; its dtype is the activations' dtype
        if positions is None and cache is not None:  # where the cache puts them: [T] or [B, T], and their mask
            positions, mask = cache.positions(T), cache.mask(T)
        elif positions is None:
            positions, mask = torch.arange(T, device=input_ids.device), causal_mask(0, T, input_ids.device)
        cos, sin = rope_cos_sin(positions, self._inv_freq.to(input_ids.device), x.dtype)
        if cos.dim() == 3:  # per-row positions: [B, T, hd] -> [B, 1, T, hd], broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        for block in self.layers[:num_layers]:
            x = block(x, cos, sin, mask, cache)
        if cache is not None:
            cache.advance(T)
        return self.norm(x)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: [..., d] -> logits [..., vocab]."""
        return self.lm_head(hidden)

    def forward(
        self, input_ids: torch.Tensor, cache: KVCache | None = None, *, return_hidden: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, T, vocab]; with return_hidden=True, (logits, hidden [B, T, d])."""
        hidden = self.forward_hidden(input_ids, cache)
        logits = self.head(hidden)
        return (logits, hidden) if return_hidden else logits
