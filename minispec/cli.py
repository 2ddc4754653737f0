"""What every minispec command line shares: one-line errors, range-checked flags, one exit path.

    parser = Parser(prog="minispec.generate", description=...)
    parser.add_argument("--gamma", type=ranged(int, "--gamma", lo=1), default=5)
    args = parser.parse_args(argv)
    sys.exit(run_main("minispec.generate", lambda: body(args)))

A user mistake ends in one line on stderr, `<prog>: error: <message>`, and exit status 2:
argparse's own errors (no usage dump), an out-of-range flag, and any MinispecError raised while
running. Ctrl-C ends in one line, `<prog>: interrupted`, and exit status 130 (128 + SIGINT, what
a shell reports); a reader that closes our stdout early (`... | head`) ends the command quietly
with exit status 141 (128 + SIGPIPE, as `yes | head` does). Anything else that escapes is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from typing import Callable

from minispec.errors import MinispecError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows a flag's default in `-h` unless it is None or a switch's False (its help says those);
    the epilog is printed as written (a table of equivalent flags keeps its columns)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool) or action.default == []:
            return action.help
        if action.help is None and action.option_strings:  # a flag without help still shows its default
            return "(default: %(default)s)"
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and the defaults shown in `-h`."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def nonempty(flag: str, what: str, kind: Callable[[str], object] = str) -> Callable[[str], object]:
    """An argparse type: refuse an empty or blank value (which Path would read as the current folder)."""

    def parse(text: str):
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected {what}")
        return kind(text)

    return parse


def ranged(kind: type, flag: str, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False) -> Callable[[str], int | float]:
    """An argparse type: parse `kind` (int or float) and check lo <= value <= hi (< with *_open).

    The error names the flag and the range, e.g. `--top-p = 1.5; expected 0 < top-p <= 1`.
    nan and inf are rejected for floats unless the range leaves them open (hi=None, lo=None).
    """

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} = {text!r}; expected {'an integer' if kind is int else 'a number'}") from None
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        too_high = hi is not None and (value >= hi if hi_open else value > hi)
        if too_low or too_high or (kind is float and math.isnan(value)):
            lo_s = "" if lo is None else f"{lo} {'<' if lo_open else '<='} "
            hi_s = "" if hi is None else f" {'<' if hi_open else '<='} {hi}"
            raise argparse.ArgumentTypeError(f"{flag} = {text}; expected {lo_s}{flag.lstrip('-')}{hi_s}")
        return value

    return parse


def given_flags(parser: argparse.ArgumentParser, argv: list[str] | None) -> frozenset[str]:
    """The dest names of the flags actually given in argv (not filled in from their defaults).

    Parses argv a second time with every default suppressed: what is left was typed.
    """
    saved = {action: action.default for action in parser._actions}
    try:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
        given = vars(parser.parse_args(argv))
    finally:
        for action, default in saved.items():
            action.default = default
    return frozenset(given)


def in_flags(message: str, flags: dict[str, str]) -> str:
    """A library message in a command's words. The library names its arguments as `name=value`
    (`draft='foo': unknown drafter`); each `name=` whose name is in `flags` (the API's name -> the
    flag that sets it) reads `--flag value` instead, and a switch's `name=True` reads `--flag`. The
    one place where the CLI's words replace the API's."""
    if not flags:
        return message
    names = "|".join(re.escape(name) for name in sorted(flags, key=len, reverse=True))
    return re.sub(rf"(?<![\w.-])({names})=(?!=)(True\b)?(?=(.?))",  # (.?): what follows, for the space
                  lambda m: flags[m.group(1)] + ("" if m.group(2) or m.group(3) in ("", " ", ",", ";", ")") else " "),
                  message)


def run_main(prog: str, body: Callable[[], int | None], flags: dict[str, str] | None = None) -> int:
    """Run a command's body and return its exit status.

    A MinispecError becomes `<prog>: error: <message>` (one line, in the command's words: in_flags
    with `flags`) and 2; Ctrl-C (KeyboardInterrupt,
    wherever it lands) becomes `<prog>: interrupted` and 130, after whatever the body printed on its
    way out; a closed stdout (BrokenPipeError) ends quietly with 141.
    """
    previous = _remember_interrupts()
    try:
        code = body() or 0
        sys.stdout.flush()  # a closed pipe shows up here, not in the interpreter's own flush at exit
        return code
    except MinispecError as err:
        print(f"{prog}: error: {in_flags(' '.join(str(err).splitlines()), flags or {})}", file=sys.stderr)  # one line
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return 141
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


_interrupted = False  # set by run_main's SIGINT handler


def _remember_interrupts():
    """Make Ctrl-C raise KeyboardInterrupt as usual, and also remember it: torch's import swallows a
    KeyboardInterrupt that lands in some of its try/excepts, and the run would then go on as if
    nothing happened. raise_if_interrupted() raises it again after such an import. Returns the
    previous handler (None where signals cannot be set: not the main thread)."""
    global _interrupted
    _interrupted = False

    def on_sigint(signum, frame):
        global _interrupted
        _interrupted = True
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread
        return None


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed under run_main (call it after importing torch)."""
    if _interrupted:
        raise KeyboardInterrupt


def read_all(file) -> bytes:
    """Every byte of an open binary file (a FIFO or stdin included), so that Ctrl-C interrupts a
    read that waits for a writer whichever thread the signal lands on.

    A process-wide SIGINT may be delivered to any thread; once torch's OpenMP pool exists it often
    lands on a worker, and a main thread blocked in read() is then never interrupted, so Python
    never runs its handler. Waiting in select() with a short timeout returns the main thread to
    Python every 0.1 s, where the pending handler runs. Streams without a file descriptor (a test's
    BytesIO) and non-POSIX systems are read at once.
    """
    try:
        fd = file.fileno()
    except (OSError, AttributeError, ValueError):  # io.UnsupportedOperation is an OSError
        return file.read()
    if os.name != "posix":
        return file.read()
    import select

    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still buffered does not
    fail a second time (the recipe in Python's `signal` documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (a test's capture): nothing to do
        pass
