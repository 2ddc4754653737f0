"""scripts/speed/bench_speed.py: the summaries and the markdown on hand-made records, and the flags."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_speed  # noqa: E402
import benchlib  # noqa: E402


def _plain(system, prompt, tps, decode_tps, prefill_tps, tokens, dtype="float32", set_name="chat"):
    return {"dtype": dtype, "set": set_name, "prompt": prompt, "system": system, "prompt_tokens": 30,
            "new_tokens": len(tokens), "tokens": tokens, "tps": tps, "decode_tps": decode_tps, "prefill_tps": prefill_tps}


def _result(plain=(), speculative=(), compile_seconds=None):
    return {"run": benchlib.finish_record(benchlib.run_record("bench_speed", [])),
            "settings": {"new_tokens": 2, "spec_tokens": 4, "gammas": [5], "prompts": 2, "reps": 1},
            "bandwidth": {"f_linear_float32_gbps": 10.0, "packed_bfloat16_gbps": 20.0, "bandwidth_gbps": 20.0},
            "compile_seconds": compile_seconds or {}, "plain": list(plain), "speculative": list(speculative)}


def test_summarise_plain_takes_ratios_of_medians_and_the_bound():
    records = [
        _plain("transformers", 0, 10.0, None, 100.0, [1, 2]), _plain("transformers", 1, 20.0, None, 300.0, [3, 4]),
        _plain("reference", 0, 11.0, 12.0, 100.0, [1, 2]), _plain("reference", 1, 21.0, 22.0, 300.0, [3, 4]),
        _plain("fast", 0, 20.0, 24.0, 200.0, [1, 2]), _plain("fast", 1, 40.0, 44.0, 400.0, [3, 5]),
    ]
    [row] = bench_speed.summarise_plain(records, {"float32": 1000}, bandwidth=68_000.0)  # bound: 68 tok/s
    assert row["transformers_tps"] == 15.0 and row["fast_tps"] == 30.0
    assert row["fast_vs_hf"] == pytest.approx(2.0)
    assert row["fast_of_bound"] == pytest.approx(34.0 / 68.0)
    assert row["fast_prefill_vs_hf"] == pytest.approx(300.0 / 200.0)
    assert (row["fast_same_as_reference"], row["prompts"]) == (1, 2)  # prompt 1 differs in its last token
    text = bench_speed.render(_result(plain=[row]))
    assert "| fast | 30.0 | 2.00x | 34.0 | 50% | 300 | 1.50x | 1/2 |" in text
    assert "| transformers | 15.0 |" in text


def test_summarise_plain_reports_the_compiled_kind_against_transformers():
    records = [
        _plain("transformers", 0, 10.0, None, 100.0, [1, 2]), _plain("reference", 0, 11.0, 12.0, 100.0, [1, 2]),
        _plain("fast", 0, 20.0, 24.0, 200.0, [1, 2]), _plain("compiled", 0, 35.0, 51.0, 190.0, [1, 3]),
    ]
    [row] = bench_speed.summarise_plain(records, {"float32": 1000}, bandwidth=68_000.0)  # bound: 68 tok/s
    assert row["compiled_vs_hf"] == pytest.approx(3.5)
    assert row["compiled_of_bound"] == pytest.approx(0.75)
    assert row["compiled_prefill_vs_hf"] == pytest.approx(1.9)
    assert row["compiled_same_as_reference"] == 0  # its second token differs
    text = bench_speed.render(_result(plain=[row], compile_seconds={"float32": 42.0}))
    assert "float32 42 s of compiling" in text


def test_summarise_plain_without_transformers_or_reference():
    [row] = bench_speed.summarise_plain([_plain("fast", 0, 20.0, 24.0, 200.0, [1])], {"float32": 1000}, 68_000.0)
    assert row["fast_vs_hf"] is None and "fast_same_as_reference" not in row
    assert "| fast | 20.0 | – |" in bench_speed.render(_result(plain=[row]))


def _spec(system, drafter, gamma, tps, tokens=(1,), prompt=0):
    return {"dtype": "float32", "set": "rag", "prompt": prompt, "system": system, "drafter": drafter, "gamma": gamma,
            "prompt_tokens": 700, "new_tokens": len(tokens), "tokens": list(tokens), "tps": tps, "tau": None,
            "decode_tps": None}


def test_summarise_speculative_compares_with_our_plain_and_the_best_prompt_lookup():
    records = [_spec("fast", "plain", None, 10.0), _spec("fast", "ngram", 5, 18.0),
               _spec("transformers", "plain", None, 5.0), _spec("transformers", "prompt-lookup", 5, 6.0),
               _spec("transformers", "prompt-lookup", 3, 9.0, tokens=(2,))]
    rows = {(r["system"], r["drafter"], r["gamma"]): r for r in bench_speed.summarise_speculative(records)}
    assert rows[("fast", "ngram", 5)]["vs_our_plain"] == pytest.approx(1.8)
    assert rows[("fast", "ngram", 5)]["vs_hf_plain"] == pytest.approx(3.6)
    assert rows[("fast", "ngram", 5)]["best_ours_vs_best_hf_prompt_lookup"] == pytest.approx(2.0)
    assert rows[("transformers", "prompt-lookup", 3)]["same_as_plain"] == 0
    assert rows[("transformers", "prompt-lookup", 5)]["same_as_plain"] == 1


def test_summarise_speculative_measures_the_compiled_kind_against_its_own_plain():
    records = [_spec("fast", "plain", None, 10.0), _spec("fast", "ngram", 5, 15.0),
               _spec("compiled", "plain", None, 16.0), _spec("compiled", "ngram", 5, 20.0),
               _spec("transformers", "plain", None, 5.0), _spec("transformers", "prompt-lookup", 5, 8.0)]
    rows = {(r["system"], r["drafter"], r["gamma"]): r for r in bench_speed.summarise_speculative(records)}
    assert rows[("compiled", "ngram", 5)]["vs_our_plain"] == pytest.approx(20.0 / 16.0)
    assert rows[("fast", "ngram", 5)]["vs_our_plain"] == pytest.approx(1.5)
    assert rows[("transformers", "prompt-lookup", 5)]["vs_our_plain"] == pytest.approx(0.8)  # vs the fast kind's plain
    best = rows[("fast", "ngram", 5)]
    assert best["best_ours_vs_best_hf_prompt_lookup"] == pytest.approx(2.5)
    assert best["best_ours_config"] == "compiled ngram g5"
    text = bench_speed.render(_result(speculative=list(rows.values())))
    assert "| float32 | rag | compiled | ngram | 5 | – | 20.0 | 1.25x | 4.00x |" in text
    assert "**2.50x** (compiled ngram g5 / prompt-lookup g5)" in text


@pytest.mark.parametrize("argv, flag", [
    (["--prompts", "0"], "--prompts"),
    (["--sections", "plain,fast"], "--sections"),
    (["--kernels", "fast,int8"], "--kernels"),
    (["--gammas", "2,x"], "--gammas"),
])
def test_bad_flag_is_one_line_and_exit_2(argv, flag):
    out = subprocess.run([sys.executable, str(SCRIPTS / "speed" / "bench_speed.py"), *argv], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and flag in out.stderr and out.stderr.startswith("bench_speed: error:")
