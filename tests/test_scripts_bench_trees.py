"""scripts/speed/bench_trees.py: one short run on the real checkpoint writes its tables, every row equal to plain greedy;
the shape specs parse (and bad ones are refused)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SCRIPT = SCRIPTS / "speed" / "bench_trees.py"


def _bench_trees():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_trees
    finally:
        sys.path.remove(str(SCRIPTS))
    return bench_trees


def test_shape_specs_parse_into_drafter_arguments():
    bt = _bench_trees()
    dyn, static, only16 = bt.shape_list("w4k8,s16-1-1,s8-1@16")
    assert (dyn["kind"], dyn["width"], dyn["branching"], dyn["at"]) == ("dynamic", 4, (8,), None)
    assert (static["kind"], static["width"], static["branching"]) == ("static", None, (16, 1, 1))
    assert (only16["name"], only16["branching"], only16["at"]) == ("s8-1", (8, 1), 16)
    for bad in ("w4", "k4", "s", "s4-", "s0-1", "w0k4", "w4k4@0", "x", "g4k4", "t:a.json"):
        with pytest.raises(argparse.ArgumentTypeError):
            bt.shape_list(bad)


def test_a_short_run_writes_every_configuration_equal_to_plain_greedy(real_ckpt, tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--ckpt", str(real_ckpt), "--prompts", "1", "--sets", "rag",
                    "--budgets", "3", "--shapes", "w2k2,s3,s1-1@4", "--chain-gammas", "1,3",
                    "--max-new-tokens", "6", "--threads", "1", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "bench_trees.json").read_text())
    trees = ["tree early-exit:24 w2k2 3", "tree early-exit:24 s3 3"]  # s1-1@4: no budget 4
    assert sorted(result["configs"]) == sorted(["plain", "chain early-exit:24 g1", "chain early-exit:24 g3", *trees,
                                                "chain ngram g3", "tree ngram 3"])
    for name, records in result["configs"].items():
        assert len(records) == 1 and records[0]["same"], name  # greedy: every config emits plain greedy's tokens
        assert records[0]["nodes"] <= 3
    (best,) = result["best"]
    taus = {name: result["configs"][name][0]["tau"] for name in result["configs"]}
    assert best["tau"] == max(taus[t] for t in trees) and best["chain_gB"] == taus["chain early-exit:24 g3"]
    assert best["best_chain"] == max(taus["chain early-exit:24 g1"], taus["chain early-exit:24 g3"])
    text = (tmp_path / "bench_trees.md").read_text()
    assert "| tree ngram 3 |" in text and "gain vs best chain" in text and "Load average" in text


def test_dropmatch_rows_at_p0_equal_greedy_and_report_quality(real_ckpt, tmp_path):
    """--dropmatch 0: the naive rule with every head the clean one is greedy, so its rows emit plain
    greedy's tokens with the greedy tree's tau, prefix 1 and dNLL 0."""
    subprocess.run([sys.executable, str(SCRIPT), "--ckpt", str(real_ckpt), "--prompts", "1", "--sets", "summarization",
                    "--budgets", "4", "--shapes", "s2-1", "--chain-gammas", "2", "--dropmatch", "0",
                    "--max-new-tokens", "8", "--threads", "1", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    configs = json.loads((tmp_path / "bench_trees.json").read_text())["configs"]
    for tree in ("tree early-exit:24 s2-1 4", "tree ngram 4"):
        (greedy,), (naive,) = configs[tree], configs[tree + " dropmatch-naive p0"]
        assert naive["same"] and naive["tau"] == greedy["tau"] and naive["prefix"] == 1.0 and naive["dnll"] == 0.0
        assert naive["verify_ms"] > 0
    assert "| prefix | dNLL |" in (tmp_path / "bench_trees.md").read_text()
