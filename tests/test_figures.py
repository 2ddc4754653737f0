"""Every reported number recomputed from its documented definition (docs/metrics.md), on runs built
to separate the candidate readings: an eos inside an accepted run, steps that draft nothing,
several batch groups, rows that finish early. The oracle is a record of the run taken from the
outside (the stream of emitted tokens and each step's counts as the callbacks report them, and
the forward passes counted on the models themselves), never the figures under test."""

from __future__ import annotations

import time

import pytest
from hypothesis import assume, given, settings, strategies as st

from minispec.batch.ragged_cache import ROW_BY_ROW_ABOVE
from minispec.batch.speculative import generate_batch
from minispec.chain.speculative import generate_chain
from minispec.testing import model_configs, random_model, seeds
from minispec.trees.speculative import generate_tree


def count_passes(model):
    """Wrap model.forward_hidden to record each call's (rows, positions, cache); returns the record."""
    calls = []
    inner = model.forward_hidden

    def counted(ids, cache=None, *args, **kwargs):
        calls.append((ids.shape[0], ids.shape[1], cache))  # the cache itself: kept alive, so never confused
        return inner(ids, cache, *args, **kwargs)

    model.forward_hidden = counted
    return calls


def counted_steps(events: list[tuple[list[int], int, int]]) -> list[tuple[int, int, int]]:
    """(drafted, accepted, emitted) per step by the definition, from on_tokens(emitted, a, g) after the
    prefill's token: a == e means the run ended inside the accepted drafts (the step counts as e
    drafted, e accepted, e emitted); else e = a + 1."""
    out = []
    for emitted, a, g in events:
        e = len(emitted)
        out.append((e, e, e) if a == e else (g, a, e))
    return out


def expected_step_figures(steps, positions: int) -> dict:
    drafted = [s for s in steps if s[0] > 0]
    total_g, total_n = sum(g for g, _, _ in steps), sum(n for _, n, _ in steps)
    histogram = [0] * (positions + 1)
    for _, n, _ in drafted:
        histogram[n] += 1
    return {
        "verify_steps": len(steps),
        "tau": sum(e for *_, e in steps) / len(steps) if steps else 1.0,
        "drafted_steps": len(drafted),
        "tau_drafted": sum(e for *_, e in drafted) / len(drafted) if drafted else None,
        "acceptance_rate": total_n / total_g if total_g else 0.0,
        "num_drafted": total_g,
        "num_accepted": total_n,
        "per_position_acceptance": [(sum(n > i for _, n, _ in steps) / sum(g > i for g, _, _ in steps))
                                    if sum(g > i for g, _, _ in steps) else None for i in range(positions)],
        "accepted_length_histogram": histogram,
        "no_draft_steps": len(steps) - len(drafted),
    }


def check_timing(stats: dict, wall: float) -> None:
    """The throughput figures from their definitions, and their clock readings inside the call's."""
    assert 0 < stats["prefill_seconds"] <= stats["total_seconds"] <= wall
    assert stats["tokens_per_second"] == pytest.approx(stats["num_generated_tokens"] / stats["total_seconds"])
    assert stats["prefill_tokens_per_second"] == pytest.approx(stats["num_prompt_tokens"] / stats["prefill_seconds"])
    decode = stats["total_seconds"] - stats["prefill_seconds"]
    if decode > 0:
        assert stats["decode_tokens_per_second"] == pytest.approx((stats["num_generated_tokens"] - 1) / decode)


def eos_inside_a_run(first_tokens: list[int], events) -> int | None:
    """A token first emitted as an accepted draft that is not the step's last: ending there cuts a
    step inside its accepted run (the case that separates 'accepted' from 'committed')."""
    seen = set(first_tokens[:1])
    for emitted, a, _ in events:
        for i, token in enumerate(emitted):
            if token not in seen and i < a and i < len(emitted) - 1:
                return token
            seen.add(token)
    return None


RUN = st.fixed_dictionaries({"cfg": model_configs(max_layers=2), "seed": seeds, "gamma": st.integers(1, 4),
                             "prompt": st.lists(st.integers(0, 5), min_size=1, max_size=10),
                             "draft": st.sampled_from(["model", "ngram:1"]), "cut": st.booleans()})


@settings(max_examples=20, deadline=None)
@given(run=RUN)
def test_a_chains_figures_are_their_definitions(run):
    target = random_model(run["cfg"], run["seed"], scale=3.0)
    draft = random_model(run["cfg"], run["seed"], scale=3.0) if run["draft"] == "model" else run["draft"]  # agrees
    eos, max_new = [], 16

    def go(eos_ids):
        events = []
        target_calls = count_passes(target)
        draft_calls = count_passes(draft) if run["draft"] == "model" else []
        started = time.perf_counter()
        out = generate_chain(target, run["prompt"], max_new_tokens=max_new, draft=draft, gamma=run["gamma"],
                             eos_token_ids=eos_ids, on_tokens=lambda t, a, g: events.append((t, a, g)))
        wall = time.perf_counter() - started
        del target.forward_hidden
        if run["draft"] == "model":
            del draft.forward_hidden
        return out, events, wall, target_calls, draft_calls

    out, events, wall, target_calls, draft_calls = go(eos)
    if run["cut"]:
        token = eos_inside_a_run(out.tokens, events[1:])
        assume(token is not None)
        out, events, wall, target_calls, draft_calls = go([token])
        assert out.stats["finish_reason"] == "eos"
    streamed = [t for emitted, _, _ in events for t in emitted]
    assert streamed == out.tokens and out.stats["num_generated_tokens"] == len(streamed)
    assert out.stats["num_prompt_tokens"] == len(run["prompt"])
    steps = counted_steps(events[1:])
    positions = max(1, min(run["gamma"], max_new - 1))
    assert {k: out.stats[k] for k in expected_step_figures(steps, positions)} == expected_step_figures(steps, positions)
    assert out.stats["target_forwards"] == len(target_calls) == 1 + len(steps)
    if run["draft"] == "model":
        assert out.stats["draft_forwards"] == len(draft_calls)
    check_timing(out.stats, wall)


@settings(max_examples=15, deadline=None)
@given(run=RUN, budget=st.integers(1, 8))
def test_a_trees_figures_are_their_definitions(run, budget):
    target = random_model(run["cfg"], run["seed"], scale=3.0)
    draft = random_model(run["cfg"], run["seed"], scale=3.0) if run["draft"] == "model" else run["draft"]
    max_new = 16

    def go(eos_ids):
        events = []
        target_calls = count_passes(target)
        started = time.perf_counter()
        out = generate_tree(target, run["prompt"], max_new_tokens=max_new, draft=draft, tree=budget,
                            eos_token_ids=eos_ids, on_tokens=lambda t, a, g: events.append((t, a, g)))
        wall = time.perf_counter() - started
        del target.forward_hidden
        return out, events, wall, target_calls

    out, events, wall, target_calls = go([])
    if run["cut"]:  # an eos inside an accepted path: the step's depth is what it committed, not the path
        token = eos_inside_a_run(out.tokens, events[1:])
        assume(token is not None)
        out, events, wall, target_calls = go([token])
        assert out.stats["finish_reason"] == "eos"
    steps = counted_steps(events[1:])
    positions = max(1, min(out.stats["max_depth"], max_new - 1))
    assert {k: out.stats[k] for k in expected_step_figures(steps, positions)} == expected_step_figures(steps, positions)
    verify_rows = [positions_ for _, positions_, _ in target_calls[1:]]  # a verify pass: the tree's nodes + 1 rows
    assert out.stats["target_forwards"] == len(target_calls) == 1 + len(steps)
    assert out.stats["nodes_per_step"] == pytest.approx(sum(r - 1 for r in verify_rows) / len(steps) if steps else 0.0)
    histogram = [0] * (out.stats["max_depth"] + 1)
    for _, a, _ in events[1:]:
        histogram[a] += 1
    assert out.stats["accepted_depth_histogram"] == histogram
    check_timing(out.stats, wall)


@settings(max_examples=15, deadline=None)
@given(run=RUN, num_prompts=st.integers(1, 5), batch_size=st.integers(1, 3))
def test_a_batchs_pooled_figures_are_their_definitions(run, num_prompts, batch_size):
    target = random_model(run["cfg"], run["seed"], scale=3.0)
    draft = random_model(run["cfg"], run["seed"] + 1, scale=3.0) if run["draft"] == "model" else run["draft"]
    # prompts of at most ROW_BY_ROW_ABOVE tokens: a group's prefill is then one batched pass
    prompts = [run["prompt"][: 1 + (i * 3) % min(len(run["prompt"]), ROW_BY_ROW_ABOVE)] for i in range(num_prompts)]
    events: dict[int, list] = {i: [] for i in range(num_prompts)}
    target_calls = count_passes(target)
    started = time.perf_counter()
    out = generate_batch(target, prompts, max_new_tokens=10 + num_prompts, draft=draft, gamma=run["gamma"],
                         batch_size=batch_size, eos_token_ids=[],
                         on_tokens=lambda r, t, a, g: events[r].append((t, a, g)))
    wall = time.perf_counter() - started
    del target.forward_hidden
    groups = -(-num_prompts // batch_size)
    first_of_cache = {}
    for i, (_, _, cache) in enumerate(target_calls):
        first_of_cache.setdefault(id(cache), i)
    prefills = set(first_of_cache.values())  # each group's first pass on its new cache (short prompts: one pass)
    passes = [rows for i, (rows, _, _) in enumerate(target_calls) if i not in prefills]
    stats = out.stats
    assert len(prefills) == groups and stats["target_forwards"] == len(target_calls) == groups + len(passes)
    assert stats["mean_rows_per_pass"] == pytest.approx(sum(passes) / len(passes) if passes else 0.0)
    steps = [s for r in range(num_prompts) for s in counted_steps(events[r][1:])]
    positions = max(1, min(run["gamma"], 10 + num_prompts - 1))
    want = expected_step_figures(steps, positions)
    assert {k: stats[k] for k in want} == want
    generated = sum(len(r.tokens) for r in out)
    assert stats["num_generated_tokens"] == generated == sum(len(t) for r in events.values() for t, _, _ in r)
    assert stats["num_prompts"] == num_prompts and stats["batch_size"] == min(batch_size, num_prompts)
    assert 0 < stats["total_seconds"] <= wall
    assert stats["tokens_per_second"] == pytest.approx(generated / stats["total_seconds"])
    for r, row in enumerate(out):  # each row's own figures, from its own stream
        row_steps = counted_steps(events[r][1:])
        want = expected_step_figures(row_steps, positions)
        assert {k: row.stats[k] for k in want} == want
        assert 0 < row.stats["prefill_seconds"] <= row.stats["total_seconds"] <= wall
