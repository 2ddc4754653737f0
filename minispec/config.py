"""ModelConfig: the architecture of a Llama, Qwen2 or Qwen3 checkpoint, read from its config.json.

The config is a frozen dataclass built only from the checkpoint's own config.json, never from
the folder's name. Two spellings of the RoPE settings exist in the wild and both are read:

* as checkpoints on the hub write it:      "rope_theta": 500000.0, "rope_scaling": {...} | null
* as transformers >= 5 writes it:          "rope_parameters": {"rope_type": ..., "rope_theta": ...}

Supported: model_type "llama" (grouped-query attention, optional "llama3" RoPE scaling as in
Llama-3.1/3.2, tied or untied LM head), "qwen2" (Qwen2 and Qwen2.5: Llama's layout with biases
on the q, k and v projections but none on o; the model type implies them, its config.json has
no field for them; sliding-window attention refused) and "qwen3" (explicit head_dim, RMSNorm
on q and k before RoPE, tied or untied LM head). Anything else is a ConfigError naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minispec.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 ("llama3") RoPE frequency scaling.

    Long wavelengths (low frequencies, wavelen > original_max / low_freq_factor) are slowed down
    by `factor`; short ones (wavelen < original_max / high_freq_factor) are kept; the band in
    between is interpolated linearly in 1/wavelen. See `minispec.model.rope_inv_freq`.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int  # d_model
    intermediate_size: int  # SwiGLU inner width
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads; num_heads % num_kv_heads == 0 (GQA)
    head_dim: int  # Qwen3 sets it explicitly; Llama and Qwen2 derive hidden_size // num_heads
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool  # LM head shares the embedding matrix
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k, before RoPE
    attention_bias: bool = False  # Llama / Qwen3 "attention_bias": biases on q, k, v and o
    qkv_bias: bool = False  # Qwen2: biases on q, k and v only, o has none (implied by the model type)
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # (ok, field as config.json spells it, value, what was expected)
        checks = [
            (self.model_type in SUPPORTED_MODEL_TYPES, "model_type", self.model_type, f"one of {SUPPORTED_MODEL_TYPES}"),
            (self.vocab_size > 0, "vocab_size", self.vocab_size, "a positive integer"),
            (self.hidden_size > 0, "hidden_size", self.hidden_size, "a positive integer"),
            (self.intermediate_size > 0, "intermediate_size", self.intermediate_size, "a positive integer"),
            (self.num_layers > 0, "num_hidden_layers", self.num_layers, "a positive integer"),
            (self.num_heads > 0, "num_attention_heads", self.num_heads, "a positive integer"),
            (self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads == 0, "num_key_value_heads",
             self.num_kv_heads, f"a positive divisor of num_attention_heads={self.num_heads}"),
            (self.head_dim > 0 and self.head_dim % 2 == 0, "head_dim", self.head_dim,
             "a positive even integer (RoPE rotates pairs)"),
            (self.rms_norm_eps > 0, "rms_norm_eps", self.rms_norm_eps, "a positive number"),
            (self.rope_theta > 0, "rope_theta", self.rope_theta, "a positive number"),
            (self.max_position_embeddings > 0, "max_position_embeddings", self.max_position_embeddings,
             "a positive integer"),
        ]
        for ok, field, value, expected in checks:
            if not ok:
                raise ConfigError(f"config: field '{field}' = {value!r}; expected {expected}")

    @property
    def num_kv_groups(self) -> int:
        """How many query heads share one key/value head."""
        return self.num_heads // self.num_kv_heads

    # ------------------------------------------------------------------ reading config.json

    @classmethod
    def from_hf(cls, source: str | Path | dict[str, Any]) -> "ModelConfig":
        """Build from a checkpoint folder, a config.json path, or an already-parsed dict."""
        where = "config"
        if isinstance(source, dict):
            raw = source
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            if not path.is_file():
                raise ConfigError(f"{path}: file not found; expected a Hugging Face config.json")
            try:
                raw = json.loads(path.read_text())
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
        return _parse(raw, where)


def _parse(raw: dict[str, Any], where: str) -> ModelConfig:
    def need(key: str, kind: type | tuple[type, ...] = int) -> Any:
        if key not in raw or raw[key] is None:
            raise ConfigError(f"{where}: missing field '{key}'")
        value = raw[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(f"{where}: field '{key}' = {value!r}; expected {_kind_name(kind)}")
        return value

    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{where}: field 'model_type' = {model_type!r}; expected one of {SUPPORTED_MODEL_TYPES}")
    if raw.get("use_sliding_window"):
        raise ConfigError(f"{where}: field 'use_sliding_window' = true; sliding-window attention is not supported")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where}: field 'hidden_act' = {act!r}; expected 'silu' (SwiGLU)")

    hidden_size = need("hidden_size")
    num_heads = need("num_attention_heads")
    head_dim = raw.get("head_dim")
    if head_dim is None:
        if model_type == "qwen3":
            raise ConfigError(f"{where}: missing field 'head_dim' (required for qwen3)")
        head_dim = hidden_size // num_heads
    rope_theta, rope_scaling = _parse_rope(raw, where)

    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return ModelConfig(
        model_type=model_type,
        vocab_size=need("vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=float(need("rms_norm_eps", (int, float))),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=need("max_position_embeddings"),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),  # HF default: untied
        qk_norm=model_type == "qwen3",
        # transformers' Qwen2 hard-codes its biases and never reads "attention_bias": neither do we
        attention_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
        qkv_bias=model_type == "qwen2",
        mlp_bias=bool(raw.get("mlp_bias", False)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def _parse_rope(raw: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    """Return (rope_theta, scaling) from either spelling of the RoPE settings."""
    params = raw.get("rope_parameters")
    if params is not None:  # transformers >= 5
        field = "rope_parameters"
        theta = params.get("rope_theta", raw.get("rope_theta"))
        scaling = params
    else:  # hub spelling
        field = "rope_scaling"
        theta = raw.get("rope_theta", 10000.0)
        scaling = raw.get("rope_scaling")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        raise ConfigError(f"{where}: field 'rope_theta' = {theta!r}; expected a number")
    if scaling is None:
        return float(theta), None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise ConfigError(f"{where}: field '{field}.rope_type' = {rope_type!r}; expected 'default' or 'llama3'")
    try:
        return float(theta), RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as err:
        raise ConfigError(f"{where}: missing field '{field}.{err.args[0]}' (required for rope_type 'llama3')") from None


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({"int": "an integer", "float": "a number"}.get(k.__name__, k.__name__) for k in kinds)
