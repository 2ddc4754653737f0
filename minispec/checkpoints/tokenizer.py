"""Tokenizer: a thin wrapper on a checkpoint's tokenizer.json, plus its jinja2 chat template.

    tok = load_tokenizer("weights/smollm2-135m-instruct")
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    stream = tok.stream_decoder()
    for token_id in generated: print(stream.push(token_id), end="", flush=True)
    print(stream.flush())

`encode` never adds BOS/EOS (the chat template writes what the model needs), but special-token
strings in the text, such as "<|im_start|>", are recognised as their single ids.
The chat template is rendered the way transformers does it (sandboxed jinja2, trim_blocks and
lstrip_blocks, `raise_exception`, a `tojson` that does not escape HTML), so the ids equal
`AutoTokenizer.apply_chat_template(..., tokenize=True)` for the same folder. A template that does
not parse, calls `raise_exception`, or fails while rendering is a CheckpointError naming where the
template came from (a bare undefined name renders as '', as in transformers): the folder's
chat_template.jinja where it has one (transformers 5 and newer hub folders keep it there; it wins
over the field, as in transformers), else tokenizer_config.json's chat_template.

What is read is checked where it is read: bos/eos ids must be token ids of this vocabulary (from
generation_config.json, tokenizer_config.json's token strings or config.json, in that order of
preference), and text to encode must be valid Unicode (a lone surrogate has no UTF-8 form).

`check_same_vocabulary(draft, target, ...)` is the check a separate draft model needs: the two
models exchange token ids, never text, so every id must be the same token for both.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from minispec.cli import read_file
from minispec.checks import is_int
from minispec.errors import CheckpointError, MinispecError

REPLACEMENT_CHAR = "\ufffd"  # what a decode of an incomplete UTF-8 sequence ends with

# How many more tokens one of a draft/target pair may have than the other: the amount llama.cpp's
# speculative decoding allows (SPEC_VOCAB_MAX_SIZE_DIFFERENCE), for tokenizers that append a few
# extra tokens after a shared vocabulary.
VOCAB_SIZE_TOLERANCE = 128


class Tokenizer:
    """Text <-> token ids for one checkpoint, with its special tokens and chat template."""

    def __init__(self, backend, *, chat_template: str | None = None, bos_token: str | None = None,
                 eos_token: str | None = None, bos_token_id: int | None = None, eos_token_ids: list[int] | None = None,
                 source: str = "tokenizer", template_source: str | None = None):
        self.backend = backend  # a tokenizers.Tokenizer
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(eos_token_ids or [])  # generation stops at any of these
        self.source = source  # the folder, for error messages
        # where the chat template came from, for error messages: a file, or a file and its field
        self.template_source = template_source or f"{source}/tokenizer_config.json: chat_template"
        self._template = None  # compiled lazily

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included (the model's may be larger, padded)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def added_token_ids(self) -> list[int]:
        """The ids of the added tokens (special or not: <|im_end|>, <tool_call>, ...), ascending."""
        return sorted(self.backend.get_added_tokens_decoder())

    def encode(self, text: str) -> list[int]:
        """Token ids for `text`; special-token strings become their ids, nothing else is added."""
        check_text(text, "text")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **variables) -> str:
        """The chat template rendered as text, e.g. '<|im_start|>system\\n...<|im_start|>assistant\\n'."""
        if not self.chat_template:
            raise CheckpointError(f"{self.source}/tokenizer_config.json: no 'chat_template' field (and no "
                                  "chat_template.jinja); expected a jinja2 chat template (or use plain text prompts)")
        import jinja2

        where = self.template_source
        try:
            if self._template is None:
                self._template = _compile_chat_template(self.chat_template)
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "", **variables)
        except jinja2.TemplateSyntaxError as err:
            raise CheckpointError(f"{where} does not parse ({_one_line(err.message)} at line {err.lineno}); "
                                  "expected a jinja2 template") from None
        except jinja2.UndefinedError as err:
            raise CheckpointError(f"{where} uses an undefined name ({_one_line(err.message)}); expected a template "
                                  "that uses only messages, add_generation_prompt, bos_token, eos_token and the "
                                  "variables passed") from None
        except _TemplateRaised as err:
            raise CheckpointError(f"{where} refused the messages: {_one_line(err.message)}") from None
        except Exception as err:  # the template's own code failed (a TypeError in an expression, ...)
            raise CheckpointError(f"{where} failed while rendering ({type(err).__name__}: {_one_line(str(err))})") from None

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **variables) -> list[int]:
        """Token ids of the rendered chat: the prompt to feed the model."""
        return self.encode(self.render_chat(messages, add_generation_prompt, **variables))

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)


class StreamDecoder:
    """Incremental detokenization for streaming: only complete UTF-8 text is ever emitted.

    One token can hold half of a multi-byte character (byte-level BPE splits emoji and CJK), and
    decoding it alone gives U+FFFD. So we decode a short window of ids (from the last point where
    the text was complete) and emit the new suffix only once it no longer ends in U+FFFD. The
    window keeps each step O(new tokens), not O(all tokens). Concatenated pushes plus `flush()`
    equal `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: ids before it are emitted and complete
        self.read_offset = 0  # ids before it have been emitted

    def push(self, ids: int | list[int]) -> str:
        """Add one or more token ids; return the newly completed text ('' while a character is pending)."""
        self.ids.extend([ids] if isinstance(ids, int) else ids)
        emitted = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) <= len(emitted) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(emitted):]

    def flush(self) -> str:
        """Emit whatever is pending, incomplete characters included (as U+FFFD); call at the end."""
        emitted = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(emitted):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


def load_tokenizer(path: str | Path, revision: str | None = None) -> Tokenizer:
    """Read tokenizer.json (required) and tokenizer_config.json, generation_config.json, config.json (optional).

    `path`: a checkpoint folder or a hub repo id 'owner/name[@revision]' (minispec.checkpoints.hub).
    """
    from tokenizers import Tokenizer as Backend

    from minispec.checkpoints.hub import resolve_checkpoint

    folder = resolve_checkpoint(path, revision, what="checkpoint")
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise CheckpointError(f"{tokenizer_file}: no such file; expected the checkpoint's tokenizer (tokenizers JSON)")
    try:
        backend = Backend.from_file(str(tokenizer_file))
    except Exception as error:  # tokenizers raises a bare Exception on bad JSON
        raise CheckpointError(f"{tokenizer_file}: cannot be read ({str(error).splitlines()[0]}); expected a tokenizers JSON file") from None
    files = {name: folder / f"{name}.json" for name in ("tokenizer_config", "generation_config", "config")}
    tok_config, gen_config, model_config = (_read_json(file) for file in files.values())
    vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def ids(config: dict, name: str, field: str) -> list[int]:
        return _token_ids(config.get(field), vocab_size, f"{files[name]}: field '{field}'")

    bos_token, eos_token = (_token_string(tok_config.get(field), f"{files['tokenizer_config']}: field '{field}'")
                            for field in ("bos_token", "eos_token"))
    for field, token in (("bos_token", bos_token), ("eos_token", eos_token)):
        if token and backend.token_to_id(token) is None:  # dropped, it would leave a run with no eos to stop at
            raise CheckpointError(f"{files['tokenizer_config']}: field '{field}' = {token!r} is not a token of "
                                  f"{tokenizer_file.name}; expected one of its tokens (e.g. an added token)")
    bos_ids = _first_set(ids(gen_config, "generation_config", "bos_token_id"), _ids_of(backend, bos_token),
                         ids(model_config, "config", "bos_token_id"))
    eos_ids = _first_set(ids(gen_config, "generation_config", "eos_token_id"), _ids_of(backend, eos_token),
                         ids(model_config, "config", "eos_token_id"))
    chat_template = _template_string(tok_config.get("chat_template"), files["tokenizer_config"])
    template_source = None
    jinja_file = folder / "chat_template.jinja"  # where transformers 5 and newer hub folders keep it
    if jinja_file.is_file():  # it wins over tokenizer_config.json's field, as in transformers
        chat_template, template_source = _read_template_file(jinja_file), str(jinja_file)
    return Tokenizer(backend, chat_template=chat_template, bos_token=bos_token, eos_token=eos_token,
                     bos_token_id=bos_ids[0] if bos_ids else None, eos_token_ids=eos_ids, source=str(folder),
                     template_source=template_source)


def _read_template_file(path: Path) -> str:
    """A chat_template.jinja file's text (UTF-8), or a one-line CheckpointError naming it."""
    try:
        text = read_file(path, "chat template", 1 << 20).decode("utf-8")
        if not text.strip():
            raise CheckpointError(f"{path}: empty; expected a jinja2 chat template (or no such file)")
        return text
    except CheckpointError:
        raise
    except (MinispecError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise CheckpointError(f"{path}: cannot be read ({reason}); expected a UTF-8 jinja2 chat template") from None


def check_text(text: str, what: str) -> str:
    """`text`, if it is a str with a UTF-8 form; else a MinispecError naming `what` (a flag, a file, "text").

    A lone surrogate (U+D800..U+DFFF) has none: Python makes them from undecodable bytes (a file read
    with errors="surrogateescape", sys.argv on POSIX), and the tokenizer cannot take them.
    """
    if not isinstance(text, str):
        raise MinispecError(f"{what}: {type(text).__name__}; expected a str")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise MinispecError(f"{what}: not valid Unicode (a lone surrogate, U+{ord(text[err.start]):04X}, at character "
                            f"{err.start}: bytes that were not UTF-8); expected UTF-8 text") from None
    return text


def check_same_vocabulary(draft: Tokenizer, target: Tokenizer, draft_name: str, target_name: str) -> None:
    """Raise CheckpointError unless the draft's tokenizer gives every token id the target's meaning.

    Speculative decoding hands token ids from the draft model to the target and back, never
    text, so the draft's token i must be the target's token i. As llama.cpp does before it
    drafts with a second model, compare, and report the first difference in one line:
      1. the sizes (added tokens included), at most VOCAB_SIZE_TOLERANCE apart;
      2. the special ids: bos, and eos as a set (the order of a stop list does not matter);
      3. the token string of every id both have, added tokens included;
      4. which of those ids are added tokens, and which of them are special (matched whole in
         text, dropped by decode(skip_special_tokens=True)).
    draft_name / target_name say where each came from in the message, e.g. "--draft weights/x"
    and "--ckpt weights/y": "<draft_name>: ... in the draft's tokenizer but ... in the target's
    (<target_name>); draft and target must share a tokenizer".
    """
    def mismatch(what: str, in_draft, in_target) -> CheckpointError:
        return CheckpointError(f"{draft_name}: {what} {in_draft} in the draft's tokenizer but {in_target} in the "
                               f"target's ({target_name}); draft and target must share a tokenizer")

    n_draft, n_target = draft.vocab_size, target.vocab_size
    if abs(n_draft - n_target) > VOCAB_SIZE_TOLERANCE:
        raise CheckpointError(f"{draft_name}: the draft's tokenizer has {n_draft} tokens and the target's "
                              f"({target_name}) {n_target}, more than {VOCAB_SIZE_TOLERANCE} apart; "
                              "draft and target must share a tokenizer")
    if draft.bos_token_id != target.bos_token_id:
        raise mismatch("the bos token id is", draft.bos_token_id, target.bos_token_id)
    if set(draft.eos_token_ids) != set(target.eos_token_ids):
        raise mismatch("the eos token ids are", draft.eos_token_ids, target.eos_token_ids)

    shared = min(n_draft, n_target)  # ids 0 .. shared-1 exist in both
    draft_tokens, target_tokens = _tokens_by_id(draft, shared), _tokens_by_id(target, shared)
    for token_id, (in_draft, in_target) in enumerate(zip(draft_tokens, target_tokens)):
        if in_draft != in_target:
            shown = ["missing" if token is None else repr(token) for token in (in_draft, in_target)]
            raise mismatch(f"token {token_id} is", *shown)

    draft_added, target_added = _added_kinds(draft, shared), _added_kinds(target, shared)
    for token_id in sorted(draft_added.keys() | target_added.keys()):
        in_draft, in_target = (added.get(token_id, "an ordinary token") for added in (draft_added, target_added))
        if in_draft != in_target:
            raise mismatch(f"token {token_id} ({draft_tokens[token_id]!r}) is", in_draft, in_target)


def _tokens_by_id(tokenizer: Tokenizer, size: int) -> list[str | None]:
    """The token string of each id 0..size-1 (None for an id the vocabulary skips), added tokens included."""
    tokens: list[str | None] = [None] * size
    for token, token_id in tokenizer.backend.get_vocab(with_added_tokens=True).items():
        if token_id < size:
            tokens[token_id] = token
    return tokens


def _added_kinds(tokenizer: Tokenizer, size: int) -> dict[int, str]:
    """{id: how the message names its kind} for the added tokens with ids below `size`."""
    return {token_id: "a special added token" if added.special else "an added (non-special) token"
            for token_id, added in tokenizer.backend.get_added_tokens_decoder().items() if token_id < size}


def _read_json(file: Path) -> dict:
    """The JSON object in `file`, or {} if the file is absent."""
    if not file.is_file():
        return {}
    try:
        content = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{file}: invalid JSON ({error}); expected an object") from None
    if not isinstance(content, dict):
        raise CheckpointError(f"{file}: top level is {type(content).__name__}; expected a JSON object")
    return content


def _token_string(value, where: str) -> str | None:
    """tokenizer_config.json writes a token as "<s>" or as {"content": "<s>", ...} (an AddedToken)."""
    token = value.get("content") if isinstance(value, dict) else value
    if token is not None and not isinstance(token, str):
        raise CheckpointError(f"{where} = {value!r}; expected a token string or {{\"content\": token string}}")
    return token


def _ids_of(backend, token: str | None) -> list[int]:
    """[the id of `token`], or [] if it is unset (load_tokenizer refuses a token not in the vocabulary)."""
    token_id = backend.token_to_id(token) if token else None
    return [] if token_id is None else [token_id]


def _token_ids(value, vocab_size: int, where: str) -> list[int]:
    """A bos/eos field (an id, a list of ids, or unset) as a list, every id checked against the vocabulary."""
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(is_int(i) and 0 <= i < vocab_size for i in ids):
        raise CheckpointError(f"{where} = {value!r}; expected a token id (an integer) or a list of them, each "
                              f"0 <= id < {vocab_size} (the tokenizer's vocabulary)")
    return ids


def _first_set(*candidates: list[int]) -> list[int]:
    """The first non-empty candidate list ([] if none is)."""
    return next((ids for ids in candidates if ids), [])


def _template_string(value, file: Path) -> str | None:
    """A chat_template is a string, or a list of {"name", "template"} of which "default" is the one we use."""
    if isinstance(value, list):
        bad = next((i for i, entry in enumerate(value) if not isinstance(entry, dict)), None)
        if bad is not None:
            raise CheckpointError(f"{file}: field 'chat_template' entry {bad} is {type(value[bad]).__name__}; expected "
                                  "a jinja2 template string or a list of {\"name\": ..., \"template\": ...} objects")
        named = {entry.get("name"): entry.get("template") for entry in value}
        if "default" not in named:
            raise CheckpointError(f"{file}: field 'chat_template' list has no entry named 'default'; expected one")
        value = named["default"]
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"{file}: field 'chat_template' = {value!r}; expected a jinja2 template string")
    if value is not None and not value.strip():
        raise CheckpointError(f"{file}: field 'chat_template' is empty; expected a jinja2 template string, or no "
                              "field (plain text prompts)")
    return value


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class _TemplateRaised(Exception):
    """A template's own `raise_exception(message)`: it refuses the messages it was given."""

    def __init__(self, message) -> None:
        super().__init__(message)
        self.message = str(message)


def _compile_chat_template(source: str):
    """Compile a chat template the way transformers does (see its utils/chat_template_utils.py)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise _TemplateRaised(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja2's own tojson escapes HTML characters (<, >, &, '); templates expect plain JSON.
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
