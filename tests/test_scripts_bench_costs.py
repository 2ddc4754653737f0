"""scripts/dropmatch/bench_dropmatch_cost.py and scripts/speed/bench_memory.py on a tiny model, and
the pieces of scripts/benchlib.py they share."""

import argparse
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_dropmatch_cost  # noqa: E402
import bench_memory  # noqa: E402
import benchlib  # noqa: E402

from minispec.testing import random_model, tiny_config  # noqa: E402

# ------------------------------------------------------------------------------ DropMatch cost


def test_replay_costs_replays_real_steps_for_every_variant():
    model = random_model(tiny_config(), 0, dtype=torch.float64)  # float64: no near-ties between variants
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5]]  # repetitive: the n-gram drafter finds matches
    rows = bench_dropmatch_cost.replay_costs(model, prompts, gamma=3, max_new_tokens=12, eos=[], reps=1)
    assert [r["variant"] for r in rows] == list(bench_dropmatch_cost.VARIANTS)
    for row in rows:
        assert row["prompts"] == 2 and row["steps"] >= 2 and row["verify_ms_per_step"] > 0
        assert row["extra_share"] is not None  # a number (either sign on a tiny model)
    assert rows[0]["path_positions_per_step"] is None  # plain DropMatch: every position, no count
    [lazy] = rows[1:]
    assert 0 <= lazy["path_positions_per_step"] <= 3  # at most the drafted positions of a step
    assert lazy["path_head_calls_per_step"] == lazy["path_positions_per_step"]  # p > 0: one head call a position


def test_verify_step_gives_the_policy_the_clean_logits_and_the_head():
    """The replay scores the clean rows with the head and hands the policy hidden and head, as the loop does."""
    from minispec import acceptance
    from minispec.model.sampling import SamplingParams, logits_to_probs

    model = random_model(tiny_config(), 0, dtype=torch.float64)
    hidden = model.forward_hidden(torch.tensor([[1, 2, 3]]))[0]  # [3, d]: gamma = 2
    logits = model.head(hidden)
    params = SamplingParams(0.0)
    draft = logits[:2].argmax(-1)  # the target's own argmax: exact accepts both
    step = acceptance.VerifyInput(draft, torch.nn.functional.one_hot(draft, logits.shape[-1]).double(),
                                  torch.zeros_like(logits), logits_to_probs(logits, params), params,
                                  torch.Generator(), None, hidden=hidden, head=model.head)
    seen = []

    class Watching(acceptance.ExactMatch):
        def decide(self, inp):
            seen.append(inp.target_logits)
            return super().decide(inp)

    decision = Watching()  # the step's own target_logits are zeros: the replay recomputes them
    assert bench_dropmatch_cost.verify_step(decision, step).num_accepted == 2
    torch.testing.assert_close(seen[0], logits)


# -------------------------------------------------------------------------------------- memory


def test_kv_bytes_per_position_counts_k_and_v_of_every_layer():
    config = tiny_config()
    model = random_model(config, 0, dtype=torch.float32)
    expected = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    assert bench_memory._kv_bytes_per_position(model) == expected
    assert bench_memory._kv_bytes_per_position(model, num_layers=1) == expected // config.num_layers


# ------------------------------------------------------------------------------------ benchlib


def test_weights_bytes_counts_a_tied_head_once():
    tied = random_model(tiny_config(tie_word_embeddings=True), 0, dtype=torch.float32)
    untied = random_model(tiny_config(tie_word_embeddings=False), 0, dtype=torch.float32)
    head_bytes = untied.lm_head.weight.numel() * 4
    assert benchlib.weights_bytes(untied) - benchlib.weights_bytes(tied) == head_bytes


def test_time_interleaved_warms_up_then_takes_turns():
    calls = []
    seconds = benchlib.time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=3)
    assert calls == ["a", "b"] * 4 and set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())


def test_list_flags_keep_order_drop_repeats_and_reject_bad_items():
    assert benchlib.number_list(int, "--gammas", 1)("5,3,5") == (5, 3)
    assert benchlib.name_list("--kernels", benchlib.KERNELS)("fast,reference,fast") == ("fast", "reference")
    for parse, text in ((benchlib.number_list(float, "--t", 0), "nan"), (benchlib.number_list(int, "--g", 1), ""),
                        (benchlib.name_list("--kernels", benchlib.KERNELS), "fast,int4")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_run_record_names_the_code_the_checkpoint_and_the_machine(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}')
    record = benchlib.finish_record(benchlib.run_record("bench_formats", ["--prompts", "2", "a b"], tmp_path))
    assert record["command"] == "python scripts/speed/bench_formats.py --prompts 2 'a b'"
    assert record["checkpoint"]["architecture"] == "Qwen3ForCausalLM" and record["checkpoint"]["name"] == tmp_path.name
    assert record["torch"] == torch.__version__ and record["machine"]["cores"] >= 1 and record["wall_seconds"] >= 0
    assert "_t0" not in record
    text = benchlib.record_markdown(record)
    assert "`python scripts/speed/bench_formats.py --prompts 2 'a b'`" in text and "Qwen3ForCausalLM" in text


def test_memory_child_reports_the_rise_of_a_real_generation(real_ckpt, tmp_path):
    import json

    assert bench_memory.main(["--ckpt", str(real_ckpt), "--dtypes", "bfloat16", "--kernels", "reference",
                              "--new-tokens", "2", "--out", str(tmp_path)]) == 0
    [row] = json.loads((tmp_path / "bench_memory.json").read_text())["rows"]
    from minispec import load_model

    assert row["weights_bytes"] == benchlib.weights_bytes(load_model(real_ckpt, dtype=torch.bfloat16))
    assert row["tokens"] == 2 and row["peak_rise_bytes"] >= row["after_load_rise_bytes"] > 0


def test_a_configuration_this_cpu_cannot_run_is_skipped_in_one_line(monkeypatch, capsys):
    """An AVX2-only CPU has no packed bfloat16: the benchmarks skip that configuration, saying so."""
    from minispec.kernels import fbgemm, packed

    monkeypatch.setattr(packed, "packs", lambda dtype: dtype == torch.float32)
    monkeypatch.setattr(fbgemm, "available", lambda: False)
    assert benchlib.runs_here("bench_x", "float32", "fast") and benchlib.runs_here("bench_x", "bfloat16", "reference")
    assert not benchlib.runs_here("bench_x", "bfloat16", "fast")
    assert not benchlib.runs_here("bench_x", "float32", "int8-dynamic")
    err = capsys.readouterr().err.splitlines()
    assert err == ["bench_x: skipping bfloat16 fast: this CPU's oneDNN does not pack bfloat16 (it needs AVX-512 "
                   "BW/VL/DQ or AVX-NE-CONVERT)", "bench_x: skipping float32 int8-dynamic: this torch build or CPU "
                   "has no fbgemm"]
