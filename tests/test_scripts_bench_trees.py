"""scripts/bench_trees.py: one short run on the real checkpoint writes its table, every row equal to plain greedy."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_trees.py"


def test_a_short_run_writes_every_configuration_equal_to_plain_greedy(real_ckpt, tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--ckpt", str(real_ckpt), "--prompts", "1", "--sets", "rag",
                    "--budgets", "3", "--max-new-tokens", "6", "--threads", "1", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "bench_trees.json").read_text())
    assert sorted(result["configs"]) == sorted(["plain", "chain early-exit:24 g3", "tree early-exit:24 3",
                                                "chain ngram g3", "tree ngram 3"])
    for name, records in result["configs"].items():
        assert len(records) == 1 and records[0]["same"], name  # greedy: every config emits plain greedy's tokens
        assert records[0]["nodes"] <= 3
    assert "| tree ngram 3 |" in (tmp_path / "bench_trees.md").read_text()
