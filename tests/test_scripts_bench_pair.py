"""scripts/speed/bench_pair.py's arithmetic on planted records (the run itself needs the real pair and minutes):
speed-ups are per prompt against the same tool's plain decoding, then the median; output equality
is against minispec's bf16 plain decoding; the tables split HumanEval from MT-bench prompts."""

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_pair  # noqa: E402


def record(prompt, config, tps, tokens, **more):
    return {"prompt": prompt, "config": config, "decode_tps": tps, "tokens": tokens, **more}


def planted() -> dict:
    plain, draft, hf, hf_assisted = ("plain fast bf16", "0.5B draft, gamma 5", "transformers plain bf16",
                                     "transformers assisted, 0.5B draft")
    llama = bench_pair.LLAMA[0]
    records = [
        record("humaneval/A", plain, 5.0, [1, 2, 3]), record("humaneval/A", draft, 10.0, [1, 2, 3], tau=5.0, acceptance=0.9),
        record("humaneval/B", plain, 4.0, [4, 5, 6]), record("humaneval/B", draft, 12.0, [4, 5, 7], tau=4.0, acceptance=0.8),
        record("mt_bench/C", plain, 6.0, [7, 8]), record("mt_bench/C", draft, 6.0, [7, 8], tau=2.0, acceptance=0.5),
        record("humaneval/A", hf, 2.0, [1, 2, 3]), record("humaneval/A", hf_assisted, 5.0, [1, 2, 3]),
        record("humaneval/B", hf, 2.0, [4, 5, 6]), record("humaneval/B", hf_assisted, 3.0, [4, 5, 6]),
        {"prompt": "humaneval/A", "config": llama, "decode_tps": 6.0, "acceptance": 0.9},
        {"prompt": "humaneval/B", "config": llama, "error": "crashed"},
    ]
    return {"records": records, "configs": [plain, draft, hf, hf_assisted, llama],
            "llama_cpp_plain_tps": {f"{bench_pair.TARGET}, no repack": 12.0, bench_pair.TARGET: 15.0}}


def test_speedups_are_per_prompt_over_the_tools_own_plain_then_the_median():
    rows = {r["config"]: r for r in bench_pair.summarize(planted(), "humaneval")}
    assert rows["0.5B draft, gamma 5"]["speedup"] == 2.5  # median of 10/5 = 2 and 12/4 = 3
    assert rows["0.5B draft, gamma 5"]["decode_tps"] == 11.0 and rows["0.5B draft, gamma 5"]["tau"] == 4.5
    assert rows["transformers assisted, 0.5B draft"]["speedup"] == 2.0  # median of 2.5 and 1.5
    llama = rows[bench_pair.LLAMA[0]]
    assert llama["n"] == 1 and llama["speedup"] == 0.5  # the failed run is left out; over plain without repacking


def test_equality_and_prefix_are_against_bf16_plain_and_sets_are_separate():
    rows = {r["config"]: r for r in bench_pair.summarize(planted(), "humaneval")}
    assert rows["0.5B draft, gamma 5"]["equal"] == 1 and rows["0.5B draft, gamma 5"]["prefix"] == 2.5  # 3 and 2
    mt = {r["config"]: r for r in bench_pair.summarize(planted(), "mt_bench")}
    assert mt["0.5B draft, gamma 5"]["speedup"] == 1.0 and mt["0.5B draft, gamma 5"]["n"] == 1
    everything = {r["config"]: r for r in bench_pair.summarize(planted())}
    assert everything["0.5B draft, gamma 5"]["n"] == 3 and everything["0.5B draft, gamma 5"]["speedup"] == 2.0


def test_step_bytes_count_every_matrix_once():
    import json
    import tempfile

    config = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_key_value_heads": 1,
              "num_attention_heads": 2, "vocab_size": 40000}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        sizes = bench_pair.step_bytes({"m": Path(tmp)})
    block = 2 * (8 * (8 + 2 * 4) + 8 * 8 + 3 * 8 * 16)  # q, k, v; o; gate, up, down
    assert sizes["m int8"] == block + 40000 * 8 and sizes["m bf16"] == 2 * sizes["m int8"]
    assert sizes["m int8, 32k head"] == block + bench_pair.FREQUENT * 8
