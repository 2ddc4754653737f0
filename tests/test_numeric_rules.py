"""The numeric helpers the suite and the lab report with, held to one rule (minispec.checks):
what is not a distribution, a count or a matching shape is one MinispecError line, never a
broadcast, never a nan clamped into the best possible answer; the statistics agree with scipy's,
an oracle written apart from ours."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec.errors import MinispecError
from minispec.lab import pacing
from minispec.lab.distortion.meter import DistortionMeter, kl_from_target, total_variation
from minispec.testing.conform import Budget
from minispec.testing.conform.stats import chi_square, tilt
from minispec.testing.distribution import chi_square_p_value

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is the independent oracle of the statistics (pip install -e .[test])")


def probs_of(weights: list[float]) -> torch.Tensor:
    w = torch.tensor(weights, dtype=torch.float64)
    return w / w.sum()


WEIGHTS = st.lists(st.floats(0.05, 10.0), min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(weights=WEIGHTS, n=st.integers(50, 5000), seed=st.integers(0, 2**31))
def test_chi_square_equals_scipys_where_no_cell_is_pooled(weights, n, seed):
    probs = probs_of(weights)
    counts = torch.bincount(torch.multinomial(probs, n, replacement=True, generator=torch.Generator().manual_seed(seed)),
                            minlength=len(weights))
    fit = chi_square(counts, probs)
    expected = probs * n
    if bool((expected < 5).any()):  # ours pools small cells (scipy does not): compare where nothing is pooled
        return
    want = scipy_stats.chisquare(counts.double().numpy(), expected.numpy())
    assert fit.dof == len(weights) - 1
    assert math.isclose(fit.statistic, float(want.statistic), rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(fit.p_value, float(want.pvalue), rel_tol=1e-7, abs_tol=1e-12)
    as_dict = chi_square_p_value({(i,): int(c) for i, c in enumerate(counts)}, {(i,): float(p) for i, p in enumerate(probs)}, n)
    assert math.isclose(as_dict, float(want.pvalue), rel_tol=1e-7, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(a=WEIGHTS, b=WEIGHTS)
def test_total_variation_and_kl_equal_scipys(a, b):
    size = min(len(a), len(b))
    p, pi = probs_of(a[:size]), probs_of(b[:size])
    assert math.isclose(total_variation(pi, p), 0.5 * float((pi - p).abs().sum()), rel_tol=1e-12)
    assert math.isclose(kl_from_target(p, pi), float(scipy_stats.entropy(p.numpy(), pi.numpy())), rel_tol=1e-9,
                        abs_tol=1e-12)


BAD_PROBS = [torch.tensor([0.5, 0.6]), torch.tensor([-0.1, 1.1]), torch.tensor([math.nan, 1.0]),
             torch.tensor([math.inf, 0.0]), torch.tensor(1.0), [0.5, 0.5], torch.tensor([True, False])]


@pytest.mark.parametrize("bad", BAD_PROBS, ids=lambda b: repr(b)[:30])
def test_what_is_not_a_distribution_is_one_line_everywhere(bad):
    good = torch.tensor([0.5, 0.5], dtype=torch.float64)
    for call in (lambda: chi_square(torch.tensor([3, 4]), bad), lambda: tilt(bad, 0.1),
                 lambda: total_variation(bad, good), lambda: total_variation(good, bad),
                 lambda: kl_from_target(bad, good), lambda: kl_from_target(good, bad)):
        with pytest.raises(MinispecError) as err:
            call()
        assert "\n" not in str(err.value)


def test_a_nan_is_never_clamped_into_a_perfect_score():
    with pytest.raises(MinispecError):
        kl_from_target(torch.tensor([0.5, 0.5]), torch.tensor([math.nan, 0.5]))


@pytest.mark.parametrize("counts, probs", [
    (torch.tensor([1, 2, 3]), torch.tensor([0.5, 0.5])),  # would broadcast or misalign
    (torch.tensor([[1, 2]]), torch.tensor([0.5, 0.5])),
    (torch.tensor([-1, 3]), torch.tensor([0.5, 0.5])),
    (torch.tensor([1.5, 3.0]), torch.tensor([0.5, 0.5])),
    (torch.tensor([0, 0]), torch.tensor([0.5, 0.5])),
])
def test_chi_square_refuses_counts_it_cannot_test(counts, probs):
    with pytest.raises(MinispecError):
        chi_square(counts, probs)


def test_shapes_are_never_broadcast():
    with pytest.raises(MinispecError, match="expected the same shape"):
        total_variation(torch.tensor([[0.5, 0.5], [0.5, 0.5]]), torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize("kwargs", [dict(delta=0), dict(delta=0.7), dict(delta=math.nan), dict(start=0),
                                    dict(start=100, limit=50), dict(seed=-1), dict(seed=2**64), dict(delta="0.1")])
def test_the_budget_refuses_what_it_cannot_run(kwargs):
    with pytest.raises(MinispecError, match="Budget"):
        Budget(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(draws=0), dict(draws=10**6), dict(draws=2.5), dict(seed=-1)])
def test_the_meter_refuses_what_it_cannot_run(kwargs):
    from minispec.acceptance import get

    with pytest.raises(MinispecError, match="DistortionMeter"):
        DistortionMeter(get("sampling"), **kwargs)
    with pytest.raises(MinispecError, match="DistortionMeter"):
        DistortionMeter("sampling")


@pytest.mark.parametrize("arrivals", [[(1.0, 2), (0.5, 1)], [(0.0, -1)], [(math.nan, 1)], [(0.0, 1.5)], [(0.0,)]])
def test_pacing_refuses_arrivals_out_of_order_or_negative(arrivals):
    with pytest.raises(MinispecError, match="arrivals"):
        pacing.schedule(arrivals, 2, 0.0)


def test_an_exception_of_deliver_on_the_pacing_thread_is_never_lost():
    def deliver(tokens):
        raise ValueError("the client went away")

    stream = pacing.PacedStream(deliver, 1, 0.0)
    stream([1, 2], 1, 1)
    with pytest.raises(MinispecError, match="deliver raised ValueError: the client went away"):
        stream.close()
    with pytest.raises(MinispecError):
        pacing.PacedStream("not a function", 1, 0.0)
