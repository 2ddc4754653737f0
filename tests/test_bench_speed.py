"""minispec.bench_speed: the summaries on hand-made records, the flags, and the memory probe."""

import subprocess
import sys

import pytest

from minispec import bench_speed


def _plain(system, prompt, tps, decode_tps, prefill_tps, tokens, dtype="float32", set_name="chat"):
    return {"dtype": dtype, "set": set_name, "prompt": prompt, "system": system, "prompt_tokens": 30,
            "new_tokens": len(tokens), "tokens": tokens, "tps": tps, "decode_tps": decode_tps, "prefill_tps": prefill_tps}


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
    assert (row["fast_same_tokens"], row["prompts"]) == (1, 2)  # prompt 1 differs in its last token
    assert "| float32 | chat |" in bench_speed.render({
        "meta": {"command": "x", "machine": {"cpu": "c", "cores": 2, "torch": "t", "transformers": "h"}, "seconds": 1,
                 "load_average": "0", "new_tokens": 2},
        "bandwidth": {"f_linear_gbps": 10.0, "packed_gbps": 20.0, "bandwidth_gbps": 20.0},
        "plain": [row], "speculative": [], "dropmatch": [], "memory": []})


def test_summarise_plain_reports_the_compiled_path_against_transformers_and_fast():
    records = [
        _plain("transformers", 0, 10.0, None, 100.0, [1, 2]), _plain("reference", 0, 11.0, 12.0, 100.0, [1, 2]),
        _plain("fast", 0, 20.0, 24.0, 200.0, [1, 2]), _plain("compiled", 0, 35.0, 51.0, 190.0, [1, 3]),
    ]
    [row] = bench_speed.summarise_plain(records, {"float32": 1000}, bandwidth=68_000.0)  # bound: 68 tok/s
    assert row["compiled_vs_hf"] == pytest.approx(3.5)
    assert row["compiled_of_bound"] == pytest.approx(0.75)
    assert row["compiled_prefill_vs_hf"] == pytest.approx(1.9)
    assert row["compiled_same_as_fast"] == 0  # its second token differs
    text = bench_speed.render({
        "meta": {"command": "x", "machine": {"cpu": "c", "cores": 2, "torch": "t", "transformers": "h"}, "seconds": 1,
                 "load_average": "0", "new_tokens": 2, "compile_seconds": {"float32": 42.0}},
        "bandwidth": {"f_linear_gbps": 10.0, "packed_gbps": 20.0, "bandwidth_gbps": 20.0},
        "plain": [row], "speculative": [], "dropmatch": [], "memory": []})
    assert "float32 42 s of compiling" in text and "| float32 | chat | 35.0 | **3.50x** | 1.75x |" in text


def test_summarise_speculative_compares_with_our_plain_and_the_best_prompt_lookup():
    def rec(system, drafter, gamma, prompt, tps, tokens):
        return {"dtype": "bfloat16", "set": "rag", "prompt": prompt, "system": system, "drafter": drafter,
                "gamma": gamma, "prompt_tokens": 700, "new_tokens": len(tokens), "tokens": tokens, "tps": tps, "tau": None}

    records = [rec("minispec", "plain", None, 0, 10.0, [1]), rec("minispec", "ngram", 5, 0, 18.0, [1]),
               rec("transformers", "plain", None, 0, 5.0, [1]), rec("transformers", "prompt-lookup", 5, 0, 6.0, [1]),
               rec("transformers", "prompt-lookup", 3, 0, 9.0, [2])]
    rows = {(r["system"], r["drafter"], r["gamma"]): r for r in bench_speed.summarise_speculative(records)}
    assert rows[("minispec", "ngram", 5)]["vs_our_plain"] == pytest.approx(1.8)
    assert rows[("minispec", "ngram", 5)]["best_ours_vs_best_hf_prompt_lookup"] == pytest.approx(2.0)
    assert rows[("transformers", "prompt-lookup", 3)]["same_as_plain"] == 0


def test_summarise_speculative_measures_the_compiled_path_against_its_own_plain():
    def rec(system, drafter, gamma, tps):
        return {"dtype": "float32", "set": "rag", "prompt": 0, "system": system, "drafter": drafter,
                "gamma": gamma, "prompt_tokens": 700, "new_tokens": 1, "tokens": [1], "tps": tps, "tau": None}

    records = [rec("minispec", "plain", None, 10.0), rec("minispec", "ngram", 5, 15.0),
               rec("minispec-compiled", "plain", None, 16.0), rec("minispec-compiled", "ngram", 5, 20.0),
               rec("transformers", "plain", None, 5.0), rec("transformers", "prompt-lookup", 5, 8.0)]
    rows = {(r["system"], r["drafter"], r["gamma"]): r for r in bench_speed.summarise_speculative(records)}
    assert rows[("minispec-compiled", "ngram", 5)]["vs_our_plain"] == pytest.approx(20.0 / 16.0)
    assert rows[("minispec", "ngram", 5)]["vs_our_plain"] == pytest.approx(1.5)
    assert rows[("transformers", "prompt-lookup", 5)]["vs_our_plain"] == pytest.approx(0.8)  # vs the fast path's plain
    best = rows[("minispec", "ngram", 5)]
    assert best["best_ours_vs_best_hf_prompt_lookup"] == pytest.approx(2.5)
    assert best["best_ours_config"] == "minispec-compiled ngram g5"


def test_bad_flag_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, "-m", "minispec.bench_speed", "--prompts", "0"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--prompts" in out.stderr


def test_weights_bytes_counts_a_tied_head_once():
    from minispec.testing import random_model, tiny_config
    import torch

    tied = random_model(tiny_config(tie_word_embeddings=True), 0, dtype=torch.float32)
    untied = random_model(tiny_config(tie_word_embeddings=False), 0, dtype=torch.float32)
    head_bytes = untied.lm_head.weight.numel() * 4
    assert bench_speed.weights_bytes(untied) - bench_speed.weights_bytes(tied) == head_bytes


def test_dropmatch_loop_overhead_replays_real_steps_eager_and_lazy():
    import torch

    from minispec.testing import random_model, tiny_config

    model = random_model(tiny_config(), 0, dtype=torch.float64)  # float64: no near-ties between variants
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5]]  # repetitive: the n-gram drafter finds matches
    rows = bench_speed.dropmatch_loop_overhead(model, prompts, gamma=3, max_new_tokens=12, eos=[], reps=1)
    assert [r["variant"] for r in rows] == list(bench_speed.DROPMATCH_VARIANTS)
    for row in rows:
        assert row["prompts"] == 2 and row["steps"] >= 2 and row["verify_ms_per_step"] > 0
        assert row["extra_share"] == row["extra_share"]  # a number (either sign on a tiny model)
    lazy = [r for r in rows if r["variant"] != "eager"]
    assert all(0 <= r["path_positions_per_step"] <= 3 for r in lazy)  # at most the drafted positions of a step
    # the same decisions, so the same positions need paths; prefetching more can only save head calls
    assert len({round(r["path_positions_per_step"], 9) for r in lazy}) == 1
    calls = [r["path_head_calls_per_step"] for r in lazy]
    assert calls == sorted(calls, reverse=True)


def test_sections_flag_rejects_unknown_names_in_one_line():
    out = subprocess.run([sys.executable, "-m", "minispec.bench_speed", "--sections", "plain,fast"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--sections" in out.stderr


def test_speculation_ceiling_is_the_step_cost_over_a_decode_step():
    costs = {1: 10.0, 4: 12.0, 6: 15.0}
    free = bench_speed.speculation_ceiling(costs, draft_ms=0.0, gamma=3)
    assert free["step_ms"] == 12.0
    assert free["tau_needed"] == pytest.approx(1.8 * 12.0 / 10.0)  # tau * 10 / 12 = 1.8
    assert free["best_speedup"] == pytest.approx(4 * 10.0 / 12.0)
    costly = bench_speed.speculation_ceiling(costs, draft_ms=4.0, gamma=5)  # 5 drafts of 4 ms + a 15 ms pass
    assert costly["step_ms"] == 35.0
    assert costly["tau_needed"] == pytest.approx(6.3) and costly["tau_needed"] > 5 + 1  # out of reach
    assert costly["best_speedup"] == pytest.approx(6 * 10.0 / 35.0)
    text = bench_speed.render({
        "meta": {"command": "x", "machine": {"cpu": "c", "cores": 2, "torch": "t", "transformers": "h"}, "seconds": 1,
                 "load_average": "0", "new_tokens": 2},
        "bandwidth": {"f_linear_gbps": 10.0, "packed_gbps": 20.0, "bandwidth_gbps": 20.0},
        "plain": [], "speculative": [], "dropmatch": [], "memory": [],
        "verify_passes": [{"dtype": "float32", "kernels": "fast", "context": 700, "pass_ms": costs}],
        "verify_ceilings": [{"dtype": "float32", "kernels": "fast", "drafter": "self:int8", **costly}]})
    assert "| float32 | fast | 700 | 10.0 | 12.0 | 15.0 | 1.20 | 1.50 |" in text
    assert "| float32 | fast | self:int8 | 5 | 4.00 | 35.0 | **6.30** (> gamma+1) | 1.71x |" in text


def test_pass_costs_rolls_every_pass_back():
    import torch

    from minispec.testing import random_model, tiny_config

    model = random_model(tiny_config(), 0, dtype=torch.float32)
    # the cache has room for the context and one pass: a pass not rolled back would overflow it
    costs = bench_speed.pass_costs(model, list(range(1, 20)), rows=(1, 3), reps=2)
    assert set(costs) == {1, 3} and all(v > 0 for v in costs.values())
    assert bench_speed.ngram_draft_ms([1, 2, 3, 1, 2], gamma=3, vocab_size=model.config.vocab_size, reps=2) > 0
