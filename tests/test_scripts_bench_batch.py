"""scripts/speed/bench_batch.py: one short run on a tiny random checkpoint (the real tokenizer and prompts)
writes every table, and every configuration's rows are plain greedy decoding's; the summaries on
hand-made records; the flags."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_batch  # noqa: E402

from minispec.model.config import ModelConfig  # noqa: E402
from minispec.testing import random_model  # noqa: E402

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def tiny_ckpt(real_ckpt, tmp_path_factory):
    """The real checkpoint's tokenizer and config with a random 2-layer, 32-wide body (same vocabulary,
    so the real prompts tokenize as they do for the real model): the whole run takes seconds."""
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    raw = json.loads((real_ckpt / "config.json").read_text())
    raw.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=4096)
    (folder / "config.json").write_text(json.dumps(raw))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(real_ckpt / name, folder / name)
    model = random_model(ModelConfig.from_hf(raw), seed=0, dtype=torch.float32, scale=3.0)  # peaked: no near-ties
    from safetensors.torch import save_file

    save_file({"model." + k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              folder / "model.safetensors")
    return folder


def test_a_tiny_run_writes_every_table_and_every_row_is_plain_greedy(tiny_ckpt, tmp_path, capsys):
    """DropMatch at p = 0 is exact match (every dropout path is the clean head), so at T = 0 every
    configuration, transformers' included, must emit plain greedy decoding's rows."""
    code = bench_batch.main(["--ckpt", str(tiny_ckpt), "--sets", "rag", "--batch-sizes", "1,2", "--max-new-tokens", "6",
                             "--drafts", "ngram@3,self:int8@4", "--policies", "exact,dropmatch:p=0,dropmatch-lazy:p=0", "--reps", "2,1", "--up-to", "dropmatch=1", "--threads", "1",
                             "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "bench_batch.json").read_text())
    rules = ("exact", "dropmatch:p=0", "dropmatch-lazy:p=0")
    names = ["plain"] + [f"{d} {p}" for d in ("ngram g3", "self:int8 g4") for p in rules]
    names += ["transformers"] if HAS_TRANSFORMERS else []
    at = {1: names, 2: [n for n in names if not n.endswith(" dropmatch:p=0")]}  # --up-to dropmatch=1
    assert [(r["batch_size"], r["config"]) for r in result["rows"]] == [(b, n) for b in (1, 2) for n in at[b]]
    assert result["settings"]["reps"] == {"1": 2, "2": 1} and result["run"]["machine"]["torch_threads"] == 1
    assert result["run"]["load_average_start"] and result["run"]["load_average_end"]
    plain = {r["batch_size"]: r["tokens"] for r in result["records"] if r["config"] == "plain"}
    for r in result["records"]:
        assert r["reps"] == (2 if r["batch_size"] == 1 else 1)
        assert [len(t) for t in r["tokens"]] == [6] * r["batch_size"], r["config"]  # eos ignored: 6 tokens each
        assert r["tokens"] == plain[r["batch_size"]], r["config"]
    for r in result["rows"]:
        assert r["same_as_plain"] == r["batch_size"] and r["tps"] > 0
        if r["config"] == "plain":
            assert r["tau"] == 1.0 and r["decode_vs_plain"] == 1.0 and r["tau_needed"] is None
        elif r["draft"] is not None:
            assert 1.0 <= r["tau"] <= r["gamma"] + 1 and r["tau_needed"] > 0 and r["verify_ms"] > 0
    assert {(g["draft"], g["policy"], g["batch_size"]) for g in result["dropmatch"]} == {
        (d, p, b) for d in ("ngram", "self:int8") for p in rules[1:] for b in (1, 2)
        if (p, b) != ("dropmatch:p=0", 2)}
    assert [(c["batch_size"], sorted(k for k in c if k.endswith("_ms"))) for c in result["pass_costs"]] == [
        (b, ["k1_ms", "k4_ms", "k5_ms"]) for b in (1, 2)]
    text = (tmp_path / "bench_batch.md").read_text()
    for heading in ("## rag: plain decoding against the batch size", "## rag: every configuration",
                    "## DropMatch over its base", "## One target pass of [B, k] new tokens"):
        assert heading in text
    assert "| 2 | self:int8 g4 dropmatch-lazy:p=0 |" in text and "torch threads" in text


def _record(batch_size, config, tps, decode_tps, step_ms, tau=1.0, tokens=((1, 2),), draft=None, policy=None):
    return {"set": "rag", "batch_size": batch_size, "config": config, "draft": draft, "gamma": 3 if draft else None,
            "policy": policy, "tokens": [list(t) for t in tokens], "tps": tps, "decode_tps": decode_tps,
            "step_ms": step_ms, "tau": tau, "policy_share": None}


def test_summaries_take_ratios_against_plain_at_b1_and_at_the_same_b():
    records = [_record(1, "plain", 10.0, 20.0, 50.0), _record(4, "plain", 30.0, 80.0, 50.0, tokens=((1,), (2,))),
               _record(4, "ngram g3 exact", 33.0, 60.0, 100.0, tau=1.5, tokens=((1,), (3,)), draft="ngram",
                       policy="exact"),
               _record(4, "ngram g3 dropmatch", 36.0, 90.0, 100.0, tau=2.25, tokens=((1,), (3,)), draft="ngram",
                       policy="dropmatch"),
               _record(4, "transformers", 15.0, 40.0, None, tau=None, tokens=((1,), (2,)))]
    rows = {r["config"]: r for r in bench_batch.summarise(records) if r["batch_size"] == 4}
    spec = rows["ngram g3 exact"]
    assert spec["decode_vs_plain_b1"] == pytest.approx(3.0) and spec["decode_vs_plain"] == pytest.approx(0.75)
    assert spec["tps_vs_plain"] == pytest.approx(1.1) and spec["tau_needed"] == pytest.approx(2.0)
    assert spec["same_as_plain"] == 1 and rows["transformers"]["same_as_plain"] == 2
    assert rows["plain"]["decode_vs_hf"] == pytest.approx(2.0) and rows["plain"]["tps_vs_hf"] == pytest.approx(2.0)
    (gain,) = bench_batch.dropmatch_gains(list(rows.values()))
    assert (gain["policy"], gain["batch_size"]) == ("dropmatch", 4)
    assert gain["decode_gain"] == pytest.approx(1.5) and gain["tau_gain"] == pytest.approx(1.5)


def test_draft_and_reps_flags_parse():
    assert bench_batch.draft_list("ngram@3,self:int8@8,early-exit:24@2") == (
        ("ngram", 3), ("self:int8", 8), ("early-exit:24", 2))
    assert bench_batch.reps_per_size((1, 2, 4), bench_batch.reps_list("3,3,1")) == {1: 3, 2: 3, 4: 1}
    assert bench_batch.reps_per_size((1, 2), (2,)) == {1: 2, 2: 2}
    assert bench_batch.up_to_list("dropmatch=4,transformers=8") == {"dropmatch": 4, "transformers": 8}


@pytest.mark.parametrize("argv, flag", [
    (["--drafts", "ngram"], "--drafts"),
    (["--drafts", "ngram@0"], "--drafts"),
    (["--policies", "exact,typical"], "--policies"),
    (["--batch-sizes", "0,2"], "--batch-sizes"),
    (["--reps", "2,x"], "--reps"),
    (["--up-to", "dropmatch:4"], "--up-to"),
    (["--up-to", "typical=4"], "--up-to"),
])
def test_bad_flag_is_one_line_and_exit_2(capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_info:
        bench_batch.build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and flag in err and err.startswith("bench_batch: error:")


def test_reps_that_do_not_match_the_batch_sizes_are_refused_before_loading(tiny_ckpt, capsys):
    assert bench_batch.main(["--ckpt", str(tiny_ckpt), "--reps", "1,1", "--batch-sizes", "1,2,4"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # a busy machine's warning may come first
    assert last.startswith("bench_batch: error: --reps = 1,1: 2 numbers") and "(3)" in last
