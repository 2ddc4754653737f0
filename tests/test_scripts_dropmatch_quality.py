"""scripts/dropmatch/dropmatch_quality.py, dropmatch_calibration.py, dropmatch_plot.py: the task, the paired
comparisons and their intervals, the Pareto front; a short quality run on the real checkpoint."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import dropmatch_calibration  # noqa: E402
import dropmatch_quality  # noqa: E402



class Digits:
    """A tokenizer stand-in: one id per character."""

    eos_token_ids = (0,)

    def apply_chat_template(self, messages):
        return [ord(c) % 50 + 1 for c in messages[-1]["content"]]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_the_addition_task_is_every_one_digit_sum_once_with_its_answer():
    prompts = dropmatch_quality.addition_prompts(Digits())
    assert len(prompts) == 100 and len({p.text for p in prompts}) == 100
    for p in prompts:
        a, b = (int(x) for x in p.text.removeprefix("What is ").removesuffix("?").split(" + "))
        assert p.gold == str(a + b) and p.ids


def test_the_comparison_is_paired_by_prompt_and_its_intervals_cover_the_estimate():
    base = [dict(steps=10, tokens_emitted=20, nll=1.0, tokens_per_second=10.0, agree_prefix=1.0, agree_match=1.0,
                 correct=i % 2 == 0) for i in range(30)]
    gain = [dict(steps=10, tokens_emitted=22 + (i % 3), nll=1.1, tokens_per_second=11.0, agree_prefix=0.5,
                 agree_match=0.8, correct=i % 2 == 0 and i % 3 != 0) for i in range(30)]
    out = dropmatch_quality.compare(gain, base)
    assert out["tau_gain"] == pytest.approx(23 / 20 - 1)
    assert out["nll_change"] == pytest.approx(0.1)
    assert out["agree_prefix_change"] == pytest.approx(-0.5) and out["speedup_vs_base"] == pytest.approx(1.1)
    assert out["correct_change"] == pytest.approx(-5 / 30)
    for key in ("tau_gain", "nll_change", "correct_change"):
        low, high = out[f"{key}_ci"]
        assert low <= out[key] <= high
    low, high = out["tau_gain_ci"]
    assert 0.1 < low < high < 0.2  # every prompt gains 10-20%: so does any resample


def test_a_comparison_with_itself_changes_nothing():
    runs = [dict(steps=5 + i, tokens_emitted=9 + 2 * i, nll=0.5 + i / 10, tokens_per_second=3.0, correct=bool(i % 2))
            for i in range(12)]
    out = dropmatch_quality.compare(runs, runs)
    assert out["tau_gain"] == 0 and out["tau_gain_ci"] == [0, 0] and out["nll_change_ci"] == [0, 0]
    assert out["correct_change"] == 0 and out["agree_prefix_change"] is None


def test_p_values_are_numbers_in_range_or_auto():
    assert dropmatch_quality.parse_p("0.3,auto,0") == (0.3, "auto", 0.0)
    for bad in ("1", "-0.1", "x", "nan"):
        with pytest.raises(Exception, match="--ps"):
            dropmatch_quality.parse_p(bad)


def test_the_pareto_front_keeps_only_undominated_points():
    plot = pytest.importorskip("dropmatch_plot", exc_type=ImportError,
                               reason="dropmatch_plot needs matplotlib (the [bench] extra)")
    points = [(0.1, 0.0), (0.2, 0.05), (0.15, 0.1), (0.3, 0.2), (0.05, 0.01)]
    assert plot.pareto_front(points) == [(0.1, 0.0), (0.2, 0.05), (0.3, 0.2)]


def test_the_calibration_curves_hold_both_estimates_and_the_measurement_at_every_p():
    rows, model = dropmatch_calibration.random_rows(32, 64, 16, seed=0)
    out = dropmatch_calibration.curves(rows, model.lm_head.weight.detach(), model.head, [0.0, 0.1, 0.5], [1, 3], [0.5])
    for k in ("1", "3"):
        assert set(out[k]) == {"measured", "first_order", "gaussian", "picks"}
        assert out[k]["measured"][0] == out[k]["first_order"][0] == out[k]["gaussian"][0] == 1.0
        assert out[k]["picks"][0]["measured_at_p_first_order"] is not None


def test_a_short_quality_run_writes_its_records_and_comparisons(real_ckpt, tmp_path):
    """Two prompts, 6 tokens, gamma 2, base + one DropMatch p: every record, every row, the markdown."""
    out = tmp_path / "out"
    status = dropmatch_quality.main(["--ckpt", str(real_ckpt), "--out", str(out), "--sets", "gsm8k:1,qa:1",
                                     "--no-addition", "--max-new-tokens", "6", "--gammas", "2",
                                     "--temperatures", "0", "--ps", "0.3", "--threads", "1"])
    assert status == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["policy"] for r in records} == {"base", "p=0.3"}
    result = json.loads((out / "dropmatch_quality.json").read_text())
    dm = [r for r in result["rows"] if r["policy"] == "p=0.3" and r["group"] == "all text"]
    assert len(dm) == 1 and "tau_gain" in dm[0] and dm[0]["prompts"] == 2
    base = [r for r in result["rows"] if r["policy"] == "base" and r["group"] == "all text"][0]
    assert base["agree_prefix"] == pytest.approx(1.0)  # exact match at T = 0 is the greedy text
    assert "tau gain" in (out / "dropmatch_quality.md").read_text()
    # --resume keeps what was run (the records stay byte for byte) and runs only the new p
    again = dropmatch_quality.main(["--ckpt", str(real_ckpt), "--out", str(out), "--sets", "gsm8k:1,qa:1",
                                    "--no-addition", "--max-new-tokens", "6", "--gammas", "2",
                                    "--temperatures", "0", "--ps", "0.3,0.1", "--threads", "1", "--resume"])
    resumed = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert again == 0 and len(resumed) == 6 and resumed[:4] == records
    assert {r["policy"] for r in resumed[4:]} == {"p=0.1"}
