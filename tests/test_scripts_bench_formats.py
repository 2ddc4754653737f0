"""scripts/speed/bench_formats.py's arithmetic: the tau a drafter needs, and its table."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "speed"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_formats  # noqa: E402


def test_tau_needed_is_the_step_cost_over_a_decode_step():
    costs = {1: 10.0, 4: 12.0, 6: 15.0}
    # a free draft at gamma 3: a step is one 4-row pass, so tau x 10 / 12 = 1.8
    assert bench_formats.tau_needed(costs, 0.0, gamma=3, target=1.8) == pytest.approx(1.8 * 12.0 / 10.0)
    # 5 drafts of 4 ms + a 6-row pass of 15 ms: 35 ms a step, out of reach (> gamma + 1)
    assert bench_formats.tau_needed(costs, 4.0, gamma=5, target=1.8) == pytest.approx(6.3)
    # pass costs read back from JSON have string keys
    assert bench_formats.tau_needed({"1": 10.0, "4": 12.0}, 0.0, gamma=3) == pytest.approx(2.16)


def test_the_tau_table_marks_what_no_drafter_can_reach():
    result = {"settings": {"draft": "d", "gammas": [3, 5, 9]}, "draft_step": {"ms": 4.0},
              "formats": [{"format": "fp16", "pass_ms": {1: 10.0, 4: 12.0, 6: 15.0}}]}
    text = bench_formats.render_tau_needed(result, ks=[1, 4, 6])
    assert "| format | n-gram g3 | n-gram g5 | d g3 | d g5 |" in text  # gamma 9 needs a 10-row pass: not measured
    assert "| fp16 | 2.16 | 2.70 | 4.32 (> gamma+1) | 6.30 (> gamma+1) |" in text


def _run(fmt, config, prompt, tps, decode, tokens_equal=True, prefix=None):
    return {"format": fmt, "config": config, "prompt": prompt, "tps": tps, "decode_tps": decode, "tau": None,
            "equals_plain": tokens_equal, "float32_prefix": prefix, "near_tie": None}


def test_transformers_rows_are_against_their_own_plain_and_never_minispecs_fastest():
    hf = "transformers bfloat16"
    result = {"formats": [{"format": "fp16", "bound_tps": 40.0}],
              "runs": [_run("fp16", "plain", "A", 10.0, 20.0), _run("fp16", "plain", "B", 8.0, 10.0),
                       _run(hf, "plain", "A", 5.0, 6.0), _run(hf, "plain", "B", 4.0, 5.0),
                       _run(hf, "assisted", "A", 10.0, 99.0), _run(hf, "assisted", "B", 12.0, 99.0, False, 3)]}
    rows = {(r["format"], r["config"]): r for r in bench_formats.summarize(result)}
    assert rows[("fp16", "plain")]["of_bound"] == pytest.approx(15.0 / 40.0)  # median decode tok/s over the bound
    assert rows[(hf, "plain")]["of_bound"] is None  # transformers' bytes are not measured here
    assert rows[(hf, "assisted")]["x_plain"] == pytest.approx(2.5)  # median of 10/5 and 12/4, per prompt
    assert rows[(hf, "assisted")]["equals_plain"] == 1 and rows[(hf, "assisted")]["float32_equal"] == 1
    llama = {"target": "t", "draft": None, "plain_tps": {"t": 50.0}, "speculative": []}
    text = bench_formats.render_llama(llama, list(rows.values()))
    assert "fp16 plain, 15.0 decode tok/s = 0.30x" in text  # transformers' 99 tok/s is not minispec's fastest
