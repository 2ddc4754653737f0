"""The CLI: `python -m minispec.generate`. User mistakes end in one line on stderr, exit 2."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from minispec.generate import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output(real_ckpt, capsys):
    code, out, err = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "12", "--json")
    assert code == 0
    result = json.loads(out)
    assert "Paris" in result["text"]
    assert result["tokens"] and result["stats"]["tokens_per_second"] > 0


def test_speculative_json_with_stats(real_ckpt, capsys):
    code, out, _ = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "12", "--json",
                           "--draft", "ngram", "--policy", "dropmatch", "--gamma", "3")
    assert code == 0
    stats = json.loads(out)["stats"]
    assert stats["policy"] == "dropmatch" and 1 <= stats["tau"] <= 4 and "acceptance_rate" in stats


def test_tree_flags_give_plain_greedy_text_and_a_tree_stats_line(real_ckpt, capsys):
    common = ("--ckpt", str(real_ckpt), "--max-new-tokens", "12")
    plain = json.loads(run_cli(capsys, *common, "--json")[1])
    for flags in (("--draft", "ngram", "--tree", "6"),
                  ("--draft", "early-exit:20", "--tree", "6", "--branching", "3", "--tree-width", "2")):
        tree = json.loads(run_cli(capsys, *common, *flags, "--json")[1])
        assert tree["tokens"] == plain["tokens"], flags
        assert tree["stats"]["tree"] and tree["stats"]["budget"] == 6 and tree["stats"]["nodes_per_step"] <= 6
        code, out, err = run_cli(capsys, *common, *flags, "--stats")
        assert code == 0 and out == plain["text"] + "\n"
        assert "tree: " in err and "nodes verified per step (budget 6, depth 5)" in err, err


def test_dropout_p_auto_reports_the_calibrated_p_in_json_and_stats(real_ckpt, capsys):
    """--policy dropmatch:p=auto:LEVEL picks p by measured head agreement on the prompt's own greedy
    continuation: the same p as calling the calibration directly, reported in --json and --stats; a
    fixed p is reported as given. A higher level asks for a smaller p."""
    import minispec
    from minispec.lab.dropout_calibration import auto_dropout_p

    common = ("--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "6", "--draft", "ngram")
    code, out, _ = run_cli(capsys, *common, "--json", "--policy", "dropmatch:p=auto:0.5")
    assert code == 0
    chosen = json.loads(out)["stats"]["dropout_p"]
    model, tokenizer = minispec.load_model(real_ckpt), minispec.load_tokenizer(real_ckpt)
    from minispec.chain.speculative import generate_chain as generate

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    text = generate(model, prompt, max_new_tokens=32, eos_token_ids=tokenizer.eos_token_ids).tokens
    assert chosen == auto_dropout_p(model, prompt, paths=5, level=0.5, continuation=text)
    assert 0 < chosen < 0.9
    assert auto_dropout_p(model, prompt, paths=5, level=0.95, continuation=text) <= chosen
    code, _, err = run_cli(capsys, *common, "--stats", "--policy", "dropmatch:p=0.125")
    assert code == 0 and "dropmatch p 0.125:" in err


def test_streaming_with_colours_prints_the_same_text(real_ckpt, capsys):
    code, plain, _ = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "12")
    code2, shown, err = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "12",
                                "--draft", "self:bf16", "--show", "--color", "always", "--stats")
    assert code == code2 == 0
    strip = lambda s: s.replace("\033[32m", "").replace("\033[31m", "").replace("\033[34m", "").replace("\033[0m", "")
    assert strip(shown) == plain and "\033[32m" in shown  # some drafts were accepted and shown green
    assert "tau" in err and "acceptance rate" in err


def test_trace_prints_each_step_then_the_same_text(real_ckpt, capsys):
    common = ("--ckpt", str(real_ckpt), "--chat", "--prompt", "Repeat this sentence twice: the quick brown fox jumps "
              "over the lazy dog.", "--max-new-tokens", "16")
    _, plain, _ = run_cli(capsys, *common)
    code, traced, _ = run_cli(capsys, *common, "--draft", "ngram", "--gamma", "3", "--trace")
    assert code == 0
    steps = [line for line in traced.splitlines() if line.startswith("step ")]
    assert steps and all("drafter ngram:3 proposed" in line for line in steps)
    assert traced.count("  rollback: target cache ") == len(steps) and traced.count("  decision exact: ") == len(steps)
    assert traced.endswith("emitted " + traced.split("emitted ")[-1].split("\n")[0] + "\n" + plain)  # then the text


def test_trace_with_json_keeps_stdout_one_json_object(real_ckpt, capsys):
    code, out, err = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "8", "--draft", "ngram",
                             "--trace", "--json")
    assert code == 0 and json.loads(out)["tokens"]  # stdout parses as JSON
    assert "decision exact:" in err  # the steps went to stderr


def test_help_shows_the_defaults_and_the_equivalent_flags_elsewhere(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["-h"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 5)" in text  # --gamma's
    assert "(default: exact)" in text and "(default: auto)" in text  # --policy's, --kernels'
    for name in ("num_speculative_tokens", "--draft-max", "num_assistant_tokens", "--draft-p-min", "max_tokens"):
        assert name in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "-1"], "--temperature = -1; expected 0 (greedy) or a finite number >= 0.001"),
        (["--top-p", "0"], "--top-p = 0; expected 0 < top-p <= 1"),
        (["--top-k", "0"], "--top-k = 0; expected 1 <= top-k"),
        (["--gamma", "0"], "--gamma = 0; expected 1 <= gamma"),
        (["--max-new-tokens", "x"], "--max-new-tokens = 'x'; expected an integer"),
        (["--dtype", "int4"], "argument --dtype: invalid choice"),
        (["--seed", "-1"], "--seed = -1; expected 0 <= seed < 18446744073709551616"),
        (["--seed", str(2**64)], f"--seed = {2**64}; expected 0 <= seed < 18446744073709551616"),
        (["--temperature", "1e-40"], "--temperature = 1e-40; expected 0 (greedy) or a finite number >= 0.001"),
        (["--temperature", "inf"], "--temperature = inf; expected 0 (greedy) or a finite number >= 0.001"),
        (["--temperature", "nan"], "--temperature = nan; expected 0 (greedy)"),
        (["--temperature", "warm"], "--temperature = 'warm'; expected a number"),
        (["--top-p", "nan"], "--top-p = nan; expected 0 < top-p <= 1"),
    ],
)
def test_out_of_range_flags(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--policy", "nope", "--draft", "ngram"], "--policy 'nope': unknown acceptance policy"),
        (["--draft", "bogus"], "--draft 'bogus': unknown drafter"),
        (["--draft", "early-exit:30"], "expected an integer N with 1 <= N <= 29"),
        (["--kernels", "compiled", "--dtype", "float64"], "--kernels 'compiled'"),
    ],
)
def test_bad_names_for_policy_and_drafter(real_ckpt, capsys, argv, message):
    code, _, err = run_cli(capsys, "--ckpt", str(real_ckpt), "--max-new-tokens", "2", *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1


def test_missing_checkpoint_is_one_line_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "minispec.generate", "--ckpt", str(tmp_path / "nowhere")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("minispec.generate: error: ") and "no such folder" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_chat_template_is_used_by_default_and_raw_turns_it_off(real_ckpt, capsys):
    """An instruct checkpoint with a chat template gets its prompt wrapped by default (llama.cpp's
    habit); --raw feeds the text as it is."""
    runs = {}
    for mode in ([], ["--chat"], ["--raw"]):
        code, out, _ = run_cli(capsys, "--ckpt", str(real_ckpt), "--max-new-tokens", "1", "--json", *mode)
        assert code == 0
        runs[" ".join(mode)] = json.loads(out)["prompt_tokens"]
    assert runs[""] == runs["--chat"] > runs["--raw"] == len(__import__("minispec").load_tokenizer(real_ckpt)
                                                              .encode("What is the capital of France?"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gamma", "3"], "--gamma: applies only to speculative decoding; expected a --draft"),
        (["--policy", "sampling"], "--policy: applies only to speculative decoding"),
        (["--trace"], "--trace: applies only to speculative decoding"),
        (["--draft-length", "heuristic"], "--draft-length: applies only to speculative decoding"),
        (["--draft", "ngram", "--policy", "typical:p=auto"], "--policy typical: unknown option 'p'"),
        (["--draft", "ngram", "--policy", "dropmatch:p=auto:0"], "p = 'auto:0'; expected a number in [0, 1), auto"),
        (["--draft", "ngram", "--policy", "dropmatch:p=auto:high"], "p = 'auto:high'; expected a number in [0, 1), auto"),
        (["--draft", "ngram", "--policy", "typical: "], "expected key=value after the colon, or no colon"),
        (["--draft", "ngram", "--policy", "dropmatch:p=1"], "--policy dropmatch: dropmatch p = 1.0; expected 0 <= p < 1"),
        (["--top-k", "5"], "--top-k: applies only when sampling; expected --temperature > 0"),
        (["--top-p", "0.9", "--temperature", "0"], "--top-p: applies only when sampling"),
        (["--json", "--show"], "--show: --json prints one JSON object"),
        (["--json", "--stats"], "--stats: --json prints one JSON object"),
        (["--color", "always"], "--color: says when --show colours the text; expected --show"),
        (["--raw", "--system", "be brief"], "--system: a chat-template message; expected chat mode, not --raw"),
        (["--stop", ""], "--stop '': an empty stop string"),
        (["--draft", "ngram", "--draft-p-min", "0.5"], "--draft-p-min"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "--prompt-file /nonexistent/prompt.txt: cannot be read"),
        (["--chat", "--raw"], "argument --raw: not allowed with argument --chat"),
    ],
)
def test_a_flag_that_cannot_apply_is_an_error_that_says_why(real_ckpt, capsys, argv, message):
    try:
        code = main(["--ckpt", str(real_ckpt), "--max-new-tokens", "2", *argv])
    except SystemExit as exit_info:  # argparse's own errors exit from parse_args
        code = exit_info.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1 and err.startswith("minispec.generate: error: ")


def test_colour_only_on_a_terminal_unless_asked(real_ckpt, capsys, monkeypatch):
    """--show colours a terminal; into a pipe (capsys is not a terminal) only with --color always;
    NO_COLOR turns auto off even on a terminal."""
    common = ("--ckpt", str(real_ckpt), "--max-new-tokens", "10", "--draft", "self:bf16", "--show")
    _, piped, _ = run_cli(capsys, *common)
    _, forced, _ = run_cli(capsys, *common, "--color", "always")
    assert "\033[" not in piped and "\033[32m" in forced
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    _, tty, _ = run_cli(capsys, *common)
    monkeypatch.setenv("NO_COLOR", "1")
    _, no_color, _ = run_cli(capsys, *common)
    _, never, _ = run_cli(capsys, *common, "--color", "never")
    assert tty == forced and no_color == never == piped


def test_prompt_file_and_stdin_equal_the_prompt_flag(real_ckpt, capsys, tmp_path, monkeypatch):
    import io

    prompt = "Name three colours.\nOne per line: ü, 日本."
    (tmp_path / "p.txt").write_text(prompt, encoding="utf-8")
    common = ("--ckpt", str(real_ckpt), "--max-new-tokens", "4", "--json")
    outs = [run_cli(capsys, *common, "--prompt", prompt)[1], run_cli(capsys, *common, "--prompt-file", str(tmp_path / "p.txt"))[1]]
    monkeypatch.setattr(sys, "stdin", io.StringIO(prompt))
    outs.append(run_cli(capsys, *common, "--prompt-file", "-")[1])
    runs = [json.loads(out) for out in outs]
    assert [(r["prompt_tokens"], r["tokens"]) for r in runs] == [(runs[0]["prompt_tokens"], runs[0]["tokens"])] * 3


def test_finish_reason_in_json(real_ckpt, capsys):
    common = ("--ckpt", str(real_ckpt), "--json")
    assert json.loads(run_cli(capsys, *common, "--max-new-tokens", "3")[1])["finish_reason"] == "length"
    done = json.loads(run_cli(capsys, *common, "--max-new-tokens", "60")[1])  # "The capital of France is Paris." + eos
    assert done["finish_reason"] == "eos" and len(done["tokens"]) < 60


@pytest.mark.parametrize("draft", [[], ["--draft", "ngram", "--gamma", "4"]])
def test_stop_strings_end_the_text_before_them_streamed_or_not(real_ckpt, capsys, draft):
    """--stop S: the text is the unstopped text up to the first S (S left out), finish_reason "stop";
    the streamed text is the same, S never printed even in part. Stop strings are picked from the
    unstopped output itself, so they are found wherever they fall."""
    common = ("--ckpt", str(real_ckpt), "--prompt", "Write a short poem about the sea.", "--max-new-tokens", "40")
    full = json.loads(run_cli(capsys, *common, "--json")[1])["text"]
    words = full.split()
    for stop in (words[len(words) // 2], words[-2] + " " + words[-1][:2]):  # a word; across words
        want = full[: full.find(stop)]
        got = json.loads(run_cli(capsys, *common, *draft, "--json", "--stop", stop, "--stop", "never-in-the-text")[1])
        assert got["text"] == want and got["finish_reason"] == "stop", stop
        code, streamed, _ = run_cli(capsys, *common, *draft, "--stop", stop)
        assert code == 0 and streamed == want + "\n", stop


class _PieceTokenizer:
    """Token i decodes to pieces[i]: enough of a tokenizer for the printer."""

    added_token_ids = ()  # no special tokens: every stop string can match

    def __init__(self, pieces):
        self.pieces = pieces

    def stream_decoder(self, skip_special_tokens):
        tokenizer = self

        class Stream:
            def push(self, ids):
                return "".join(tokenizer.pieces[i] for i in ids)

            def flush(self):
                return ""

        return Stream()


@settings(max_examples=300)  # cheap: no model
@given(pieces=st.lists(st.text("ab ", min_size=0, max_size=3), min_size=1, max_size=12),
       stops=st.lists(st.text("ab ", min_size=1, max_size=3), min_size=1, max_size=2),
       accepted=st.lists(st.booleans(), min_size=12, max_size=12), colour=st.booleans())
def test_streamed_text_with_stop_strings_is_the_text_cut_before_the_first(pieces, stops, accepted, colour):
    """Whatever the pieces and stop strings: the printer holds back what may start a stop string
    and prints exactly the text the run ends with, cut before its first stop string
    (StopStrings.cut): the run ends at the first piece after which the text holds a stop string,
    so a longer stop string that would have started earlier but never completed does not count."""
    import io

    from minispec.generate.printing import RESET, Printer, StopStrings

    out, saved = io.StringIO(), sys.stdout
    sys.stdout = out
    try:
        printer = Printer(_PieceTokenizer(pieces), colour=colour, stops=tuple(stops))
        for i in range(len(pieces)):
            printer.push([i], int(accepted[i]), 1)  # accepted: green; else a correction, red
        printer.finish()
    finally:
        sys.stdout = saved
    printed = out.getvalue()
    for code in ("\033[32m", "\033[31m", "\033[34m", RESET):
        printed = printed.replace(code, "")
    ends = next((i + 1 for i in range(len(pieces)) if any(stop in "".join(pieces[:i + 1]) for stop in stops)),
                len(pieces))  # where the loop's stop_when ends the run
    assert printed == StopStrings(_PieceTokenizer(pieces), tuple(stops)).cut("".join(pieces[:ends])) + "\n"


def test_flag_ranges_are_the_python_apis():
    """--temperature and --seed accept exactly what SamplingParams and generate() do, at the edges."""
    from minispec.generate import parse_args
    from minispec.model.sampling import MIN_TEMPERATURE, SamplingParams

    assert parse_args(["--temperature", str(MIN_TEMPERATURE)]).temperature == SamplingParams(MIN_TEMPERATURE).temperature
    assert parse_args(["--temperature", "0"]).temperature == 0
    assert parse_args(["--seed", str(2**64 - 1)]).seed == 2**64 - 1


def test_run_main_turns_errors_interrupts_and_closed_pipes_into_exit_statuses(capsys, monkeypatch):
    """One line and 2 for a MinispecError (even one whose message has a line break), one line and 130
    for Ctrl-C, nothing and 141 for a closed stdout; any other exception is a bug and escapes."""
    from minispec.cli import run_main
    from minispec.errors import MinispecError

    def raising(error):
        def body():
            print("partial", end="")
            raise error
        return body

    assert run_main("prog", raising(MinispecError("bad --x\nexpected y"))) == 2
    assert capsys.readouterr() == ("partial", "prog: error: bad --x expected y\n")
    assert run_main("prog", raising(KeyboardInterrupt())) == 130
    assert capsys.readouterr() == ("partial", "prog: interrupted\n")
    assert run_main("prog", raising(BrokenPipeError())) == 141
    assert capsys.readouterr().err == ""
    flushed = []
    monkeypatch.setattr(sys.stdout, "flush", lambda: flushed.append(1) or (_ for _ in ()).throw(BrokenPipeError()))
    assert run_main("prog", lambda: 0) == 141 and flushed  # a pipe closed after the last write shows at the flush
    monkeypatch.undo()
    with pytest.raises(ZeroDivisionError):
        run_main("prog", lambda: 1 / 0)


def test_interrupted_generation_keeps_what_was_generated(real_ckpt, capsys, monkeypatch):
    """Ctrl-C while generating: the streamed text so far ends with its newline, and --json prints the
    object with the tokens so far, finish_reason "interrupted"; exit 130 and one line on stderr."""
    import minispec.decode

    real_generate = minispec.decode.generate_chain  # what the front door hands one prompt to

    def interrupted_after_four_tokens(*args, on_tokens, **kwargs):
        def callback(tokens, num_accepted, num_proposed):
            on_tokens(tokens, num_accepted, num_proposed)
            if callback.count >= 4:
                raise KeyboardInterrupt
            callback.count += len(tokens)
        callback.count = 0
        return real_generate(*args, on_tokens=callback, **kwargs)

    monkeypatch.setattr(minispec.decode, "generate_chain", interrupted_after_four_tokens)
    common = ("--ckpt", str(real_ckpt), "--max-new-tokens", "30")
    code, out, err = run_cli(capsys, *common, "--json")
    result = json.loads(out)
    assert code == 130 and err == "minispec.generate: interrupted\n"
    assert result["finish_reason"] == "interrupted" and len(result["tokens"]) == 5 and result["stats"] is None
    code, streamed, err = run_cli(capsys, *common)
    assert code == 130 and err == "minispec.generate: interrupted\n"
    assert streamed == result["text"] + "\n" and result["text"].startswith("The capital")


def test_command_lines_reach_run_main_before_torch_loads():
    """Ctrl-C while torch loads (the first second or two of every run) must be run_main's one line,
    not an import traceback: so neither command-line module, nor the package, imports torch itself."""
    code = ("import sys, minispec, minispec.generate, minispec.checkpoints.fetch, minispec.errors; "
            "print(sorted(m for m in ('torch', 'safetensors', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


READ_ALL_SCRIPT = r"""
import os, signal, sys, threading, time
from minispec.cli import read_all

# Python's own Ctrl-C handling, whatever this process inherited: a background job of a
# non-interactive shell starts with SIGINT ignored, and then no read is ever interrupted.
signal.signal(signal.SIGINT, signal.default_int_handler)

def poke():  # Ctrl-C delivered to a worker thread, as the kernel may do once torch's thread pool exists
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    time.sleep(30)

threading.Thread(target=poke, daemon=True).start()
fifo = os.fdopen(os.open(sys.argv[1], os.O_RDWR), "rb")  # read-write: open never blocks, read never ends
try:
    (read_all if sys.argv[2] == "read_all" else lambda f: f.read())(fifo)
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.skipif(not hasattr(signal, "pthread_kill") or os.name != "posix", reason="POSIX threads and FIFOs")
def test_a_read_waiting_for_a_writer_is_interrupted_by_a_sigint_on_another_thread(tmp_path):
    """cli.read_all (how --prompt-file and stdin are read): a SIGINT that lands on a worker thread
    still ends the wait; a plain read() would wait for the writer forever (shown with a timeout)."""
    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-c", READ_ALL_SCRIPT, str(fifo), "read_all"], capture_output=True,
                          text=True, timeout=20, cwd=ROOT)
    assert done.stdout.strip() == "interrupted", done.stderr
    with pytest.raises(subprocess.TimeoutExpired):  # the property's power: the plain read never returns
        subprocess.run([sys.executable, "-c", READ_ALL_SCRIPT, str(fifo), "plain"], capture_output=True, timeout=3,
                       cwd=ROOT)



def test_help_shows_every_default(monkeypatch):
    """`-h` names the default of every flag that has one (a switch's False and an unset None are
    said in words by its help), as the README promises: each flag's line, unwrapped, ends with it."""
    import re

    from minispec.generate.flags import build_parser

    monkeypatch.setenv("COLUMNS", "10000")  # one line per flag
    parser = build_parser()
    checked, blocks = 0, []
    options = parser.format_help()
    if parser.epilog:  # the table of equivalent flags in other tools is not the options' help
        options = options[:options.index(parser.epilog.strip().splitlines()[0])]
    for line in options.splitlines():  # a flag's block: its line and the help under it
        if re.match(r"\s+-", line) or not blocks:
            blocks.append(line)
        elif line.startswith("      "):
            blocks[-1] += " " + line.strip()
    for line in blocks:
        flag = re.match(r"\s+(--[a-z0-9-]+)", line)
        if flag is None or flag.group(1) == "--help":
            continue
        default = parser.get_default(flag.group(1)[2:].replace("-", "_"))
        if default in (None, False, []):
            continue
        assert f"(default: {default})" in line, line
        checked += 1
    assert checked >= 10  # --max-new-tokens, --dtype, --temperature, --seed, --gamma, ...


def test_a_registered_user_policy_takes_its_options_from_the_command_line(real_ckpt, capsys, monkeypatch):
    """A policy registered with acceptance.register is named on the command line with its own options,
    converted by its constructor's signature (a float, a bool): no flag of minispec's is needed."""
    import torch

    from minispec import acceptance
    from minispec.acceptance import AcceptancePolicy, Decision, base, first_rejection

    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # the registration ends with the test
    built = []

    @acceptance.register("test-cli-threshold")
    class Threshold(AcceptancePolicy):
        """Keep a draft while the target gives it at least `threshold`; the next token is p's argmax."""

        def __init__(self, threshold: float = 0.5, count: bool = False) -> None:
            self.threshold, self.count = threshold, count
            built.append(self)

        def decide(self, inp):
            p_draft = inp.p_target[:-1].gather(1, inp.draft_tokens[:, None])[:, 0]  # [gamma]
            n = first_rejection(p_draft >= self.threshold)
            return Decision(n, int(torch.argmax(inp.p_target[n])))

    common = ("--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "12", "--json", "--draft", "ngram")
    never = json.loads(run_cli(capsys, *common, "--policy", "test-cli-threshold:threshold=1.5,count=true")[1])
    assert (built[-1].threshold, built[-1].count) == (1.5, True)
    assert never["stats"]["policy"] == "test-cli-threshold" and never["stats"]["acceptance_rate"] == 0
    always = json.loads(run_cli(capsys, *common, "--policy", "test-cli-threshold:threshold=0")[1])
    assert (built[-1].threshold, built[-1].count) == (0.0, False)
    assert always["stats"]["acceptance_rate"] > 0 and len(built) == 2
    code, _, err = run_cli(capsys, *common, "--policy", "test-cli-threshold:thresold=0")
    assert code == 2 and err == ("minispec.generate: error: --policy test-cli-threshold: unknown option "
                                 "'thresold'; its options are ['count', 'threshold']\n")


@pytest.mark.parametrize("nf4_runs", [True, False], ids=["nf4-here", "no-nf4"])
def test_dtype_auto_loads_what_this_cpu_runs_fast_and_says_so(real_ckpt, capsys, monkeypatch, nf4_runs):
    """--dtype auto with --kernels auto: kernels.auto_weights' choice (its definition is tested in
    test_kernels_nf4.py): nf4 loaded in float32 for a target of NF4_MIN_WEIGHTS linear weights or more
    where the kernel runs, and beside it a draft model in nf4; else kernels.auto_dtype() (bfloat16 where a 16-bit path runs here,
    else float32) and --kernels auto's choice on it. With another --kernels, auto_dtype's dtype and
    that kind. --json's stats name each, so the path that ran is never a guess. SmolLM2 is below the
    size rule, so the nf4 case lowers it."""
    import torch

    from minispec import kernels
    from minispec.model.config import ModelConfig

    if nf4_runs:
        if not kernels.nf4.available():
            pytest.skip("no bitsandbytes, or a CPU without AVX512-BF16")
        monkeypatch.setattr(kernels, "NF4_MIN_WEIGHTS", kernels.nf4.linear_weights(ModelConfig.from_hf(real_ckpt)))
    else:
        monkeypatch.setattr(kernels.nf4, "available", lambda: False)
    code, out, _ = run_cli(capsys, "--ckpt", str(real_ckpt), "--max-new-tokens", "4", "--dtype", "auto",
                           "--draft", str(real_ckpt), "--json")
    assert code == 0
    stats = json.loads(out)["stats"]
    want = kernels.auto_dtype()
    assert want == (torch.bfloat16 if kernels.packed.packs(torch.bfloat16) or kernels.fbgemm.available()
                    else torch.float32)
    if nf4_runs:
        assert (stats["dtype"], stats["kernels"], stats["draft_kernels"]) == ("torch.float32", "nf4", "nf4")
    else:
        assert stats["dtype"] == str(want)
        assert stats["kernels"] == ("fast" if kernels.packed.packs(want) else "fp16" if want == torch.bfloat16
                                    else "reference")
        assert stats["draft_kernels"] in ("fast", "fp16", "reference")
    code, out, _ = run_cli(capsys, "--ckpt", str(real_ckpt), "--max-new-tokens", "4", "--dtype", "auto",
                           "--kernels", "reference", "--json")
    assert (json.loads(out)["stats"]["dtype"], json.loads(out)["stats"]["kernels"]) == (str(want), "reference")


def test_draft_length_auto_prices_once_per_machine_and_says_so(real_ckpt, capsys, monkeypatch, tmp_path):
    """--draft-length auto: the stats name the schedule and the prices it chose by; the prices are kept
    (MINISPEC_HOME/probe.json), so a second run measures nothing and gives the same tokens; greedy
    exact stays plain greedy."""
    from minispec.lab import step_cost

    monkeypatch.setenv("MINISPEC_HOME", str(tmp_path))
    calls = []
    measure = step_cost.measure_costs
    monkeypatch.setattr(step_cost, "measure_costs", lambda *a, **k: calls.append(1) or measure(*a, **k))
    args = ("--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "16", "--json", "--draft", "ngram",
            "--gamma", "4", "--draft-length", "auto")
    runs = []
    for _ in range(2):
        code, out, _ = run_cli(capsys, *args)
        assert code == 0
        runs.append(json.loads(out))
    assert len(calls) == 1 and (tmp_path / "probe.json").is_file()
    stats = runs[0]["stats"]
    assert stats["draft_length"] == "auto" and len(stats["draft_costs"]) == 5 and stats["draft_costs"][0] == 1.0
    assert runs[1]["stats"]["draft_costs"] == stats["draft_costs"] and runs[1]["tokens"] == runs[0]["tokens"]
    code, out, _ = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "16", "--json")
    assert json.loads(out)["tokens"] == runs[0]["tokens"]
    code, out, err = run_cli(capsys, *[a for a in args if a != "--json"], "--stats")
    assert code == 0 and "draft length auto:" in out + err
    assert "step cost of 0..gamma drafts, in plain steps: 1.00" in out + err


def test_draft_length_fallback_turns_speculation_off_below_its_break_even_and_keeps_greedy_text(real_ckpt, capsys):
    """--draft-length fallback:TAU: the lab's Fallback(gamma, TAU) as the command builds it. A break-even
    no step can reach (gamma + 1) turns drafting off after its first window of steps and probes every
    8th step after that; greedy text is plain greedy's whatever the schedule (it only picks lengths)."""
    common = ("--ckpt", str(real_ckpt), "--prompt", "List three colours.", "--max-new-tokens", "40", "--json")
    code, out, _ = run_cli(capsys, *common)
    plain = json.loads(out)
    code, out, _ = run_cli(capsys, *common, "--draft", "ngram", "--gamma", "3", "--draft-length", "fallback:4")
    assert code == 0
    run = json.loads(out)
    s = run["stats"]
    assert run["tokens"] == plain["tokens"] and s["draft_length"] == "fallback"
    # window 4, then off: at most the first 4 drafted steps and one probe per 8 steps after them
    assert s["no_draft_steps"] > 0 and s["drafted_steps"] <= 4 + (s["verify_steps"] - 4) // 8 + 1, s
