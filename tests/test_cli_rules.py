"""The rules every command applies to what a user hands it (minispec.cli), each written once and
each held as a property: whatever the input, a value or one MinispecError line naming the field,
never a traceback of another kind, never a hang, never a silent pass."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading

import pytest
from hypothesis import given, strategies as st

from minispec import cli
from minispec.errors import MinispecError

KEY = st.from_regex(r"[a-z][a-z_]{0,6}", fullmatch=True)
VALUE = st.from_regex(r"[A-Za-z0-9.:+-]{0,6}", fullmatch=True)  # a value may hold a colon (p=auto:0.9)
NAME = st.from_regex(r"[a-z][a-z-]{0,8}", fullmatch=True)


def one_line(err: MinispecError, field: str) -> None:
    assert "\n" not in str(err) and field in str(err), str(err)


@given(NAME, st.dictionaries(KEY, VALUE, max_size=4))
def test_parse_options_reads_back_what_was_written(name, options):
    text = name + (":" + ",".join(f"{k}={v}" for k, v in options.items()) if options else "")
    assert cli.parse_options(text, "--x") == (name, options)


@given(NAME, st.lists(st.tuples(KEY, VALUE), min_size=2, max_size=4, unique_by=lambda kv: kv[0]))
def test_a_key_given_twice_is_one_line_naming_it(name, items):
    key = items[0][0]
    text = f"{name}:" + ",".join(f"{k}={v}" for k, v in [*items, (key, "1")])
    with pytest.raises(MinispecError) as err:
        cli.parse_options(text, "--x")
    one_line(err.value, "--x")
    assert repr(key) in str(err.value)


@given(st.text(max_size=30))
def test_parse_options_on_any_text_is_a_value_or_one_line(text):
    try:
        name, options = cli.parse_options(text, "--x")
    except MinispecError as err:
        one_line(err, "--x")
    else:
        assert name and ":" not in name and all("=" not in k for k in options)


@given(st.lists(st.tuples(NAME, st.dictionaries(KEY, VALUE, max_size=3)), min_size=1, max_size=4))
def test_split_specs_keeps_the_commas_inside_a_specs_options(specs):
    texts = [name + (":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "") for name, opts in specs]
    assert cli.split_specs(",".join(texts)) == texts


@pytest.mark.parametrize("source, words", [
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ("import no_such_module_anywhere\n", "ModuleNotFoundError"),
    ("def __getattr__(name):\n    raise ValueError(name)\n", "has no thing (ValueError)"),
    ("", "has no thing (AttributeError)"),
])
def test_load_object_turns_every_failure_of_user_code_into_one_line(tmp_path, monkeypatch, source, words):
    module = f"user_module_{abs(hash(source))}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MinispecError) as err:
        cli.load_object(f"{module}:thing", "ENGINE")
    one_line(err.value, "ENGINE")
    assert words in str(err.value)


@given(st.text(max_size=20))
def test_load_object_on_any_spec_is_an_object_or_one_line(spec):
    try:
        cli.load_object(spec, "ENGINE")
    except MinispecError as err:
        one_line(err, "ENGINE")


def test_load_object_finds_a_dotted_attribute():
    assert cli.load_object("os:path.join", "ENGINE") is os.path.join


def test_read_file_refuses_what_is_not_a_file_and_caps_what_is(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 101)
    (tmp_path / "ok").write_bytes(b"x" * 100)
    assert cli.read_file(tmp_path / "ok", "--f", 100) == b"x" * 100
    for path, words in [(tmp_path / "big", "more than 100 bytes"), (tmp_path, "a folder"),
                        ("/dev/zero", "not a regular file or a pipe"), (tmp_path / "gone", "cannot be read")]:
        with pytest.raises(MinispecError) as err:
            cli.read_file(path, "--f", 100)
        one_line(err.value, "--f")
        assert words in str(err.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_read_file_never_blocks_on_a_named_pipe(tmp_path, monkeypatch):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(cli, "PIPE_WAIT_SECONDS", 0.5)
    outcome = []

    def read_alone():  # no writer at all; in a thread, so that a read that blocks fails the test, not the suite
        try:
            cli.read_file(fifo, "--f", 100)
        except MinispecError as error:
            outcome.append(error)

    reader = threading.Thread(target=read_alone, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():
        with open(fifo, "wb"):  # a writer releases the blocked reader
            pass
        pytest.fail("read_file blocked on a named pipe with no writer")
    assert len(outcome) == 1
    one_line(outcome[0], "--f")

    def write():  # a writer that comes: its bytes are read, the cap still holds
        with open(fifo, "wb") as f:
            f.write(b"hello")

    writer = threading.Thread(target=write)
    writer.start()
    assert cli.read_file(fifo, "--f", 100) == b"hello"
    writer.join()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_extra_names_the_extra_to_install():
    assert cli.extra("json", "x", "reading") is __import__("json")
    with pytest.raises(MinispecError) as err:
        cli.extra("no_such_package_anywhere.sub", "gguf", "reading model.gguf")
    one_line(err.value, "reading model.gguf")
    assert "minispec[gguf]" in str(err.value)


CHILD = """
import os, signal, sys, time
from pathlib import Path
from minispec.cli import run_main

def body():
    marker = Path(sys.argv[1])
    try:
        os.kill(os.getpid(), signal.SIG{name})
        time.sleep(5)
    finally:
        marker.write_text("cleaned")  # the cleanup a conversion runs for its temporary folder
sys.exit(run_main("prog", body))
"""


@pytest.mark.parametrize("name, code, line", [("TERM", 143, "prog: terminated"), ("INT", 130, "prog: interrupted")])
def test_sigterm_runs_the_cleanup_ctrl_c_runs(tmp_path, name, code, line):
    marker = tmp_path / "marker"
    proc = subprocess.run([sys.executable, "-c", CHILD.replace("{name}", name), str(marker)], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (code, line + "\n")
    assert marker.read_text() == "cleaned"
    assert signal.getsignal(signal.SIGTERM) is not None
