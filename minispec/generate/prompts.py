"""The command line's prompts: --prompt, or --prompt-file (a path or - for stdin) read as UTF-8,
one prompt or (with --batch-size) one per line, each encoded in the checkpoint's chat template
unless --raw. Every mistake is one line naming the flag, the file and the line."""

from __future__ import annotations

import sys

from minispec.errors import MinispecError
from minispec.generate.flags import GenerateArgs


PROMPT_FILE_BYTES = 64 << 20  # a prompt file's cap: far beyond any context window's worth of text


def prompt_lines(args: GenerateArgs) -> list[tuple[int, str]]:
    """--prompt-file with --batch-size: (line number from 1, text) of every line that is not blank."""
    lines = [(number, line) for number, line in enumerate(split_lines(read_prompt_file(args)), start=1)
             if line.strip()]
    if not lines:
        raise MinispecError(f"--prompt-file {args.prompt_file}: no prompts (every line is blank); expected one "
                            "prompt per line with --batch-size")
    return lines


def split_lines(text: str) -> list[str]:
    """A prompt file's lines: split at "\n" (a "\r\n" ending counts as one), and at nothing else.
    (str.splitlines would also split at U+2028, U+0085, form feeds and lone "\r": characters a
    prompt may hold.)"""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def decode_utf8(data: bytes, what: str) -> str:
    """UTF-8 bytes as text, a leading byte-order mark dropped (editors write one; it is no part of the
    prompt); a bad byte is a one-line error naming its line and column."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise MinispecError(f"{what}: line {line}, column {column} (byte {err.start}): byte "
                            f"0x{data[err.start]:02x} is not UTF-8 ({err.reason}); expected UTF-8 text") from None
    return text.removeprefix("\ufeff")


def read_prompt(args: GenerateArgs, tokenizer) -> list[int]:
    """The prompt's token ids: the text from --prompt, --prompt-file or stdin (as UTF-8), encoded by _encode."""
    where = "--prompt" if args.prompt_file is None else f"--prompt-file {args.prompt_file}"
    return encode(args, tokenizer, args.prompt if args.prompt_file is None else read_prompt_file(args), where)


def read_prompt_file(args: GenerateArgs) -> str:
    """--prompt-file's text, as UTF-8 ('-': stdin)."""
    if str(args.prompt_file) == "-":
        return read_stdin()
    from minispec.cli import read_file

    return decode_utf8(read_file(args.prompt_file, "--prompt-file", PROMPT_FILE_BYTES), f"--prompt-file {args.prompt_file}")


def encode(args: GenerateArgs, tokenizer, prompt: str, where: str) -> list[int]:
    """A prompt's token ids: in the chat template unless --raw (or the checkpoint has none).
    --system "" is an empty system message. A prompt of no tokens is one line naming `where` (the flag)."""
    chat = bool(tokenizer.chat_template) if args.chat is None else args.chat
    if not chat:
        if args.system is not None:
            raise MinispecError(f"--system: a chat-template message, but {tokenizer.source} has no chat template; "
                                "expected a chat checkpoint")
        ids = tokenizer.encode(prompt)
    else:
        system = [] if args.system is None else [{"role": "system", "content": args.system}]
        ids = tokenizer.apply_chat_template([*system, {"role": "user", "content": prompt}])
    if not ids:
        raise MinispecError(f"{where}: {prompt!r} is no tokens{' with --raw' if args.chat is False else ''}; "
                            "expected a prompt with some text")
    return ids


def read_stdin() -> str:
    """--prompt-file -: stdin's bytes decoded as UTF-8, whatever the locale's encoding and error handler.
    A closed stdin (no descriptor 0: sys.stdin is None, or a closed stream) is one line."""
    if sys.stdin is None or getattr(sys.stdin, "closed", False):
        raise MinispecError("--prompt-file -: standard input is closed; expected the prompts on stdin (a pipe or a "
                            "file), or --prompt-file FILE")
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream without bytes underneath (a test's StringIO)
        from minispec.checkpoints.tokenizer import check_text

        return check_text(sys.stdin.read(), "--prompt-file - (stdin)")
    from minispec.cli import read_all

    return decode_utf8(read_all(stream), "--prompt-file - (stdin)")
