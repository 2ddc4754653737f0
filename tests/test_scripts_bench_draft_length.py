"""scripts/speed/bench_draft_length.py: the configurations, one tiny run of every kind on a random model,
the summary and the markdown, and the flags."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_draft_length as bench  # noqa: E402
import benchlib  # noqa: E402

from minispec.chain.drafters import make_drafter  # noqa: E402
from minispec.testing import random_model, tiny_config  # noqa: E402


def test_configs_cover_fixed_heuristic_and_cut_offs_for_the_model_drafter_only():
    labels = [c.label for c in bench.configs(["self:bf16", "ngram"], (3, 8), (0.5,))]
    assert labels == ["plain", "self:bf16 fixed g3", "self:bf16 fixed g8", "self:bf16 heuristic g<=8",
                      "self:bf16 fixed g8 p>=0.5", "ngram fixed g3", "ngram fixed g8", "ngram heuristic g<=8"]


def test_bench_runs_every_config_and_summarises_against_plain_on_the_same_prompt():
    target = random_model(tiny_config(), 3, scale=3.0)
    drafters = {"self:bf16": make_drafter("self:bf16", target), "ngram": make_drafter("ngram", target)}
    config_list = bench.configs(list(drafters), (2, 4), (0.5, 1.0))
    prompts = {"qa": [[5, 6, 7, 5, 6], [1, 2, 3]], "rag": [[4, 4, 4]]}
    with torch.inference_mode():
        records = bench.bench(target, drafters, prompts, config_list, max_new_tokens=12, eos=[])
    assert len(records) == len(config_list) * 3
    assert all(r["same_as_plain"] for r in records)  # float64: exact greedy equals plain greedy
    by_label = {(r["label"], r["set"], r["prompt"]): r for r in records}
    assert by_label[("self:bf16 fixed g4 p>=1", "qa", 0)]["drafted_per_step"] == 0  # p_min = 1: nothing drafted
    assert by_label[("plain", "qa", 0)]["draft_forwards_per_token"] == 0
    assert by_label[("plain", "qa", 0)]["target_forwards_per_token"] == 1.0

    rows = {r["label"]: r for r in bench.summarise(records)}
    assert list(rows) == [c.label for c in config_list]
    assert rows["plain"]["speed"] == 1.0 and rows["plain"]["tau"] == 1.0
    heuristic = rows["self:bf16 heuristic g<=4"]
    assert heuristic["schedule"] == "heuristic" and heuristic["gamma"] == 4 and heuristic["prompts"] == 3
    assert heuristic["same_as_plain"] == 3
    text = bench.render({"run": benchlib.finish_record(benchlib.run_record(bench.PROG, [])),
                         "settings": {"sets": ["qa", "rag"], "prompts": 2, "num_prompts": 3, "max_new_tokens": 12},
                         "rows": list(rows.values())})
    assert "| self:bf16 heuristic g<=4 |" in text and "| plain | 1.00 | – | – | 0.00 | 1.00 |" in text


def test_summarise_takes_the_median_of_per_prompt_speed_ratios():
    def rec(label, drafter, prompt, tps):
        return {"set": "qa", "prompt": prompt, "label": label, "drafter": drafter, "schedule": None, "gamma": None,
                "p_min": 0.0, "tps": tps, "tau": 1.0, "acceptance": None, "drafted_per_step": None,
                "draft_forwards_per_token": 0.0, "target_forwards_per_token": 1.0, "new_tokens": 4,
                "same_as_plain": True}

    records = [rec("plain", "plain", 0, 10.0), rec("plain", "plain", 1, 40.0), rec("plain", "plain", 2, 20.0),
               rec("x", "ngram", 0, 30.0), rec("x", "ngram", 1, 80.0), rec("x", "ngram", 2, 10.0)]
    row = {r["label"]: r for r in bench.summarise(records)}["x"]
    assert row["speed"] == 2.0  # per-prompt ratios 3, 2, 0.5 (the ratio of the medians would be 30 / 20)
    assert row["tps"] == 30.0


@pytest.mark.parametrize("argv, flag", [
    (["--prompts", "0"], "--prompts"),
    (["--p-mins", "0.5,1.5"], "--p-mins"),
    (["--gammas", "0"], "--gammas"),
    (["--drafters", "ngram,eagle"], "--drafters"),
    (["--sets", "chat"], "--sets"),
])
def test_bad_flag_is_one_line_and_exit_2(argv, flag):
    out = subprocess.run([sys.executable, str(SCRIPTS / "speed" / "bench_draft_length.py"), *argv], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and flag in out.stderr and out.stderr.startswith("bench_draft_length: error:")
