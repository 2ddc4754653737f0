"""Batched decoding (minispec.batch.speculative, minispec.batch.ragged_cache) on random tiny models, float64.

The one property behind all of them: a row of a batch is decoded exactly as its prompt would be
alone. Greedy rows must equal plain greedy decoding of each prompt; sampled rows must equal the
prompt's own run with the row's seed (same draws, same order), so they keep the target
distribution (chi-square) and cannot depend on the other rows.
"""

import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec import acceptance
from minispec.acceptance.base import AcceptancePolicy, Decision
from minispec.batch.speculative import generate_batch
from minispec.chain.draft_length import DraftLength
from minispec.chain.drafters import ModelDrafter
from minispec.errors import CacheOverflowError, MinispecError
from minispec.model.sampling import SamplingParams
from minispec.decode import generate
from minispec.testing import (chi_square_p_value, make_ragged_cache_machine, model_configs, random_model, seeds,
                              sequence_distribution, tiny_config)
from minispec.testing.checks import P_VALUE_FLOOR

DRAFT_KINDS = [None, "same", "random", "ngram", "early-exit", "self:bf16", "p-min"]


def build_draft(kind, target, seed):
    if kind == "same":
        return target
    if kind == "random":  # a different model over the same vocabulary: rarely agrees
        return random_model(target.config, seed + 1)
    if kind == "ngram":
        return "ngram:2"
    if kind == "early-exit":
        return "early-exit:1" if target.config.num_layers > 1 else "ngram"
    if kind == "p-min":  # rows stop drafting at different points
        return ModelDrafter(random_model(target.config, seed + 1), p_min=0.3)
    return kind


@st.composite
def batch_setups(draw, max_layers: int = 2, max_rows: int = 4):
    """(config, seed, prompts): a random tiny model's config, a seed for its weights, and 1..4
    prompts of different lengths over the first 6 ids (repetitive: the n-gram drafter finds matches)."""
    cfg = draw(model_configs(max_layers=max_layers))
    seed = draw(seeds)
    prompt = st.lists(st.integers(0, min(cfg.vocab_size, 6) - 1), min_size=1, max_size=14)
    return cfg, seed, draw(st.lists(prompt, min_size=1, max_size=max_rows))


@given(setup=batch_setups(), kind=st.sampled_from(DRAFT_KINDS), gamma=st.integers(1, 5), n_new=st.integers(1, 16),
       draft_length=st.sampled_from(["fixed", "heuristic"]), eos_at=st.none() | st.integers(0, 15),
       batch_size=st.none() | st.integers(1, 3))
def test_batched_greedy_equals_each_prompt_decoded_alone(setup, kind, gamma, n_new, draft_length, eos_at, batch_size):
    """Plain and speculative (every drafter, every gamma) batches at T = 0, with an eos that ends
    rows at different steps (so rows leave the batch mid-run), equal plain greedy on each prompt."""
    cfg, seed, prompts = setup
    target = random_model(cfg, seed, scale=3.0)  # peaky distributions: long greedy agreements
    eos = [] if eos_at is None else [generate(target, prompts[0], max_new_tokens=n_new, eos_token_ids=[])
                                     .tokens[min(eos_at, n_new - 1)]]
    alone = [generate(target, p, max_new_tokens=n_new, eos_token_ids=eos) for p in prompts]
    batch = generate_batch(target, prompts, max_new_tokens=n_new, draft=build_draft(kind, target, seed), gamma=gamma,
                           draft_length=draft_length, eos_token_ids=eos, batch_size=batch_size)
    assert [r.tokens for r in batch] == [a.tokens for a in alone]
    assert [r.finish_reason for r in batch] == [a.finish_reason for a in alone]
    assert batch.stats["num_generated_tokens"] == sum(len(a.tokens) for a in alone)


# A row's stats: every figure of its own run but the clock readings, and without what its passes share.
CLOCK = {"prefill_seconds", "total_seconds", "tokens_per_second", "decode_tokens_per_second", "prefill_tokens_per_second"}
SHARED_WITH_THE_BATCH = {"target_forwards", "draft_forwards", "draft_seconds", "verify_seconds", "policy_seconds",
                         "draft_shares_target_cache"}


@settings(max_examples=10)
@given(setup=batch_setups(), kind=st.sampled_from(DRAFT_KINDS[1:]), gamma=st.integers(1, 5),
       policy=st.sampled_from(["exact", "sampling", "block", "typical", "dropmatch", "dropmatch-lazy", "kl-judge",
                               "lenience", "ensemble"]),
       temperature=st.sampled_from([0.0, 0.3, 1.0, 2.0]), schedule=st.sampled_from(["fixed", "heuristic", "fallback"]))
def test_each_rows_stats_are_its_own_runs_and_the_pooled_stats_their_sums(setup, kind, gamma, policy, temperature,
                                                                          schedule):
    """Row r's tokens and EVERY figure of its stats that is not a clock reading (lengths, counters,
    histograms, per-position rates, the policy's own counts, the finish reason) are those of
    generate(prompts[r], seed=seeds[r]); what a row shares with its batch-mates (target and draft
    forwards, phase timings) is in the pooled stats only. The pooled counts are the rows' sums,
    and the pooled tau is all committed tokens over all row-steps. The draft length schedules that
    adapt to acceptance (heuristic, the lab's fallback) are drawn too: each row's schedule is its own."""
    from minispec.lab.draft_length import Fallback

    cfg, seed, prompts = setup
    target = random_model(cfg, seed, scale=3.0)
    draft = build_draft(kind, target, seed)
    row_seeds = [seed + r for r in range(len(prompts))]
    lengths = Fallback(gamma, break_even=min(2.0, gamma + 1), window=2, probe=3) if schedule == "fallback" else schedule
    batch = generate_batch(target, prompts, max_new_tokens=12, draft=draft, policy=policy, gamma=gamma,
                           temperature=temperature, seed=row_seeds, eos_token_ids=[], draft_length=lengths)
    alone = [generate(target, p, max_new_tokens=12, draft=draft, policy=policy, gamma=gamma, temperature=temperature,
                      seed=s, eos_token_ids=[], draft_length=lengths) for p, s in zip(prompts, row_seeds)]
    for row, solo in zip(batch, alone):
        assert row.tokens == solo.tokens
        assert set(solo.stats) - set(row.stats) == SHARED_WITH_THE_BATCH
        assert {k: v for k, v in row.stats.items() if k not in CLOCK} == \
            {k: v for k, v in solo.stats.items() if k not in CLOCK | SHARED_WITH_THE_BATCH}
    pooled = batch.stats
    for key in ("verify_steps", "num_drafted", "num_accepted", "drafted_steps"):
        assert pooled[key] == sum(r.stats[key] for r in batch)
    committed_after_prefill = sum(len(r.tokens) - 1 for r in batch)
    assert pooled["tau"] == pytest.approx(committed_after_prefill / pooled["verify_steps"])
    assert pooled["target_forwards"] == 1 + max(r.stats["verify_steps"] for r in batch)  # rows share passes
    # a pass carries the rows still running, once each: row-passes are the rows' own verify steps
    passes = pooled["target_forwards"] - 1
    assert pooled["mean_rows_per_pass"] * passes == pytest.approx(pooled["verify_steps"])


@settings(max_examples=10)
@given(setup=batch_setups(), gamma=st.integers(2, 5), p_min=st.sampled_from([0.0, 0.2, 0.4]),
       draft_length=st.sampled_from(["fixed", "heuristic"]), n_new=st.integers(2, 16))
def test_the_target_as_its_own_batched_draft_model_is_always_accepted(setup, gamma, p_min, draft_length, n_new):
    """The target drafting for itself with its own ragged cache: rows stop drafting at different
    points (p_min, their own schedules, their own max_new_tokens), the others go on with pads in
    those rows, and yet every draft must be accepted: the draft cache of each row holds exactly its
    context and its fed drafts, never a pad. Row by row, the counts of its own run."""
    cfg, seed, prompts = setup
    target = random_model(cfg, seed)  # unpeaked: its confidence varies, so p_min stops rows at different points
    draft = ModelDrafter(target, p_min=p_min)  # its own cache, not the target's
    batch = generate_batch(target, prompts, max_new_tokens=n_new, draft=draft, gamma=gamma,
                           draft_length=draft_length, eos_token_ids=[])
    for prompt, row in zip(prompts, batch):
        assert row.stats["num_accepted"] == row.stats["num_drafted"]
        solo = generate(target, prompt, max_new_tokens=n_new, draft=draft, gamma=gamma, draft_length=draft_length,
                        eos_token_ids=[])
        assert (row.tokens, row.stats["num_drafted"]) == (solo.tokens, solo.stats["num_drafted"])


class EveryCallAnotherLength(DraftLength):
    """Draft lengths 1, 2, .., gamma, 1, .. from one counter shared by every row's copy: in each
    step the rows ask for different lengths, so the shorter ones ride along with pads."""

    name = "cycling"
    calls = itertools.count()

    def next(self) -> int:
        return 1 + next(EveryCallAnotherLength.calls) % self.gamma


@pytest.mark.parametrize("share", [False, True])
def test_rows_that_draft_fewer_tokens_keep_no_pads_in_the_draft_cache(share):
    """The target as its own draft model (own cache, or the target's shared cache), rows asking for
    different lengths every step: every draft must still be accepted, so no row's draft cache
    ever holds a pad where its own token belongs."""
    target = random_model(tiny_config(), 3, scale=3.0)
    draft = ModelDrafter(target, share_cache=share)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]
    out = generate_batch(target, prompts, max_new_tokens=30, draft=draft, gamma=4,
                         draft_length=EveryCallAnotherLength(4), eos_token_ids=[])
    assert [r.tokens for r in out] == [generate(target, p, max_new_tokens=30, eos_token_ids=[]).tokens for p in prompts]
    assert all(r.stats["num_accepted"] == r.stats["num_drafted"] > 0 for r in out)


test_ragged_cache_state_machine = make_ragged_cache_machine().TestCase
test_ragged_cache_state_machine.settings = settings(stateful_step_count=20)  # each step checks every row from scratch


class AcceptEverything(AcceptancePolicy):
    """A planted bug for the power check: keeps every draft, then the target's bonus."""

    def decide(self, inp):
        return Decision(inp.gamma, int(torch.multinomial(inp.p_target[-1], 1, generator=inp.generator)))


def sampled_counts(target, draft, policy, prompts, runs: int) -> list[dict]:
    """For each row: counts of its first three sampled tokens over `runs` batches, every row with
    its own seed in every batch."""
    counts = [dict() for _ in prompts]
    for run in range(runs):
        out = generate_batch(target, prompts, max_new_tokens=3, draft=draft, policy=policy, gamma=2,
                             temperature=1.0, seed=[run * len(prompts) + r for r in range(len(prompts))],
                             eos_token_ids=[])
        for row, result in zip(counts, out):
            key = tuple(result.tokens)
            row[key] = row.get(key, 0) + 1
    return counts


def test_batched_speculative_sampling_keeps_each_rows_target_distribution():
    """Each row's first three tokens (the prefill's, then a gamma-2 step's) against their exact
    joint distribution under plain sampling from the target on that row's prompt, chi-square over
    1200 seeded batches of 3 rows (prompts of lengths 5, 2, 4) on a 6-token vocabulary; the drafter
    is another random model. Power: a policy that keeps every draft fails the same test on a
    quarter of the runs."""
    cfg = tiny_config(vocab_size=6, num_layers=1)
    target, other = random_model(cfg, 11, scale=2.0), random_model(cfg, 12, scale=2.0)
    prompts, runs = [[1, 2, 1, 3, 1], [4, 0], [2, 2, 5, 1]], 1200
    probs = [sequence_distribution(target, p, 3, SamplingParams(1.0)) for p in prompts]
    lossless = sampled_counts(target, other, "sampling", prompts, runs)
    for r, (counts, p) in enumerate(zip(lossless, probs)):
        assert chi_square_p_value(counts, p, runs) > P_VALUE_FLOOR, f"row {r}"
    biased = sampled_counts(target, other, AcceptEverything(), prompts, runs // 4)
    assert all(chi_square_p_value(counts, p, runs // 4) < P_VALUE_FLOOR for counts, p in zip(biased, probs))


@settings(max_examples=10)
@given(setup=batch_setups(), kind=st.sampled_from(["random", "ngram", "early-exit"]), gamma=st.integers(1, 5),
       criterion=st.sampled_from(["js_or_majority", "js", "majority", "naive"]))
def test_dropmatch_at_p0_equals_exact_on_every_row(setup, kind, gamma, criterion):
    cfg, seed, prompts = setup
    target = random_model(cfg, seed, scale=3.0)
    draft = build_draft(kind, target, seed)
    exact = generate_batch(target, prompts, max_new_tokens=12, draft=draft, gamma=gamma, eos_token_ids=[])
    dropmatch = generate_batch(target, prompts, max_new_tokens=12, draft=draft, gamma=gamma, eos_token_ids=[],
                               policy=acceptance.get("dropmatch", p=0.0, criterion=criterion))
    assert [r.tokens for r in dropmatch] == [r.tokens for r in exact]
    assert [r.stats["num_accepted"] for r in dropmatch] == [r.stats["num_accepted"] for r in exact]


@settings(max_examples=10)
@given(setup=batch_setups(max_rows=3), mates=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=14),
                                                      min_size=0, max_size=3),
       kind=st.sampled_from(["random", "ngram", "early-exit", None]), gamma=st.integers(1, 4),
       policy=st.sampled_from(["sampling", "typical", "dropmatch"]), mate_seed=seeds, where=st.integers(0, 3))
def test_a_rows_sampled_output_does_not_depend_on_its_batch_mates(setup, mates, kind, gamma, policy, mate_seed, where):
    """Row 0 of one batch, put among other prompts (other lengths, other seeds) at any place in
    another batch, samples the same tokens: its own run's (T = 1; DropMatch at p = 0.3 draws masks)."""
    cfg, seed, prompts = setup
    target = random_model(cfg, seed, scale=2.0)
    draft = build_draft(kind, target, seed)
    mates = [[t % cfg.vocab_size for t in m] for m in mates]
    first = generate_batch(target, prompts, max_new_tokens=12, draft=draft, policy=policy, gamma=gamma,
                           temperature=1.0, seed=[seed] + [seed + 1 + r for r in range(len(prompts) - 1)],
                           eos_token_ids=[])
    at = min(where, len(mates))
    others = mates[:at] + [prompts[0]] + mates[at:]
    other_seeds = [mate_seed + r if r != at else seed for r in range(len(others))]
    second = generate_batch(target, others, max_new_tokens=12, draft=draft, policy=policy, gamma=gamma,
                            temperature=1.0, seed=other_seeds, eos_token_ids=[])
    alone = generate(target, prompts[0], max_new_tokens=12, draft=draft, policy=policy, gamma=gamma,
                     temperature=1.0, seed=seed, eos_token_ids=[])
    assert first[0].tokens == second[at].tokens == alone.tokens
    own = [{k: v for k, v in r.stats.items() if k not in CLOCK} for r in (first[0], second[at])]
    assert own[0] == own[1] == {k: v for k, v in alone.stats.items() if k not in CLOCK | SHARED_WITH_THE_BATCH}


@pytest.mark.parametrize("policy", ["dropmatch", "dropmatch-lazy"])
def test_each_row_draws_its_own_dropmatch_masks(policy):
    """At T = 0 DropMatch's masks are the only randomness (naive criterion, p = 0.6: they decide
    most steps): each row, seeded like its own run, must draw the masks that run draws."""
    target, draft = random_model(tiny_config(), 0), random_model(tiny_config(), 1)
    prompts, row_seeds = [[1, 2, 3], [4, 5, 6, 7, 8], [9]], [3, 4, 5]

    def dropmatch():
        return acceptance.get(policy, p=0.6, criterion="naive")

    batch = generate_batch(target, prompts, max_new_tokens=20, draft=draft, policy=dropmatch(), seed=row_seeds,
                           eos_token_ids=[])
    alone = [generate(target, p, max_new_tokens=20, draft=draft, policy=dropmatch(), seed=s, eos_token_ids=[]).tokens
             for p, s in zip(prompts, row_seeds)]
    assert [r.tokens for r in batch] == alone
    assert sum(r.stats["policy_info"]["accepted_by_dropmatch_only"] for r in batch) > 0  # the masks did decide


def test_streaming_reports_each_rows_tokens_in_order():
    target = random_model(tiny_config(), 0, scale=3.0)
    prompts = [[1, 2, 3, 1, 2], [4], [5, 6, 5, 6, 5, 6, 5]]
    streamed = {r: [] for r in range(len(prompts))}
    out = generate_batch(target, prompts, max_new_tokens=10, draft="ngram", eos_token_ids=[],
                         on_tokens=lambda r, tokens, n, g: streamed[r].extend(tokens))
    assert [streamed[r] for r in range(len(prompts))] == [r.tokens for r in out]


def test_generate_takes_several_prompts():
    target = random_model(tiny_config(), 0)
    prompts = [[1, 2, 3], [4, 5]]
    out = generate(target, prompts, max_new_tokens=5, eos_token_ids=[])
    assert [r.tokens for r in out] == [generate(target, p, max_new_tokens=5, eos_token_ids=[]).tokens for p in prompts]
    same_length = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert len(generate(target, same_length, max_new_tokens=3, eos_token_ids=[])) == 2


@pytest.mark.parametrize("call, message", [
    (dict(prompts=[]), "prompts: list (empty); expected a non-empty list of prompts"),
    (dict(prompts=[[1, 2], []]), "prompts[1]: prompt_ids: empty"),
    (dict(prompts=[[1, 2], [999]]), "prompts[1]: prompt_ids: token id 999 out of range"),
    (dict(seed=[1, 2, 3]), "seed = [1, 2, 3]; expected an integer, or a list of 2 integers (one per prompt)"),
    (dict(seed=[1, -1]), "seed[1] = -1 (prompt 1's seed); expected an integer 0 <= seed < 2**64"),
    (dict(batch_size=0), "batch_size = 0; expected an integer >= 1"),
    (dict(gamma=0, draft="ngram"), "gamma = 0; expected an integer >= 1"),
    (dict(draft="nope"), "draft='nope': unknown drafter"),
])
def test_clear_errors(call, message):
    target = random_model(tiny_config(), 0)
    kwargs = dict(prompts=[[1, 2], [3]], max_new_tokens=4) | call
    with pytest.raises(MinispecError) as err:
        generate_batch(target, **kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_generate_refuses_what_a_batch_cannot_do():
    target = random_model(tiny_config(), 0)
    with pytest.raises(MinispecError, match="^tree: not available with several prompts"):
        generate(target, [[1], [2]], max_new_tokens=3, draft="ngram", tree=4)
    with pytest.raises(MinispecError, match="^on_step: not available with several prompts"):
        generate(target, [[1], [2]], max_new_tokens=3, draft="ngram", on_step=print)


@pytest.mark.parametrize("kind", ["ngram", "random"])
def test_a_gamma_beyond_max_new_tokens_allocates_no_more_and_decodes_the_same(kind, monkeypatch):
    """No draft is longer than max_new_tokens - 1, so gamma = 10**12 decodes exactly as gamma =
    max_new_tokens, with a cache of the same size: the size a user gives is bounded by the work."""
    target = random_model(tiny_config(), 0)
    new_cache = target.new_cache
    prompts, n_new = [[1, 2, 3], [4]], 6
    tokens, sizes = {}, {}
    for gamma in (n_new, 10**12):
        sizes[gamma] = []  # (rows, positions) of every target cache the run makes
        monkeypatch.setattr(target, "new_cache", lambda *a, s=sizes[gamma], **k: s.append(a[:2]) or new_cache(*a, **k))
        out = generate_batch(target, prompts, max_new_tokens=n_new, draft=build_draft(kind, target, 0), gamma=gamma,
                             eos_token_ids=[])
        tokens[gamma] = [r.tokens for r in out.results]
    assert tokens[10**12] == tokens[n_new]
    assert sizes[10**12] == sizes[n_new] == [(2, 3 + 2 * n_new)]  # longest prompt + max_new_tokens + the padding


def test_a_prompt_longer_than_the_model_names_its_row():
    target = random_model(tiny_config(), 0)  # max_position_embeddings 128
    with pytest.raises(CacheOverflowError, match=r"^prompts\[1\]: prompt of 126 tokens \+ max_new_tokens=4"):
        generate_batch(target, [[1], [1] * 126], max_new_tokens=4)


@given(cfg=model_configs(), seed=seeds, lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       batch_size=st.integers(1, 4), draft=st.sampled_from([None, "ngram", "random"]))
def test_on_finish_reports_each_row_once_when_it_ends_with_its_result(cfg, seed, lengths, batch_size, draft):
    """on_finish(i, result): once per prompt, right after the row's last tokens were streamed and
    never before; the result is the one BatchResult holds (its finish reason the loop's own); the
    groups of batch_size prompts finish one after another. Rows end at different steps here: a
    token divisible by 4 stops a row, else max_new_tokens does."""
    target = random_model(cfg, seed, scale=3.0)
    prompts = [[(seed + 7 * i + j) % cfg.vocab_size for j in range(n)] for i, n in enumerate(lengths)]
    streamed = {i: [] for i in range(len(prompts))}
    finished, results = [], {}

    def on_tokens(index, tokens, num_accepted, num_proposed):
        assert index not in finished, f"tokens for prompt {index} after it finished"
        streamed[index].extend(tokens)

    def on_finish(index, result):
        assert index not in finished and streamed[index] == result.tokens
        finished.append(index)
        results[index] = result

    batch = generate_batch(target, prompts, max_new_tokens=8, draft=build_draft(draft, target, seed) if draft else None,
                           batch_size=batch_size, eos_token_ids=[], on_tokens=on_tokens, on_finish=on_finish,
                           stop_when=lambda tokens: tokens[-1] % 4 == 0, seed=seed)
    assert sorted(finished) == list(range(len(prompts)))
    for index, result in results.items():
        assert result is batch[index]
        assert result.finish_reason == ("stop" if result.tokens[-1] % 4 == 0 else "length")
    for first in range(0, len(prompts), batch_size):  # a group's rows all finish before the next group's
        group = set(range(first, min(first + batch_size, len(prompts))))
        assert set(finished[first:first + len(group)]) == group


def test_an_error_about_one_prompt_says_which_in_its_index():
    target = random_model(tiny_config(), 0)
    limit = target.config.max_position_embeddings
    prompts = [[1, 2], [1] * limit, [3]]
    with pytest.raises(CacheOverflowError) as caught:
        generate_batch(target, prompts, max_new_tokens=2)
    err = caught.value
    assert err.prompt_index == 1 and str(err) == f"prompts[1]: {err.reason}" and err.reason.startswith("prompt of")
    with pytest.raises(MinispecError) as caught:
        generate_batch(target, [[1], [2], []], max_new_tokens=2)
    assert caught.value.prompt_index == 2 and "empty" in caught.value.reason
    with pytest.raises(MinispecError) as caught:
        generate_batch(target, [[1]], max_new_tokens=0)
    assert caught.value.prompt_index == 0
