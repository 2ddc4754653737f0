"""The CLI's batch mode: `--prompt-file FILE --batch-size N`, one prompt per line.

Every prompt must come out as the single-prompt CLI gives it alone (prompt i with --seed + i).
The runs use the tiny random checkpoint of tests/test_bad_inputs.py in float64, where the batched
and the one-row matmuls cannot tip a near-tie apart (the tie rule in docs/testing.md), so equal
means equal token for token. The one-line errors are rows of tests/test_bad_inputs.py.
"""

import json

import pytest

from minispec.generate import main
from test_bad_inputs import build_tiny_checkpoint

PROMPTS = ["Name three colours.", "", "Once upon a time", "   ", "Write one word, ü 日本."]  # two blank lines


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "TINY")


@pytest.fixture()
def prompt_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return path


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def common(tiny, *more):
    return ("--ckpt", str(tiny), "--dtype", "float64", "--max-new-tokens", "10", *more)


def alone(capsys, tiny, prompt, *flags):
    """The single-prompt CLI's --json object for one prompt."""
    code, out, _ = run_cli(capsys, *common(tiny, "--prompt", prompt, "--json", *flags))
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("draft", [[], ["--draft", "ngram", "--gamma", "3"]], ids=["plain", "ngram"])
def test_each_prompt_is_what_the_single_prompt_cli_gives(tiny, prompt_file, capsys, draft):
    """Greedy, in groups of 2 (the last group short): every prompt's tokens, text and finish reason
    are the single run's; text mode prints them in order, each under its header."""
    prompts = [p for p in PROMPTS if p.strip()]
    singles = [alone(capsys, tiny, prompt, *draft) for prompt in prompts]
    code, out, _ = run_cli(capsys, *common(tiny, "--prompt-file", str(prompt_file), "--batch-size", "2", "--json",
                                            *draft))
    assert code == 0
    results = json.loads(out)["results"]
    assert [(r["tokens"], r["text"], r["finish_reason"], r["prompt_tokens"]) for r in results] == \
        [(s["tokens"], s["text"], s["finish_reason"], s["prompt_tokens"]) for s in singles]
    code, out, err = run_cli(capsys, *common(tiny, "--prompt-file", str(prompt_file), "--batch-size", "2", *draft))
    assert code == 0
    assert out == "".join(f"=== prompt {i + 1}/3 ({s['finish_reason']}) ===\n{s['text']}\n" for i, s in enumerate(singles))
    assert err.startswith("[3 prompts, ") and err.count("\n") == 1


def test_json_holds_one_result_per_prompt_and_the_pooled_stats(tiny, prompt_file, capsys):
    code, out, _ = run_cli(capsys, *common(tiny, "--prompt-file", str(prompt_file), "--batch-size", "2", "--json",
                                            "--draft", "ngram", "--policy", "dropmatch:p=0.1"))
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"results", "stats"} and len(result["results"]) == 3
    for row in result["results"]:
        assert set(row) == {"text", "tokens", "prompt_tokens", "finish_reason", "stats"}
        assert row["stats"]["num_generated_tokens"] == len(row["tokens"]) and row["stats"]["dropout_p"] == 0.1
    stats = result["stats"]
    assert stats["num_prompts"] == 3 and stats["batch_size"] == 2 and stats["tokens_per_second"] > 0
    assert stats["num_generated_tokens"] == sum(len(r["tokens"]) for r in result["results"])
    assert stats["policy"] == "dropmatch" and stats["gamma"] == 5 and stats["dropout_p"] == 0.1
    assert 1 <= stats["mean_rows_per_pass"] <= 2 and stats["tau"] >= 1
    assert stats["kernels"] == "reference" and stats["dtype"] == "torch.float64"  # the path that ran, named


@pytest.mark.parametrize("draft", [[], ["--draft", "ngram", "--policy", "sampling"]], ids=["plain", "ngram"])
def test_prompt_i_is_seeded_with_seed_plus_i(tiny, tmp_path, capsys, draft):
    """At temperature 1, the same prompt on every line: line i's text is a single run's with
    --seed 7 + i (so the lines differ from each other)."""
    (tmp_path / "same.txt").write_text("Once upon a time\n" * 3, encoding="utf-8")
    sampled = ("--temperature", "1", *draft)
    code, out, _ = run_cli(capsys, *common(tiny, "--prompt-file", str(tmp_path / "same.txt"), "--batch-size", "3",
                                            "--seed", "7", "--json", *sampled))
    assert code == 0
    rows = [r["tokens"] for r in json.loads(out)["results"]]
    singles = [alone(capsys, tiny, "Once upon a time", "--seed", str(7 + i), *sampled)["tokens"] for i in range(3)]
    assert rows == singles and len({tuple(r) for r in rows}) == 3


def test_stop_strings_cut_each_text_as_the_single_run_does(tiny, prompt_file, capsys):
    prompts = [p for p in PROMPTS if p.strip()]
    first = alone(capsys, tiny, prompts[0])["text"]
    stop = next(c for c in first[2:] if c.isprintable() and c != "\ufffd")  # a character the first text holds
    singles = [alone(capsys, tiny, prompt, "--stop", stop) for prompt in prompts]
    assert singles[0]["finish_reason"] == "stop"
    code, out, _ = run_cli(capsys, *common(tiny, "--prompt-file", str(prompt_file), "--batch-size", "3",
                                            "--stop", stop))
    assert code == 0
    assert out == "".join(f"=== prompt {i + 1}/3 ({s['finish_reason']}) ===\n{s['text']}\n" for i, s in enumerate(singles))


def test_stdin_chat_flags_and_stats(tiny, capsys, monkeypatch):
    """--prompt-file - reads the lines from stdin; --raw and --system apply to every prompt; --stats
    adds the batch's own line to the pooled stats."""
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.StringIO("one\r\ntwo\n"))
    code, out, err = run_cli(capsys, *common(tiny, "--prompt-file", "-", "--batch-size", "8", "--system", "Be brief.",
                                            "--stats"))
    assert code == 0 and out.count("=== prompt ") == 2
    assert "plain decoding: " in err and "batch: 2 prompts, batch size 2, aggregate " in err  # --batch-size 8, two prompts: 2 decoded together
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\r\ntwo\n"))
    code, out, _ = run_cli(capsys, *common(tiny, "--prompt-file", "-", "--batch-size", "1", "--raw", "--json"))
    tokens = [r["prompt_tokens"] for r in json.loads(out)["results"]]
    assert code == 0 and tokens == [3, 3]  # byte-level: the bare text, without "\r" or the chat template
    assert alone(capsys, tiny, "two", "--system", "Be brief.")["prompt_tokens"] > alone(capsys, tiny, "two")[
        "prompt_tokens"]


def test_ctrl_c_keeps_the_printed_texts(tiny, prompt_file, capsys, monkeypatch):
    """Ctrl-C on prompt 2's first token (one prompt per batch): prompt 1's text stays printed and
    nothing else is; --json prints every prompt so far, "interrupted" where unfinished; exit 130."""
    import minispec.batch.speculative

    real = minispec.batch.speculative.generate_batch

    def interrupted_on_prompt_2(*args, on_tokens, **kwargs):
        def callback(index, tokens, num_accepted, num_proposed):
            on_tokens(index, tokens, num_accepted, num_proposed)
            if index == 1:
                raise KeyboardInterrupt
        return real(*args, on_tokens=callback, **kwargs)

    monkeypatch.setattr(minispec.batch.speculative, "generate_batch", interrupted_on_prompt_2)
    argv = common(tiny, "--prompt-file", str(prompt_file), "--batch-size", "1")
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 130 and err == "minispec.generate: interrupted\n"
    results = json.loads(out)["results"]
    assert [r["finish_reason"] for r in results][1:] == ["interrupted", "interrupted"]
    assert results[0]["finish_reason"] in ("eos", "length") and [len(r["tokens"]) for r in results][1:] == [1, 0]
    code, out, err = run_cli(capsys, *argv)
    assert code == 130 and err == "minispec.generate: interrupted\n"
    assert out == f"=== prompt 1/3 ({results[0]['finish_reason']}) ===\n{results[0]['text']}\n"


def test_help_says_how_batch_mode_reads_the_file_and_seeds_it(capsys):
    with pytest.raises(SystemExit):
        main(["-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one prompt per line" in text and "--seed + i" in text and "the file is one prompt" in text
    assert "max_num_seqs=N" in text and "-np N" in text and "batch_size=N" in text
