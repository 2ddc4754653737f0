"""The converter on tiny synthetic Qwen2 GGUF files, in every tensor type the real pair uses, against
transformers' own GGUF loader on the same file.

Each file is what llama.cpp writes for Qwen2.5: architecture qwen2, q/k/v biases, an untied
`output.weight`, the 'qwen2' pre-tokenizer, control tokens (<|im_start|> ...), user-defined ones
(<tool_call>) and unused padding entries ([PAD...]). The tokenizer is a small byte-level BPE trained
here with Qwen2's split, so its merges cover digits, spaces and punctuation runs. Weights of the
legacy types are quantized from random floats with gguf.quants; gguf.quants cannot quantize the
K-quants (Q4_K, Q6_K, ...), so their blocks are random bytes with the float16 scales set to sizes a
real file has: every bit pattern of the rest is a valid block.

transformers reads the GGUF with its own name map, its own config mapping and its own tokenizer
builder; we compare our folder with it: the weights bit for bit, the logits within fp32 rounding,
and the token ids of a varied corpus exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf", reason="the GGUF writer and reader (pip install -e .[test])")
transformers = pytest.importorskip("transformers", reason="the reference GGUF loader (pip install -e .[test])")

from minispec.checkpoints.load import load_model  # noqa: E402
from minispec.checkpoints.convert import QWEN2_SPLIT, SUPPORTED_TYPES, convert_gguf  # noqa: E402
from minispec.errors import CheckpointError  # noqa: E402
from minispec.checkpoints.tokenizer import load_tokenizer  # noqa: E402

Q = gguf.GGMLQuantizationType
TINY = dict(layers=2, hidden=256, heads=4, kv_heads=2, ffn=512)  # K-quant rows hold 256 values: widths are 256k
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>"]
USER_DEFINED = ["<tool_call>", "</tool_call>"]
UNUSED = ["[PAD0]", "[PAD1]"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "def add(a, b):\n    return a + b  # 12345 + 678\n",
    "for i in range(10):\n\tprint(f'{i:>3}')\n\n\n",
    "    indented    spaces   and\ttabs \t \n  \r\n",
    "héllo wörld, ça va? naïve café",
    "日本語のテキストと中文, Привет мир, مرحبا",
    "emoji 👍🏽🎉 and flags 🇫🇷",
    "combining: e\u0301 vs \u00e9, Å vs A\u030a",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<tool_call>{\"name\": \"f\"}</tool_call> [PAD0] <|fim_prefix|>x",
    "it's we're they'll I'd YOU'VE",
    "x=1;y=22;z=333;;;!!!???...",
    "",
    " ",
    "\n",
]
# the type of each weight in the two real files, in one list: every row a file, every column a role
# (token_embd, output, attention q/k/v/o, ffn gate/up, ffn down)
LAYOUTS = {
    "1.5b": ("Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K"),
    "0.5b": ("Q5_0", "Q8_0", "Q5_0", "Q5_0", "Q6_K"),
    "0.5b-k": ("Q4_K", "Q8_0", "Q5_0", "Q4_K", "Q6_K"),
    "f32": ("F32", "F32", "F32", "F32", "F32"),
}
# float16 scale fields of a K-quant block: (byte offset, value); the rest of the block is random bits
K_SCALES = {
    "Q2_K": (84, [(80, 2e-3), (82, 1e-3)]), "Q3_K": (110, [(108, 1e-3)]),
    "Q4_K": (144, [(0, 2e-4), (2, 2e-4)]), "Q5_K": (176, [(0, 1e-4), (2, 1e-4)]), "Q6_K": (210, [(208, 2e-5)]),
}


def tiny_bpe() -> tuple[list[str], list[str]]:
    """A byte-level BPE vocabulary (all 256 byte symbols first) and its merges, trained on CORPUS with
    Qwen2's split, so that merges cross digits, spaces, letters and punctuation as in the real one."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(CORPUS * 20 + ["1234 5678 90 12 345", "a  b   c    d"] * 20, trainer)
    state = json.loads(bpe.to_str())["model"]
    tokens = [token for token, _ in sorted(state["vocab"].items(), key=lambda item: item[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in state["merges"]]
    return tokens, merges


def quantized(shape: tuple[int, int], kind: str, rng: np.random.Generator) -> np.ndarray:
    """Bytes (or floats) of a `kind` tensor of torch shape `shape`, as GGUFWriter.add_tensor takes them."""
    if kind in K_SCALES:
        block_bytes, scales = K_SCALES[kind]
        blocks = rng.integers(0, 256, (shape[0], shape[1] // 256, block_bytes), dtype=np.uint8)
        for offset, value in scales:  # a finite, realistic scale per block
            blocks[:, :, offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
        return blocks.reshape(shape[0], -1)
    floats = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    return floats if kind == "F32" else gguf.quants.quantize(floats, Q[kind])


def write_qwen2_gguf(path, layout: tuple[str, ...], seed: int = 0) -> None:
    """A tiny Qwen2.5-shaped GGUF file at `path`, its weight types given by `layout` (see LAYOUTS)."""
    rng = np.random.default_rng(seed)
    tokens, merges = tiny_bpe()
    tokens = tokens + CONTROL + USER_DEFINED + UNUSED
    types = [1] * (len(tokens) - len(CONTROL + USER_DEFINED + UNUSED)) + [3] * len(CONTROL) + \
        [4] * len(USER_DEFINED) + [5] * len(UNUSED)
    vocab, hidden, head_dim = len(tokens), TINY["hidden"], TINY["hidden"] // TINY["heads"]
    embd, head, attn_qkv, ffn_gate_up, ffn_down = layout
    w = gguf.GGUFWriter(str(path), "qwen2")
    for key, value in [("block_count", TINY["layers"]), ("embedding_length", hidden), ("context_length", 512),
                       ("feed_forward_length", TINY["ffn"]), ("attention.head_count", TINY["heads"]),
                       ("attention.head_count_kv", TINY["kv_heads"])]:
        w.add_uint32(f"qwen2.{key}", value)
    w.add_float32("qwen2.rope.freq_base", 1000000.0)
    w.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    ids = {token: i for i, token in enumerate(tokens)}
    w.add_uint32("tokenizer.ggml.eos_token_id", ids["<|im_end|>"])
    w.add_uint32("tokenizer.ggml.padding_token_id", ids["<|endoftext|>"])
    w.add_uint32("tokenizer.ggml.bos_token_id", ids["<|endoftext|>"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", TEMPLATE)

    def add(name: str, shape: tuple[int, ...], kind: str = "F32") -> None:
        data = quantized(shape, kind, rng) if len(shape) == 2 else (rng.standard_normal(shape) * 0.1 + (
            1.0 if name.endswith("norm.weight") else 0.0)).astype(np.float32)
        w.add_tensor(name, data, raw_dtype=None if kind == "F32" else Q[kind])

    add("token_embd.weight", (vocab, hidden), embd)
    add("output.weight", (vocab, hidden), head)
    add("output_norm.weight", (hidden,))
    for i in range(TINY["layers"]):
        kv = TINY["kv_heads"] * head_dim
        for part, rows, kind in (("attn_q", hidden, attn_qkv), ("attn_k", kv, attn_qkv), ("attn_v", kv, attn_qkv)):
            add(f"blk.{i}.{part}.weight", (rows, hidden), kind)
            add(f"blk.{i}.{part}.bias", (rows,))
        add(f"blk.{i}.attn_output.weight", (hidden, hidden), attn_qkv)
        add(f"blk.{i}.ffn_gate.weight", (TINY["ffn"], hidden), ffn_gate_up)
        add(f"blk.{i}.ffn_up.weight", (TINY["ffn"], hidden), ffn_gate_up)
        add(f"blk.{i}.ffn_down.weight", (hidden, TINY["ffn"]), ffn_down)
        add(f"blk.{i}.attn_norm.weight", (hidden,))
        add(f"blk.{i}.ffn_norm.weight", (hidden,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def converted(request, tmp_path_factory):
    """(the GGUF file, our converted folder, transformers' model loaded from the same file)."""
    folder = tmp_path_factory.mktemp(f"qwen2-{request.param}")
    write_qwen2_gguf(folder / "tiny.gguf", LAYOUTS[request.param])
    ours = convert_gguf(folder / "tiny.gguf", folder / "converted")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file="tiny.gguf", dtype=torch.float32)
    return folder / "tiny.gguf", ours, theirs.eval()


def test_weights_equal_transformers_gguf_loader_bit_for_bit(converted):
    _, ours, theirs = converted
    model = load_model(ours)
    their_state = theirs.state_dict()
    for name, tensor in model.state_dict().items():
        hf = name if name.startswith("lm_head.") else "model." + name
        assert torch.equal(tensor, their_state[hf]), hf
    assert not model.config.tie_word_embeddings and model.config.qkv_bias  # untied head, Qwen's biases
    assert not torch.equal(model.lm_head.weight, model.embed_tokens.weight)


def test_logits_equal_transformers_in_float32(converted):
    """Same tolerance as the Llama equivalence tests: fp32 rounding of two implementations."""
    _, ours, theirs = converted
    model = load_model(ours)
    ids = torch.tensor([[3, 17, 250, 11, 0, 399, 42, 42, 7, 128, 300, 5]])
    with torch.no_grad():
        expected = theirs(ids).logits
        logits = model(ids)
    assert torch.allclose(logits, expected, atol=1e-4, rtol=1e-4), (logits - expected).abs().max()


def test_tokenization_equals_transformers_on_a_varied_corpus(converted):
    gguf_path, ours, _ = converted
    theirs = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tok = load_tokenizer(ours)
    for text in CORPUS:
        assert tok.encode(text) == theirs.encode(text, add_special_tokens=False), repr(text)
        assert tok.decode(tok.encode(text)) == text, repr(text)  # every byte has a token here
    specials = tok.encode("<tool_call><|im_start|><|fim_prefix|>")
    assert [tok.decode([i]) for i in specials] == ["<tool_call>", "<|im_start|>", "<|fim_prefix|>"]
    assert tok.decode(specials, skip_special_tokens=True) == "<tool_call>"  # user-defined: not special
    assert [tok.decode([i]) for i in tok.encode("12345")] == list("12345")  # Qwen2: digits one by one


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=list("sStTrReEvVmMlLdDoOaA' ,.\n1é"), max_size=30))
def test_tokenization_equals_transformers_on_any_mix_of_cases_and_apostrophes(converted, text):
    """Qwen2's split reads contractions case-blind ('S like 's, 'RE like 're): on any text of such
    letters, apostrophes, spaces and punctuation our tokenizer splits it into the pieces
    transformers' does (the pieces themselves: the tiny vocabulary may merge too little for a
    wrong split to change the ids) and gives the same ids."""
    gguf_path, ours, _ = converted
    theirs = reference_tokenizer(gguf_path)
    tok = load_tokenizer(ours)
    assert tok.backend.pre_tokenizer.pre_tokenize_str(text) == \
        theirs.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
    assert tok.encode(text) == theirs.encode(text, add_special_tokens=False)


_REFERENCE = {}


def reference_tokenizer(gguf_path):
    """transformers' tokenizer for one GGUF file, built once."""
    if gguf_path not in _REFERENCE:
        _REFERENCE[gguf_path] = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return _REFERENCE[gguf_path]


def test_config_tokens_and_template(converted):
    _, ours, _ = converted
    config = json.loads((ours / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert config["tie_word_embeddings"] is False and config["rms_norm_eps"] == 1e-6
    assert config["rope_theta"] == 1000000.0 and config["torch_dtype"] == "float32"
    tok = load_tokenizer(ours)
    im_end = tok.token_to_id("<|im_end|>")
    assert tok.eos_token_ids == [im_end] and tok.bos_token_id == tok.token_to_id("<|endoftext|>")
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.render_chat(messages, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_bfloat16_output_is_the_float32_values_rounded_to_nearest(tmp_path):
    write_qwen2_gguf(tmp_path / "tiny.gguf", LAYOUTS["1.5b"])
    fp32 = load_model(convert_gguf(tmp_path / "tiny.gguf", tmp_path / "fp32"))
    bf16_folder = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((bf16_folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (bf16_folder / "model.safetensors").stat().st_size < 0.55 * (tmp_path / "fp32" / "model.safetensors").stat().st_size
    bf16 = load_model(bf16_folder, dtype=torch.bfloat16)
    for (name, a), (_, b) in zip(fp32.state_dict().items(), bf16.state_dict().items()):
        assert b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b), name


@pytest.mark.parametrize("kind", SUPPORTED_TYPES)
def test_every_supported_type_converts(tmp_path, kind):
    """Each type SUPPORTED_TYPES names, as every 2-D weight of the file: converted, loadable, and
    equal to gguf's dequantization (the K-quants also to transformers' own torch dequantizer)."""
    write_qwen2_gguf(tmp_path / "tiny.gguf", (kind,) * 5)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    model = load_model(out)
    reader = gguf.GGUFReader(tmp_path / "tiny.gguf")
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert embd.tensor_type.name == kind
    expected = torch.from_numpy(np.array(gguf.quants.dequantize(embd.data, embd.tensor_type)).reshape(model.embed_tokens.weight.shape))
    assert torch.equal(model.embed_tokens.weight, expected)
    from transformers.integrations.gguf import dequant

    if embd.tensor_type.value in dequant.GGML_BLOCK:
        theirs = dequant.dequantize(torch.from_numpy(np.ascontiguousarray(embd.data)).flatten(), embd.tensor_type.value)
        assert torch.equal(theirs.reshape(expected.shape), expected)


def test_an_unsupported_type_or_recipe_is_refused_before_any_weight_is_read(tmp_path, monkeypatch):
    import minispec.checkpoints.convert as convert

    write_qwen2_gguf(tmp_path / "tiny.gguf", LAYOUTS["1.5b"])
    monkeypatch.setattr(convert, "read_tensor", lambda planned: pytest.fail("a weight was read"))
    monkeypatch.setattr(convert, "SUPPORTED_TYPES", ("F32", "Q6_K"))
    with pytest.raises(CheckpointError, match=r"tiny\.gguf: tensor 'token_embd\.weight' is Q4_K; expected one of F32, Q6_K"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    monkeypatch.setattr(convert, "SUPPORTED_TYPES", SUPPORTED_TYPES)
    monkeypatch.setattr(convert, "PRE_TOKENIZERS", {"smollm": convert.PRE_TOKENIZERS["smollm"]})
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.model/pre are 'gpt2'/'qwen2'; expected 'gpt2' with one of 'smollm'"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
