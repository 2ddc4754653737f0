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

Every field that is read is checked for its JSON type and range where it is read (a string where
a number belongs, `"tie_word_embeddings": "false"`, an eos id outside the vocabulary), so a bad
config.json ends in one line naming the file and field, never in a traceback or a wrong model.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minispec.cli import read_file
from minispec.errors import ConfigError

CONFIG_BYTES = 1 << 20  # config.json's cap: a real one is a few kB

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 ("llama3") RoPE frequency scaling.

    Long wavelengths (low frequencies, wavelen > original_max / low_freq_factor) are slowed down
    by `factor`; short ones (wavelen < original_max / high_freq_factor) are kept; the band in
    between is interpolated linearly in 1/wavelen. See `minispec.model.transformer.rope_inv_freq`.
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
            (_positive_int(self.vocab_size), "vocab_size", self.vocab_size, "a positive integer"),
            (_positive_int(self.hidden_size), "hidden_size", self.hidden_size, "a positive integer"),
            (_positive_int(self.intermediate_size), "intermediate_size", self.intermediate_size, "a positive integer"),
            (_positive_int(self.num_layers), "num_hidden_layers", self.num_layers, "a positive integer"),
            (_positive_int(self.num_heads), "num_attention_heads", self.num_heads, "a positive integer"),
            (_positive_int(self.num_kv_heads) and self.num_heads % self.num_kv_heads == 0, "num_key_value_heads",
             self.num_kv_heads, f"a positive divisor of num_attention_heads={self.num_heads}"),
            (_positive_int(self.head_dim) and self.head_dim % 2 == 0, "head_dim", self.head_dim,
             "a positive even integer (RoPE rotates pairs)"),
            (_positive_number(self.rms_norm_eps), "rms_norm_eps", self.rms_norm_eps, "a positive finite number"),
            (_positive_number(self.rope_theta), "rope_theta", self.rope_theta, "a positive finite number"),
            (_positive_int(self.max_position_embeddings), "max_position_embeddings", self.max_position_embeddings,
             "a positive integer"),
            (self.bos_token_id is None or _token_id(self.bos_token_id, self.vocab_size), "bos_token_id",
             self.bos_token_id, f"a token id, 0 <= id < vocab_size={self.vocab_size}"),
            (all(_token_id(t, self.vocab_size) for t in self.eos_token_ids), "eos_token_id", list(self.eos_token_ids),
             f"token ids, each 0 <= id < vocab_size={self.vocab_size}"),
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
        elif not isinstance(source, (str, os.PathLike)):
            raise ConfigError(f"ModelConfig.from_hf: {type(source).__name__}; expected a checkpoint folder, "
                              "a config.json path or a dict")
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            if path.is_dir():
                raise ConfigError(f"{path}: a folder; expected a Hugging Face config.json file")
            if not path.is_file():
                raise ConfigError(f"{path}: file not found; expected a Hugging Face config.json")
            try:
                raw = json.loads(read_file(path, "config", CONFIG_BYTES).decode("utf-8"))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
            except UnicodeDecodeError as err:
                raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); expected JSON") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: the top level is {_json_kind(raw)}; expected a JSON object of fields")
        return _parse(raw, where)


_REQUIRED = object()


def _parse(raw: dict[str, Any], where: str) -> ModelConfig:
    def get(key: str, kind: type | tuple[type, ...], default: Any = _REQUIRED) -> Any:
        """raw[key], checked to be of `kind` (a JSON null counts as absent); `default` if absent."""
        value = raw.get(key)
        if value is None:
            if default is _REQUIRED:
                raise ConfigError(f"{where}: missing field '{key}'")
            return default
        if not _is_kind(value, kind):
            raise ConfigError(f"{where}: field '{key}' = {value!r}; expected {_kind_name(kind)}")
        return value

    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{where}: field 'model_type' = {model_type!r}; expected one of {SUPPORTED_MODEL_TYPES}")
    if get("use_sliding_window", bool, False):
        raise ConfigError(f"{where}: field 'use_sliding_window' = true; sliding-window attention is not supported")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where}: field 'hidden_act' = {act!r}; expected 'silu' (SwiGLU)")

    hidden_size = get("hidden_size", int)
    num_heads = get("num_attention_heads", int)
    vocab_size = get("vocab_size", int)
    head_dim = get("head_dim", int, None)
    if head_dim is None:
        if model_type == "qwen3":
            raise ConfigError(f"{where}: missing field 'head_dim' (required for qwen3)")
        if num_heads < 1:  # before dividing by it
            raise ConfigError(f"{where}: field 'num_attention_heads' = {num_heads}; expected a positive integer")
        if hidden_size % num_heads:
            raise ConfigError(f"{where}: field 'hidden_size' = {hidden_size} does not divide into "
                              f"num_attention_heads={num_heads} heads; expected a multiple of it (or a 'head_dim' field)")
        head_dim = hidden_size // num_heads
    rope_theta, rope_scaling = _parse_rope(raw, where)

    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])  # range: checked below
    if not all(_is_kind(t, int) for t in eos_ids):
        raise ConfigError(f"{where}: field 'eos_token_id' = {eos!r}; expected a token id (an integer) or a list of them")
    fields = dict(
        model_type=model_type,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=get("intermediate_size", int),
        num_layers=get("num_hidden_layers", int),
        num_heads=num_heads,
        num_kv_heads=get("num_key_value_heads", int, num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(get("rms_norm_eps", float)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=get("max_position_embeddings", int),
        tie_word_embeddings=get("tie_word_embeddings", bool, False),  # HF default: untied
        qk_norm=model_type == "qwen3",
        # transformers' Qwen2 hard-codes its biases and never reads "attention_bias": neither do we
        attention_bias=model_type != "qwen2" and get("attention_bias", bool, False),
        qkv_bias=model_type == "qwen2",
        mlp_bias=get("mlp_bias", bool, False),
        bos_token_id=get("bos_token_id", int, None),
        eos_token_ids=eos_ids,
    )
    try:
        return ModelConfig(**fields)
    except ConfigError as err:  # the right type but out of range: name the file, not just "config"
        raise ConfigError(f"{where}:{str(err).removeprefix('config:')}") from None


def _parse_rope(raw: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    """Return (rope_theta, scaling) from either spelling of the RoPE settings."""
    params = raw.get("rope_parameters")
    if params is not None:  # transformers >= 5
        field = "rope_parameters"
        if not isinstance(params, dict):
            raise ConfigError(f"{where}: field 'rope_parameters' = {params!r}; expected an object")
        theta = params.get("rope_theta", raw.get("rope_theta"))
        scaling = params
    else:  # hub spelling
        field = "rope_scaling"
        theta = raw.get("rope_theta", 10000.0)
        scaling = raw.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            raise ConfigError(f"{where}: field 'rope_scaling' = {scaling!r}; expected an object "
                              "(e.g. {\"rope_type\": \"llama3\", ...}) or null")
    if not _is_kind(theta, float):
        raise ConfigError(f"{where}: field 'rope_theta' = {theta!r}; expected a number")
    if scaling is None:
        return float(theta), None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise ConfigError(f"{where}: field '{field}.rope_type' = {rope_type!r}; expected 'default' or 'llama3'")
    values = {}
    for key, kind in (("factor", float), ("low_freq_factor", float), ("high_freq_factor", float),
                      ("original_max_position_embeddings", int)):
        if scaling.get(key) is None:
            raise ConfigError(f"{where}: missing field '{field}.{key}' (required for rope_type 'llama3')")
        value = scaling[key]
        if not (_positive_int(value) if kind is int else _positive_number(value)):
            raise ConfigError(f"{where}: field '{field}.{key}' = {value!r}; expected a positive "
                              f"{'integer' if kind is int else 'finite number'}")
        values[key] = value
    if not values["low_freq_factor"] < values["high_freq_factor"]:  # the band between them is interpolated
        raise ConfigError(f"{where}: field '{field}.high_freq_factor' = {values['high_freq_factor']!r}; expected "
                          f"more than low_freq_factor={values['low_freq_factor']!r}")
    return float(theta), RopeScaling(
        factor=float(values["factor"]),
        low_freq_factor=float(values["low_freq_factor"]),
        high_freq_factor=float(values["high_freq_factor"]),
        original_max_position_embeddings=values["original_max_position_embeddings"],
    )


def _is_kind(value: Any, kind: type | tuple[type, ...]) -> bool:
    """JSON typing: bool is not a number, and an integer is also a float (`1` is a fine rms_norm_eps)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if float in kinds and isinstance(value, int):
        return True
    return isinstance(value, kinds)


def _positive_int(value: Any) -> bool:
    return _is_kind(value, int) and value > 0


def _positive_number(value: Any) -> bool:
    return _is_kind(value, float) and math.isfinite(value) and value > 0


def _token_id(value: Any, vocab_size: Any) -> bool:
    return _is_kind(value, int) and (not _positive_int(vocab_size) or 0 <= value < vocab_size)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {"int": "an integer", "float": "a number", "bool": "true or false", "list": "a list", "str": "a string",
             "dict": "an object"}
    return " or ".join(names.get(k.__name__, k.__name__) for k in kinds)


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words: 'an array', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {list: "an array", str: "a string", int: "a number", float: "a number", dict: "an object"}[type(value)]
