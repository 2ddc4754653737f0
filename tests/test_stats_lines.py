"""What `--stats` prints and what `--vs-plain` adds, each figure against its definition.

The stats dict's own figures are recomputed from the run in tests/test_figures.py; here the printed
lines are parsed back and each number checked against the dict it was printed from, by the
definition the line states (drafted per drafted step = num_drafted / drafted_steps; DropMatch's
heads agreeing = heads_agree / positions, or path positions per verify step; ...), on runs built
so that the candidate readings differ (steps without a draft, a lazy and an eager DropMatch).
`--vs-plain` is run through the command: speedup = tokens_per_second / plain_tokens_per_second.
"""

from __future__ import annotations

import json
import re

import pytest

from minispec import acceptance
from minispec.chain.speculative import generate_chain
from minispec.generate.printing import format_stats
from minispec.lab.draft_length import Fallback
from minispec.testing import random_model, tiny_config


def number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1))


@pytest.fixture(scope="module")
def models():
    cfg = tiny_config(vocab_size=16, num_layers=1)
    return random_model(cfg, 3, scale=3.0), random_model(cfg, 9, scale=3.0)


@pytest.mark.parametrize("policy", ["dropmatch", "dropmatch-lazy", "typical"])
def test_each_printed_figure_is_its_definition_on_the_stats_it_was_printed_from(models, policy):
    target, draft = models
    schedule = Fallback(3, break_even=3.5, window=1, probe=3)  # off after a poor step: steps without a draft
    rule = acceptance.get(policy, **({"p": 0.3} if "dropmatch" in policy else {}))
    result = generate_chain(target, [1, 2, 3, 4], max_new_tokens=40, draft=draft, gamma=3, policy=rule,
                            draft_length=schedule, temperature=1.0, seed=7, eos_token_ids=[])
    s = dict(result.stats)
    if "dropmatch" in policy:
        s["dropout_p"] = rule.p
    s.update(plain_tokens_per_second=s["tokens_per_second"] / 1.7, plain_tokens_equal=False, speedup=1.7,
             policy_lossless=rule.lossless)
    assert s["no_draft_steps"] > 0 and s["drafted_steps"] > 0, "the run must separate the two kinds of step"
    text = format_stats(s)

    assert number(r"tau ([\d.]+) tokens/step", text) == pytest.approx(s["tau"], abs=0.005)
    assert number(r"acceptance rate ([\d.]+)", text) == pytest.approx(s["num_accepted"] / s["num_drafted"], abs=0.005)
    assert number(r"\(vLLM's, llama.cpp's\): ([\d.]+)", text) == pytest.approx(s["tau_drafted"], abs=0.005)
    assert number(r"over the (\d+) steps with drafts", text) == s["drafted_steps"]
    assert number(r": ([\d.]+) drafted per drafted step", text) == pytest.approx(
        s["num_drafted"] / s["drafted_steps"], abs=0.05)
    assert number(r"(\d+) steps? without a draft", text) == s["no_draft_steps"]
    assert f"accepted-length histogram {s['accepted_length_histogram']}" in text
    assert number(r"target forwards (\d+)", text) == s["target_forwards"]
    assert number(r"draft forwards (\d+)", text) == s["draft_forwards"]
    printed = re.search(r"per-position acceptance ([-\d. ]+);", text).group(1).split()
    assert [None if p == "-" else float(p) for p in printed] == [
        None if a is None else pytest.approx(a, abs=0.005) for a in s["per_position_acceptance"]]
    assert number(r"speculative: ([\d.]+)x", text) == pytest.approx(1.7, abs=0.005)
    info = s["policy_info"]
    if "dropmatch" in policy:
        assert number(r"(\d+) tokens? accepted only thanks to DropMatch", text) == info["accepted_by_dropmatch_only"]
        if policy == "dropmatch":
            assert number(r"agree with the clean argmax at ([\d.]+)% of positions", text) == pytest.approx(
                100 * info["heads_agree"] / info["positions"], abs=0.05)
        else:
            assert number(r"dropout paths computed at ([\d.]+) positions per step", text) == pytest.approx(
                info["path_positions"] / s["verify_steps"], abs=0.005)
    else:
        assert "DropMatch" not in text


def test_vs_plain_reports_the_ratio_of_the_two_runs_and_whether_their_tokens_agree(real_ckpt, capsys):
    from minispec.generate import main

    code = main(["--ckpt", str(real_ckpt), "--prompt", "Count to five:", "--max-new-tokens", "12", "--draft", "ngram",
                 "--json", "--vs-plain"])
    out = capsys.readouterr().out
    assert code == 0
    s = json.loads(out)["stats"]
    assert s["speedup"] == pytest.approx(s["tokens_per_second"] / s["plain_tokens_per_second"], rel=1e-12)
    assert s["plain_tokens_equal"] is True and s["policy_lossless"] is True  # greedy exact: plain's own tokens
