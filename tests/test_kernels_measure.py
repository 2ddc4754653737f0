"""minispec.kernels.measure: the timing, bandwidth and pass-cost probes the benchmarks share. What
is checked is what they return and what they leave behind, never how fast anything is."""

import pytest
import torch

from minispec.kernels import measure
from minispec.testing import random_model, tiny_config


def test_time_interleaved_runs_each_function_in_turn_and_reports_every_name():
    calls = []
    seconds = measure.time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=3,
                                       warmup=1)
    assert calls == ["a", "b"] * 4 and set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())


def test_bandwidth_reports_each_kernel_this_cpu_runs_and_the_fastest():
    result = measure.bandwidth(mib=4, reps=2)
    rates = {k: v for k, v in result.items() if k != "bandwidth_gbps"}
    assert "f_linear_float32_gbps" in rates and all(v > 0 for v in rates.values())
    assert result["bandwidth_gbps"] == max(rates.values())
    from minispec.kernels import fbgemm

    assert ({"fbgemm_fp16_gbps", "fbgemm_int8_gbps"} <= set(rates)) == fbgemm.available()  # where torch has them


def test_pass_costs_leave_the_cache_as_they_found_it():
    model = random_model(tiny_config(), 0)
    cache = model.new_cache(1, 32)
    with torch.inference_mode():
        model.forward_hidden(torch.tensor([[1, 2, 3, 4, 5]]), cache)
    before = [k[:, :, :5].clone() for k in cache.k]
    seconds = measure.pass_costs(model, cache, (1, 3, 6), rollback=lambda: cache.truncate(5), reps=2)
    assert sorted(seconds) == [1, 3, 6] and all(s > 0 for s in seconds.values())
    assert cache.length == 5 and all(torch.equal(k[:, :, :5], old) for k, old in zip(cache.k, before))


def test_fastest_kind_is_one_of_the_candidates_and_a_lone_candidate_wins():
    kinds = ("fast", "fp16")
    assert measure.fastest_kind(kinds, 64, 128, torch.float32, reps=2) in kinds
    assert measure.fastest_kind(("fp16",), 64, 128, torch.float32, reps=2) == "fp16"


def test_each_kernels_rate_counts_the_bytes_its_weights_hold(monkeypatch):
    """bandwidth(mib): every kernel streams weights sized to about `mib` MiB in its own format (float32,
    bfloat16, fbgemm's float16 and int8, nf4's 4.25 bits a weight with its bfloat16 maxima), so with
    each call taking 1 s (timed patched) each rate is those bytes / 1e9: mib MiB, less the rows lost
    to rounding (nf4's tiles of 32 rows: under 0.1% at 64 MiB)."""
    monkeypatch.setattr(measure, "timed", lambda fn, reps, warmup=1: 1.0)
    mib = 64
    rates = measure.bandwidth(mib=mib, reps=1)
    assert rates["bandwidth_gbps"] == max(v for k, v in rates.items() if k != "bandwidth_gbps")
    for name, gbps in rates.items():
        assert 0.999 * mib * 2**20 <= gbps * 1e9 <= mib * 2**20, (name, gbps * 1e9 / 2**20)


@pytest.mark.parametrize("order", [("fast", "fp16"), ("fp16", "fast")])
@pytest.mark.parametrize("slower", ["fast", "fp16"])
def test_fastest_kind_takes_the_kind_whose_product_took_least(monkeypatch, order, slower):
    """With each kind's product timed by hand (timed patched: 2 s for `slower`, 1 s for the other),
    fastest_kind answers the one that took least, whatever order the candidates come in."""
    from minispec.kernels import fbgemm

    if not fbgemm.available():
        pytest.skip("fbgemm's float16 kernel is not in this torch")
    kind_of_layer = {cls: kind for kind, cls in measure.LINEARS.items()}

    def timed(fn, reps, warmup=1):
        layer = fn.__defaults__[0]  # the candidate's layer, bound by fastest_kind's lambda
        return 2.0 if kind_of_layer[type(layer)] == slower else 1.0

    monkeypatch.setattr(measure, "timed", timed)
    measure.fastest_kind.cache_clear()
    try:
        assert measure.fastest_kind(order, 64, 128, torch.float32, reps=1) == ({"fast", "fp16"} - {slower}).pop()
    finally:
        measure.fastest_kind.cache_clear()
