"""scripts/security/: the attack search (attack_tau.py) and the leakage classifier (leakage.py) on a
random model and synthetic traces: what each keeps, what each reports, and their flags."""

import random
import subprocess
import sys
from pathlib import Path

import torch
from hypothesis import given, strategies as st

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS / "security"))

import attack_tau  # noqa: E402
import leakage  # noqa: E402

from minispec import acceptance  # noqa: E402
from minispec.chain.drafters import make_drafter  # noqa: E402
from minispec.testing import random_model, tiny_config  # noqa: E402


class ByteTokenizer:
    """Text -> its UTF-8 bytes modulo the vocabulary: enough for the scripts' chat-template call."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def apply_chat_template(self, messages):
        return [b % self.vocab for b in messages[0]["content"].encode("utf-8")] or [0]


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@given(text=st.text(alphabet="abcdefgh XYZ.,!?", min_size=1, max_size=60), seed=st.integers(0, 10**6))
def test_a_perturbation_is_a_small_edit_and_seeded(text, seed):
    """A typo swaps two letters, a re-casing or a dropped mark changes one character, a doubled space
    adds one, a suffix appends at most a short phrase: never a rewrite."""
    changed = attack_tau.perturb(text, random.Random(seed))
    assert changed == attack_tau.perturb(text, random.Random(seed))
    if changed.startswith(text):
        assert changed[len(text):] in attack_tau.SUFFIXES
    else:
        assert edit_distance(text, changed) <= 2


def test_the_search_keeps_only_prompts_with_the_benign_output_and_never_raises_tau():
    target = random_model(tiny_config(), 3, scale=3.0)
    tokenizer = ByteTokenizer(target.config.vocab_size)
    drafter = make_drafter("ngram:2", target)
    text = "abab cdcd abab cdcd efef"
    with torch.inference_mode():
        found = attack_tau.search(target, tokenizer, text, drafter, 4, 12, [], rounds=3, candidates=4, seed=1)
        benign = attack_tau.greedy_run(target, tokenizer, text, None, "exact", 4, 12, [])
        same = attack_tau.greedy_run(target, tokenizer, found["same_text"], None, "exact", 4, 12, [])
        spec_same = attack_tau.greedy_run(target, tokenizer, found["same_text"], drafter, "exact", 4, 12, [])
        spec_any = attack_tau.greedy_run(target, tokenizer, found["any_text"], drafter, "exact", 4, 12, [])
    assert same.tokens == benign.tokens  # "same": the target's greedy output is unchanged
    assert found["same_tau"] == spec_same.stats["tau"] <= found["benign_tau"]
    assert found["any_tau"] == spec_any.stats["tau"] <= found["same_tau"]  # "any" minimises over more
    assert found["candidates"] == 12 and 0 <= found["valid_candidates"] <= 12


def test_evaluate_reports_every_rule_and_the_fallback_against_plain():
    target = random_model(tiny_config(), 3, scale=3.0)
    tokenizer = ByteTokenizer(target.config.vocab_size)
    policies = {"exact": acceptance.get("exact"), "typical": acceptance.get("typical")}
    with torch.inference_mode():
        rows = attack_tau.evaluate(target, tokenizer, "abc abc abc", target, policies, 3, 13, [], tau_star=2.0)
    assert list(rows) == ["plain", "exact", "typical", "exact+fallback"]
    assert rows["exact"]["same_as_greedy"] and rows["exact+fallback"]["same_as_greedy"]  # lossless, float64
    assert rows["exact"]["tau"] == 4.0  # the target drafting for itself: 12 tokens after the first in 3 steps of 4


def test_loo_accuracy_is_perfect_on_separated_classes_and_chance_at_best_on_identical_ones():
    X = [[float(c) * 10 + 0.1 * i, 1.0] for c in range(3) for i in range(4)]
    y = [str(c) for c in range(3) for _ in range(4)]
    assert leakage.loo_accuracy(X, y) == {"centroid": 1.0, "3-nn": 1.0}
    same = leakage.loo_accuracy([[1.0, 2.0]] * 12, y)
    assert all(acc <= 1 / 3 + 1e-9 for acc in same.values())


def test_paced_views_show_the_same_chunks_whatever_the_steps_accepted():
    rng = random.Random(0)
    traces = {"plain": [], "fast": []}
    for category in leakage.CATEGORIES:
        for i in range(3):
            for name, most in (("plain", 1), ("fast", 6 if category == "qa" else 2)):
                arrivals, t, n = [(0.0, 1)], 0.0, 1
                while n < 40:
                    c = min(rng.randint(1, most), 40 - n)
                    t += 0.01
                    arrivals.append((t, c))
                    n += c
                traces[name].append({"set": category, "prompt": i, "arrivals": arrivals})
    rows = {(r["drafter"], r["view"]): r for r in leakage.analyse(traces, chunk=4, gamma=5)}
    assert rows[("fast", "stream")]["counts centroid"] > 1 / 6  # qa's long chunks give it away
    for view in ("paced@plain", "whole"):
        assert rows[("fast", view)]["counts centroid"] <= 1 / 6 + 1e-9  # every chunk the same: nothing to learn
    assert rows[("fast", "paced@plain")]["latency"] > 1.0  # waiting for the cadence costs time


def test_flags_are_checked_in_one_line():
    for script, args, words in [("attack_tau.py", ["--rounds", "0"], "--rounds"),
                                ("attack_tau.py", ["--policies", "nope"], "--policies"),
                                ("leakage.py", ["--prompts", "1"], "--prompts")]:
        done = subprocess.run([sys.executable, str(SCRIPTS / "security" / script), *args, "--ckpt", "/nonexistent"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
