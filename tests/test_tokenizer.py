"""minispec.checkpoints.tokenizer on the real SmolLM2 tokenizer: ids, special tokens, chat template, streaming decode;
and the draft/target vocabulary check on small tokenizers built here."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given, settings, strategies as st

from minispec.errors import CheckpointError
from minispec.checkpoints.tokenizer import VOCAB_SIZE_TOLERANCE, check_same_vocabulary, load_tokenizer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CHATML_QUESTION = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
SAMPLES = [
    "Hello, world!",
    "héllo wörld, ça va?",
    "日本語のテキストと中文",
    "Привет, мир",
    "مرحبا بالعالم",
    "👍🏽 emoji 🎉 and 🇫🇷",
    "a\n\n  b\t\tc    ",
    "def f(x):\n    return x ** 2  # 42\n",
    "<|im_start|>user\nhi<|im_end|>",
]
# Text the tokenizer can round-trip: no control characters (some, like 0x04, have no byte token)
# and nothing from U+40000 up (UTF-8 lead bytes 0xF1/0xF2 have no byte token either).
ROUND_TRIP_TEXT = st.text(st.characters(max_codepoint=0x3FFFF, blacklist_categories=("Cc", "Cs")), max_size=40)


@pytest.fixture(scope="session")
def tok(real_tokenizer):
    return real_tokenizer


def test_special_ids_and_vocab(tok):
    assert tok.bos_token_id == 1 and tok.eos_token_ids == [2] and tok.vocab_size == 49152
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]


def test_digits_are_split_one_by_one(tok):
    ids = tok.encode("12345")
    assert [tok.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]
    assert [tok.decode([i]) for i in tok.encode("Year 2024")][-4:] == ["2", "0", "2", "4"]  # also after a space


def test_special_token_strings_become_their_ids(tok):
    ids = tok.encode("<|im_start|>user")
    assert ids[0] == 1 and tok.decode(ids[1:]) == "user"
    assert tok.encode("<|im_end|>") == [2]
    assert 1 not in tok.encode("Hello") and 2 not in tok.encode("Hello")
    assert tok.decode([1, *tok.encode("user")], skip_special_tokens=True) == "user"


def test_chat_template_renders_chatml_with_default_system_prompt(tok):
    assert tok.render_chat(QUESTION) == CHATML_QUESTION
    ids = tok.apply_chat_template(QUESTION)
    assert ids == tok.encode(CHATML_QUESTION)
    assert ids[0] == 1 and ids[-4:] == [1, *tok.encode("assistant\n")]
    assert tok.decode(ids) == CHATML_QUESTION


def test_chat_template_with_own_system_prompt_and_no_generation_prompt(tok):
    messages = [{"role": "system", "content": "Be brief."}, *QUESTION]
    text = tok.render_chat(messages, add_generation_prompt=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"


@pytest.mark.parametrize("text", SAMPLES)
def test_decode_inverts_encode(tok, text):
    assert tok.decode(tok.encode(text)) == text


@settings(deadline=None, max_examples=200)
@given(text=ROUND_TRIP_TEXT)
def test_decode_inverts_encode_property(tok, text):
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text", SAMPLES)
def test_stream_decoder_emits_whole_characters(tok, text):
    stream = tok.stream_decoder()
    pieces = [stream.push(i) for i in tok.encode(text)] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_stream_decoder_holds_half_a_character(tok):
    ids = tok.encode("🎉")
    assert len(ids) > 1  # byte-level BPE splits this emoji across tokens
    stream = tok.stream_decoder()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) == "🎉"


@settings(deadline=None, max_examples=200)
@given(ids=st.lists(st.integers(0, 49151), max_size=30), chunk=st.integers(1, 4), skip=st.booleans())
def test_stream_decoder_concatenation_equals_decode(tok, ids, chunk, skip):
    """Any ids, even ones that never form valid UTF-8, pushed in chunks: pieces + flush == decode(all)."""
    stream = tok.stream_decoder(skip_special_tokens=skip)
    pieces = [stream.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk)] + [stream.flush()]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)


def test_missing_tokenizer_json_names_the_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: no such file") as error:
        load_tokenizer(tmp_path)
    assert str(tmp_path / "tokenizer.json") in str(error.value) and "\n" not in str(error.value)


def test_missing_chat_template_names_the_field(real_ckpt, tmp_path):
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    tok = load_tokenizer(tmp_path)  # no tokenizer_config.json: plain text still works
    assert tok.decode(tok.encode("Hello there")) == "Hello there"
    assert tok.eos_token_ids == [] and tok.bos_token_id is None
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: no 'chat_template' field"):
        tok.apply_chat_template(QUESTION)


@pytest.mark.parametrize("template, words", [
    (["{{ x }}"], "field 'chat_template' entry 0 is str; expected a jinja2 template string or a list of"),
    ([{"name": "tool_use", "template": "x"}], "list has no entry named 'default'"),
    ("", "field 'chat_template' is empty"),
    ("  \n", "field 'chat_template' is empty"),
])
def test_a_chat_template_that_is_no_template_is_one_line_naming_the_field(real_ckpt, tmp_path, template, words):
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    with pytest.raises(CheckpointError) as error:
        load_tokenizer(tmp_path)
    assert words in str(error.value) and "tokenizer_config.json" in str(error.value) and "\n" not in str(error.value)


def test_an_empty_chat_template_file_is_one_line(real_ckpt, tmp_path):
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "chat_template.jinja").write_text("\n")
    with pytest.raises(CheckpointError, match=r"chat_template\.jinja: empty; expected a jinja2 chat template"):
        load_tokenizer(tmp_path)


def test_eos_ids_from_generation_config_list(real_ckpt, tmp_path):
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}, "bos_token": "<|im_start|>"}))
    tok = load_tokenizer(tmp_path)
    assert tok.eos_token_ids == [2, 0] and tok.bos_token_id == 1
    (tmp_path / "generation_config.json").unlink()
    assert load_tokenizer(tmp_path).eos_token_ids == [2]  # falls back to tokenizer_config.json's eos_token


def test_template_uses_transformers_jinja_conventions(real_ckpt, tmp_path):
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    template = ("{% for m in messages %}{{ m | tojson }}\n{% endfor %}"
                "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = load_tokenizer(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "<b>&é"}]) == '{"role": "user", "content": "<b>&é"}\n'
    with pytest.raises(CheckpointError) as error:  # raise_exception: the template refuses the messages
        tok.render_chat(QUESTION * 2)
    assert str(error.value) == f"{tmp_path}/tokenizer_config.json: chat_template refused the messages: one message only"


@pytest.mark.parametrize("template, says", [
    ("{% for m in messages %}{{ m.content }}", "chat_template does not parse (Unexpected end of template."),
    ("{{ no_such_thing.content }}", "chat_template uses an undefined name ('no_such_thing' is undefined)"),
    ("{{ no_such_function() }}", "chat_template uses an undefined name ('no_such_function' is undefined)"),
    ("{{ messages[0]['content'] + 1 }}", "chat_template failed while rendering (TypeError: "),
    ("{{ raise_exception('roles must\nalternate') }}", "chat_template refused the messages: roles must alternate"),
])
def test_a_broken_chat_template_is_one_line_naming_it(real_ckpt, tmp_path, template, says):
    """A template that does not parse, names what it is not given, fails or raises: a CheckpointError
    naming tokenizer_config.json's chat_template, in one line. A bare undefined name renders as ''
    (transformers' jinja2 settings), so it is not an error."""
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    with pytest.raises(CheckpointError) as error:
        load_tokenizer(tmp_path).apply_chat_template(QUESTION)
    message = str(error.value)
    assert message.startswith(f"{tmp_path}/tokenizer_config.json: {says}") and "\n" not in message
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "[{{ undefined_name }}]"}))
    assert load_tokenizer(tmp_path).render_chat(QUESTION) == "[]"


def test_encode_refuses_text_without_a_utf8_form(tok):
    from minispec.errors import MinispecError

    with pytest.raises(MinispecError) as error:
        tok.encode("ok \udcff")  # a lone surrogate: what undecodable bytes become in Python
    assert str(error.value) == ("text: not valid Unicode (a lone surrogate, U+DCFF, at character 3: bytes that were "
                                "not UTF-8); expected UTF-8 text")
    with pytest.raises(MinispecError, match="text: bytes; expected a str"):
        tok.encode(b"hello")


@pytest.mark.parametrize("file, content, field", [
    ("generation_config.json", {"eos_token_id": "two"}, "eos_token_id"),
    ("generation_config.json", {"eos_token_id": [2, 49152]}, "eos_token_id"),
    ("generation_config.json", {"eos_token_id": True}, "eos_token_id"),
    ("generation_config.json", {"bos_token_id": -1}, "bos_token_id"),
    ("config.json", {"eos_token_id": [2.0]}, "eos_token_id"),
    ("config.json", {"eos_token_id": "2"}, "eos_token_id"),
])
def test_bos_and_eos_ids_must_be_ids_of_this_vocabulary(real_ckpt, tmp_path, file, content, field):
    """A string is not a list of ids (it used to become ['t', 'w', 'o']); every file read is checked."""
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / file).write_text(json.dumps(content))
    with pytest.raises(CheckpointError) as error:
        load_tokenizer(tmp_path)
    assert str(error.value) == (f"{tmp_path / file}: field '{field}' = {content[field]!r}; expected a token id (an "
                                "integer) or a list of them, each 0 <= id < 49152 (the tokenizer's vocabulary)")


@pytest.mark.parametrize("content, field", [({"eos_token": 5}, "eos_token"), ({"bos_token": {"content": 1}}, "bos_token"),
                                            ({"chat_template": 42}, "chat_template")])
def test_token_strings_and_template_of_the_wrong_type(real_ckpt, tmp_path, content, field):
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(content))
    with pytest.raises(CheckpointError) as error:
        load_tokenizer(tmp_path)
    assert str(error.value).startswith(f"{tmp_path}/tokenizer_config.json: field '{field}' = ")


def test_matches_transformers_tokenizer_on_the_same_folder(tok, real_ckpt):
    transformers = pytest.importorskip("transformers", reason="the reference tokenizer (pip install -e .[test])")
    hf = transformers.AutoTokenizer.from_pretrained(str(real_ckpt))
    for text in SAMPLES:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False), text
    assert tok.apply_chat_template(QUESTION) == list(hf.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False))
    for with_prompt in (True, False):  # both settings of the generation prompt, as transformers renders them
        assert tok.apply_chat_template(QUESTION, add_generation_prompt=with_prompt) == list(hf.apply_chat_template(
            QUESTION, add_generation_prompt=with_prompt, tokenize=True, return_dict=False)), with_prompt


def test_the_generation_prompt_is_the_assistant_header_and_nothing_else(tok):
    """apply_chat_template(add_generation_prompt=False) is the conversation alone; True adds exactly
    the assistant's header after it (the ids of render_chat's text in both cases)."""
    for messages in (QUESTION, [{"role": "system", "content": "Be brief."}, *QUESTION]):
        without = tok.apply_chat_template(messages, add_generation_prompt=False)
        with_prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert without == tok.encode(tok.render_chat(messages, add_generation_prompt=False))
        assert with_prompt == tok.encode(tok.render_chat(messages, add_generation_prompt=True))
        assert with_prompt[:len(without)] == without and tok.decode(with_prompt[len(without):]) == "<|im_start|>assistant\n"


# ---------------------------------------------------------------- draft/target vocabulary check

WORDS = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "mat", "<|im_end|>"]


def small_tokenizer(folder, words=WORDS, extra=0, eos="</s>", special=("<s>", "</s>", "<|im_end|>")):
    """A word-level tokenizer folder (tokenizer.json + tokenizer_config.json) read back by load_tokenizer:
    `words` get ids 0.., then `extra` filler words; `special` are added as special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {word: i for i, word in enumerate([*words, *(f"w{i}" for i in range(extra))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(list(special))
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": eos}))
    return load_tokenizer(folder)


def check(draft, target):
    check_same_vocabulary(draft, target, "--draft weights/d", "--ckpt weights/t")


def one_line_error(draft, target) -> str:
    with pytest.raises(CheckpointError) as error:
        check(draft, target)
    message = str(error.value)
    assert "\n" not in message and message.startswith("--draft weights/d: ") and "(--ckpt weights/t)" in message
    return message


def test_same_vocabulary_passes_and_small_size_differences_are_tolerated(tmp_path):
    target = small_tokenizer(tmp_path / "t", extra=5)
    check(small_tokenizer(tmp_path / "d", extra=5), target)
    check(small_tokenizer(tmp_path / "shorter", extra=2), target)  # 3 fewer tokens: padding-sized, allowed


def test_a_differing_token_string_names_the_id_and_both_strings(tmp_path):
    words = [*WORDS[:4], "dog", *WORDS[5:]]  # id 4: 'cat' -> 'dog'
    message = one_line_error(small_tokenizer(tmp_path / "d", words), small_tokenizer(tmp_path / "t"))
    assert "token 4 is 'dog' in the draft's tokenizer but 'cat' in the target's" in message


def test_differing_eos_ids_are_an_error(tmp_path):
    message = one_line_error(small_tokenizer(tmp_path / "d", eos="<|im_end|>"), small_tokenizer(tmp_path / "t"))
    assert "eos token ids are [8] in the draft's tokenizer but [2] in the target's" in message


def test_a_token_special_in_one_only_is_an_error(tmp_path):
    draft = small_tokenizer(tmp_path / "d", special=("<s>", "</s>"))  # '<|im_end|>' an ordinary word here
    message = one_line_error(draft, small_tokenizer(tmp_path / "t"))
    assert "token 8 ('<|im_end|>') is an ordinary token in the draft's tokenizer but a special added token" in message


def test_sizes_further_apart_than_padding_are_an_error(tmp_path):
    message = one_line_error(small_tokenizer(tmp_path / "d"),
                             small_tokenizer(tmp_path / "t", extra=VOCAB_SIZE_TOLERANCE + 1))
    assert f"the draft's tokenizer has 9 tokens and the target's (--ckpt weights/t) {9 + VOCAB_SIZE_TOLERANCE + 1}" in message


def test_the_real_tokenizer_matches_itself(real_tokenizer):
    check(real_tokenizer, real_tokenizer)


def test_a_folders_chat_template_jinja_is_its_template_and_wins_over_the_field(real_ckpt, tmp_path):
    """chat_template.jinja (where transformers 5 writes the template): read as the template, ahead of
    tokenizer_config.json's field; its errors name the file; a file that is not UTF-8 is one line."""
    shutil.copy(real_ckpt / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "field:{{ messages[0].content }}"}))
    assert load_tokenizer(tmp_path).render_chat(QUESTION) == "field:" + QUESTION[0]["content"]
    (tmp_path / "chat_template.jinja").write_text("file:{% for m in messages %}{{ m.role }}={{ m.content }}{% endfor %}",
                                                 encoding="utf-8")
    tok = load_tokenizer(tmp_path)
    assert tok.render_chat(QUESTION) == "file:user=" + QUESTION[0]["content"]
    assert tok.apply_chat_template(QUESTION) == tok.encode(tok.render_chat(QUESTION))
    (tmp_path / "tokenizer_config.json").unlink()  # the file alone is enough
    assert load_tokenizer(tmp_path).render_chat(QUESTION).startswith("file:")
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}")
    with pytest.raises(CheckpointError) as error:
        load_tokenizer(tmp_path).render_chat(QUESTION)
    assert str(error.value).startswith(f"{tmp_path / 'chat_template.jinja'} does not parse") and "\n" not in str(error.value)
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(CheckpointError, match=r"chat_template\.jinja: cannot be read .*expected a UTF-8 jinja2"):
        load_tokenizer(tmp_path)
