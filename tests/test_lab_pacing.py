"""Paced emission (minispec.lab.pacing): the schedule's rule, that it hides the per-step counts
while the generator keeps ahead, and the live stream delivering every token in order."""

import time

import pytest
from hypothesis import given, strategies as st

from minispec.lab import pacing
from minispec.chain.speculative import generate_chain as generate
from minispec.errors import MinispecError
from minispec.testing import random_model, tiny_config


@st.composite
def arrivals(draw, max_steps=30):
    """[(t_i, c_i)]: nondecreasing times, at least one token in all."""
    counts = draw(st.lists(st.integers(0, 7), min_size=1, max_size=max_steps))
    counts[0] = max(counts[0], 1)
    gaps = draw(st.lists(st.floats(0, 2, allow_nan=False), min_size=len(counts), max_size=len(counts)))
    times, t = [], 0.0
    for g in gaps:
        t += g
        times.append(t)
    return list(zip(times, counts))


@given(arr=arrivals(), chunk=st.integers(1, 9), interval=st.floats(0, 1.5, allow_nan=False))
def test_the_schedule_follows_its_rule(arr, chunk, interval):
    releases = pacing.schedule(arr, chunk, interval)
    total = sum(c for _, c in arr)
    sizes = [s for _, s in releases]
    assert sum(sizes) == total and all(s == chunk for s in sizes[:-1]) and 1 <= sizes[-1] <= chunk
    released = 0
    for k, (r, size) in enumerate(releases):
        released += size
        ready = min(t for i, (t, _) in enumerate(arr) if sum(c for _, c in arr[:i + 1]) >= released)
        expected = max((releases[k - 1][0] if k else arr[0][0]) + interval, ready)
        assert r == pytest.approx(expected, abs=1e-12)  # never early (causal), never later than the rule


@given(counts=st.lists(st.integers(1, 6), min_size=1, max_size=20), chunk=st.integers(1, 6),
       step_time=st.floats(0.001, 0.1), data=st.data())
def test_while_the_generator_keeps_ahead_the_releases_do_not_depend_on_the_steps(counts, chunk, step_time, data):
    """Two generations of the same length whose steps emitted different counts, both faster than
    the cadence: the client sees the same releases."""
    total = sum(counts)
    other = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=total).filter(lambda c: sum(c) <= total))
    other = other + [total - sum(other)] if sum(other) < total else other
    interval = chunk * 6 * step_time  # at most one step per token, and each step makes >= 1 token
    a = [(i * step_time, c) for i, c in enumerate(counts)]
    b = [(i * step_time, c) for i, c in enumerate(other)]
    ra, rb = pacing.schedule(a, chunk, interval), pacing.schedule(b, chunk, interval)
    assert [s for _, s in ra] == [s for _, s in rb]
    assert [t for t, _ in ra] == pytest.approx([t for t, _ in rb], abs=1e-9)


def test_whole_is_one_release_at_the_end():
    assert pacing.whole([(0.0, 1), (0.5, 3), (0.9, 2)]) == [(0.9, 6)]


def test_bad_settings_are_one_line():
    for chunk, interval, words in [(0, 1.0, "chunk = 0"), (2.5, 1.0, "chunk = 2.5"), (2, -1.0, "interval = -1.0"),
                                   (2, float("nan"), "interval = nan"), (2, True, "interval = True")]:
        with pytest.raises(MinispecError) as err:
            pacing.schedule([(0.0, 1)], chunk, interval)
        assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_the_live_stream_delivers_every_token_in_order_in_paced_chunks(chunk):
    """The clock readings are the test's own (when the first token reached the stream, when each
    chunk reached the client), not the stream's record of itself."""
    target = random_model(tiny_config(), 0, scale=3.0)
    got: list[list[int]] = []
    arrived, delivered, interval = [], [], 0.01

    def deliver(tokens):
        delivered.append(time.perf_counter())
        got.append(tokens)

    stream = pacing.PacedStream(deliver, chunk=chunk, interval=interval)

    def on_tokens(tokens, num_accepted, num_drafted):
        arrived.append(time.perf_counter())
        stream(tokens, num_accepted, num_drafted)

    out = generate(target, [1, 2, 3], max_new_tokens=25, draft=target, gamma=4, eos_token_ids=[], on_tokens=on_tokens)
    stream.close()
    assert sum(got, []) == out.tokens
    assert all(len(c) == chunk for c in got[:-1]) and 1 <= len(got[-1]) <= chunk
    times = arrived[:1] + delivered  # the first release comes an interval after the first token at the earliest
    assert all(b - a >= interval * 0.9 for a, b in zip(times, times[1:])), [b - a for a, b in zip(times, times[1:])]


def test_tokens_after_close_are_refused_not_lost():
    got = []
    stream = pacing.PacedStream(got.extend, chunk=2, interval=0.0)
    stream([1, 2, 3], 2, 2)
    stream.close()
    assert got == [1, 2, 3]
    with pytest.raises(MinispecError, match=r"^pacing: 1 token\(s\) after close\(\)"):
        stream([4], 0, 0)
    stream.close()  # a second close is harmless
    assert got == [1, 2, 3]
