"""The CLI: `python -m minispec.generate`. User mistakes end in one line on stderr, exit 2."""

import json
import subprocess
import sys

import pytest

from minispec.generate import main


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


def test_dropout_p_auto_reports_the_calibrated_p_in_json_and_stats(real_ckpt, capsys):
    """--dropout-p auto picks p by measured head agreement on the prompt's own greedy continuation:
    the same p as calling the calibration directly, reported in --json and --stats; a fixed p is
    reported as given. A higher --agreement asks for a smaller p."""
    import minispec
    from minispec.acceptance.dropmatch_calibrate import auto_dropout_p

    common = ("--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "6", "--draft", "ngram", "--policy", "dropmatch")
    code, out, _ = run_cli(capsys, *common, "--json", "--dropout-p", "auto", "--agreement", "0.5")
    assert code == 0
    chosen = json.loads(out)["stats"]["dropout_p"]
    model, tokenizer = minispec.load_model(real_ckpt), minispec.load_tokenizer(real_ckpt)
    from minispec.speculative import generate

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    text = generate(model, prompt, max_new_tokens=32, eos_token_ids=tokenizer.eos_token_ids).tokens
    assert chosen == auto_dropout_p(model, prompt, paths=5, level=0.5, continuation=text)
    assert 0 < chosen < 0.9
    assert auto_dropout_p(model, prompt, paths=5, level=0.95, continuation=text) <= chosen
    code, _, err = run_cli(capsys, *common, "--stats", "--dropout-p", "0.125")
    assert code == 0 and "dropmatch p 0.125:" in err


def test_streaming_with_colours_prints_the_same_text(real_ckpt, capsys):
    code, plain, _ = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "12")
    code2, shown, err = run_cli(capsys, "--ckpt", str(real_ckpt), "--chat", "--max-new-tokens", "12",
                                "--draft", "self:bf16", "--show", "--stats")
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


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["-h"])
    assert exit_info.value.code == 0
    assert "(default: 5)" in " ".join(capsys.readouterr().out.split())  # --gamma's


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "-1"], "--temperature = -1; expected 0 <= temperature"),
        (["--top-p", "0"], "--top-p = 0; expected 0 < top-p <= 1"),
        (["--top-k", "0"], "--top-k = 0; expected 1 <= top-k"),
        (["--gamma", "0"], "--gamma = 0; expected 1 <= gamma"),
        (["--dropout-p", "1"], "--dropout-p = 1; expected 0 <= dropout-p < 1"),
        (["--max-new-tokens", "x"], "--max-new-tokens = 'x'; expected an integer"),
        (["--dtype", "int4"], "argument --dtype: invalid choice"),
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
        (["--policy", "nope", "--draft", "ngram"], "--policy = 'nope': unknown acceptance policy"),
        (["--draft", "bogus"], "--draft = 'bogus': unknown drafter"),
        (["--draft", "early-exit:30"], "expected an integer N with 1 <= N <= 29"),
        (["--kernels", "compiled", "--dtype", "float64"], "--kernels compiled"),
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
    assert proc.stderr.startswith("minispec.generate: error: ") and "not a directory" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
