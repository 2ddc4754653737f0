"""What every minispec command line shares: one-line errors, range-checked flags, one exit path.

    parser = Parser(prog="minispec.generate", description=...)
    parser.add_argument("--gamma", type=ranged(int, "--gamma", lo=1), default=5)
    args = parser.parse_args(argv)
    sys.exit(run_main("minispec.generate", lambda: body(args)))

A user mistake ends in one line on stderr, `<prog>: error: <message>`, and exit status 2:
argparse's own errors (no usage dump), an out-of-range flag, and any MinispecError raised while
running. Ctrl-C ends in one line, `<prog>: interrupted`, and exit status 130 (128 + SIGINT, what
a shell reports); SIGTERM (what `timeout`, systemd, `docker stop` and CI send) runs the same
cleanup as Ctrl-C and ends in `<prog>: terminated`, exit status 143; a reader that closes our
stdout early (`... | head`) ends the command quietly with exit status 141 (128 + SIGPIPE, as
`yes | head` does). Anything else that escapes is a bug and keeps its traceback.

The rules every command applies to what a user hands it, each written once:

    read_file(path, field, limit)          a regular file or a pipe, at most `limit` bytes; a named
                                           pipe with no writer never blocks; a device or folder refused
    load_object(spec, field)               `module:attribute`, whatever importing it raises
    parse_options(text, field)             NAME[:key=value,...] -> (NAME, {key: text}), a key given once
    split_specs(text)                      a comma-separated list of those, commas inside options kept
    extra(module, name, purpose)           an optional dependency's import, or one line naming the extra
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path
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
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return 141
    finally:
        for signum, handler in (previous or {}).items():
            signal.signal(signum, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM under run_main: a KeyboardInterrupt, so that every cleanup written for Ctrl-C (a
    conversion's temporary folder and lock, a half-written output) runs for it too."""


_interrupted = False  # set by run_main's SIGINT handler


def _remember_interrupts() -> dict | None:
    """Make Ctrl-C raise KeyboardInterrupt as usual (SIGTERM: Terminated, a KeyboardInterrupt), and
    also remember it: torch's import swallows a KeyboardInterrupt that lands in some of its
    try/excepts, and the run would then go on as if nothing happened. raise_if_interrupted() raises
    it again after such an import. Returns the previous handlers (None where signals cannot be set:
    not the main thread)."""
    global _interrupted
    _interrupted = False

    def on_signal(signum, frame):
        global _interrupted
        _interrupted = True
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    try:
        return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
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
    return _read_interruptibly(fd)


def _read_interruptibly(fd: int, limit: int | None = None, patience: float | None = None) -> bytes:
    """Every byte of `fd`, waiting in select() slices of 0.1 s (read_all says why). OverflowError past
    `limit` bytes; TimeoutError when nothing comes for `patience` seconds (a pipe with no writer)."""
    import select

    chunks, size, quiet_since = [], 0, time.monotonic()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        try:
            chunk = os.read(fd, 1 << 16) if ready else None
        except BlockingIOError:  # a named pipe opened without waiting, no writer yet
            chunk = None
        if chunk is None:
            if patience is not None and time.monotonic() - quiet_since > patience:
                raise TimeoutError
            continue
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if limit is not None and size > limit:
            raise OverflowError
        chunks.append(chunk)
        quiet_since = time.monotonic()


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still buffered does not
    fail a second time (the recipe in Python's `signal` documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (a test's capture): nothing to do
        pass


# ------------------------------------------------------------------ what users hand a command

PIPE_WAIT_SECONDS = 10.0  # how long a named pipe may keep its first byte


def read_file(path, field: str, limit: int) -> bytes:
    """The bytes of a user's or a cache's file: a regular file or a pipe (a named pipe, `<(cmd)`,
    /dev/stdin), at most `limit` bytes. A folder, a device (/dev/zero never ends) or a socket is
    refused; a named pipe is opened without waiting for a writer, and one that sends nothing for
    PIPE_WAIT_SECONDS is refused, so no read ever blocks for good. Every refusal is a MinispecError
    naming `field` and the path."""
    path = Path(path)
    try:
        kind = os.stat(path).st_mode
    except OSError as err:
        raise MinispecError(f"{field} {path}: cannot be read ({err.strerror or err}); expected a file") from None
    if stat.S_ISDIR(kind):
        raise MinispecError(f"{field} {path}: a folder; expected a file")
    if not (stat.S_ISREG(kind) or stat.S_ISFIFO(kind)):
        raise MinispecError(f"{field} {path}: not a regular file or a pipe (a device or a socket); expected a file")
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_NONBLOCK if stat.S_ISFIFO(kind) else 0))
    except OSError as err:
        raise MinispecError(f"{field} {path}: cannot be read ({err.strerror or err}); expected a readable file") from None
    try:
        return _read_interruptibly(fd, limit, PIPE_WAIT_SECONDS if stat.S_ISFIFO(kind) else None)
    except OverflowError:
        raise MinispecError(f"{field} {path}: more than {limit} bytes; expected a file of at most {limit} bytes") from None
    except TimeoutError:
        raise MinispecError(f"{field} {path}: a pipe that sent nothing for {PIPE_WAIT_SECONDS:.0f} s; expected a "
                            "file, or a pipe with a writer") from None
    except OSError as err:
        raise MinispecError(f"{field} {path}: cannot be read ({err.strerror or err}); expected a file") from None
    finally:
        os.close(fd)


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def load_object(spec: str, field: str):
    """`module:attribute` -> the object it names. Every way it can fail (no colon, an empty or
    relative module, a syntax error or any exception while importing, a missing attribute) is one
    MinispecError naming `field`; the caller checks what kind of object it got."""
    module, colon, attribute = spec.partition(":")
    if not colon or not MODULE_NAME.fullmatch(module) or not MODULE_NAME.fullmatch(attribute):
        raise MinispecError(f"{field} {spec!r}: expected module:attribute (an importable, absolute module and a "
                            "name in it)")
    try:
        found = importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - user code: any failure of its import is the user's to see
        raise MinispecError(f"{field} {spec!r}: importing {module} failed ({type(err).__name__}: "
                            f"{' '.join(str(err).split())})") from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except Exception as err:  # noqa: BLE001 - a module __getattr__ may raise anything
            raise MinispecError(f"{field} {spec!r}: {module} has no {attribute} ({type(err).__name__})") from None
    return found


OPTION_KEY = re.compile(r"\s*[A-Za-z_][\w-]*\s*=")


def parse_options(text: str, field: str) -> tuple[str, dict[str, str]]:
    """NAME[:key=value,...] -> (NAME, {key: value text}). A key given twice, an item that is not
    key=value, an empty name or a colon with nothing after it is a MinispecError naming `field`.
    The values stay text: the caller types them (minispec.generate.policy_spec for policies)."""
    name, colon, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise MinispecError(f"{field} {text!r}: no name before the options; expected NAME[:key=value,...]")
    if colon and not rest.strip():
        raise MinispecError(f"{field} {text!r}: expected key=value after the colon, or no colon")
    options: dict[str, str] = {}
    for item in rest.split(",") if colon else []:
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key:
            raise MinispecError(f"{field} {text!r}: {item!r} is not key=value")
        if key in options:
            raise MinispecError(f"{field} {name}: option {key!r} given twice")
        options[key] = value.strip()
    return name, options


def split_specs(text: str) -> list[str]:
    """A comma-separated list of NAME[:key=value,...]: an item that starts with `key=` continues the
    options of the one before it, so `dropmatch:p=0.3,paths=5,exact` is two specs, not three."""
    specs: list[str] = []
    for item in text.split(","):
        if specs and OPTION_KEY.match(item) and ":" in specs[-1]:
            specs[-1] += "," + item
        else:
            specs.append(item)
    return [spec.strip() for spec in specs if spec.strip()]


def extra(module: str, name: str, purpose: str):
    """Import an optional dependency, or raise one MinispecError naming the extra that installs it:
    `pip install 'minispec[NAME]'`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MinispecError(f"{purpose} needs {module.split('.')[0]}, which is not installed; expected "
                            f"pip install 'minispec[{name}]'") from None
