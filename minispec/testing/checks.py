"""Reusable invariant checks: run minispec's properties against YOUR policy or cache.

    from minispec.testing import check_policy, check_cache

    check_policy(MyPolicy, lossless=True)            # a policy class or a zero-argument factory
    check_policy(MyLossyPolicy, neutral={"strength": 0.0}, base="exact")
    check_policy(MyLenientSampling, neutral={"beta": 1.0}, base="sampling", neutral_temperatures=(0.0, 1.0))
    check_cache(MyCache)                             # a class with KVCache's constructor
    check_ragged_cache(MyBatchCache)                 # a class with RaggedKVCache's constructor

Each check runs hypothesis properties on random tiny Llama/Qwen3 models (float64) under the
active hypothesis profile (MINISPEC_PROFILE=dev|ci|thorough after `load_profile()`, or whatever
profile you loaded; with none loaded, minispec's dev size), never with a deadline: the checks
time nothing. Each check prints one progress line to stderr as it ends (progress=False: none).
A failure raises CheckFailed whose message names the check, what was expected and what
happened, followed by hypothesis' falsifying example.

Policy checks (a policy is an AcceptancePolicy subclass; see minispec/acceptance/base.py):
  validation          malformed inputs (shapes, vocab bounds) are rejected, not half-used
  decision_range      0 <= num_accepted <= gamma and 0 <= next_token < V on random inputs, the
                      inputs untouched (a policy that edits p_target or q_draft in place fails)
  determinism         the same inputs and generator seed give the same decision
  greedy_equals_plain (lossless) at temperature 0, speculative output == plain greedy output
  one_step_lossless   (lossless) the first emitted token is distributed as p_target: exact
                      enumeration over the draft token x with weight q(x), Monte Carlo over the
                      policy's own coins, chi-square against p_target
  multi_step_lossless (lossless) 3-token outputs of a tiny model through the real loop,
                      chi-square against the exact sequence distribution, at T=0.5 and T=2
                      (away from 1, so a temperature applied to p but not to q shows)
  neutral_is_base     (if neutral= is given) at each of neutral_temperatures (default: 0 only)
                      the policy built with the neutral kwargs emits exactly the base policy's
                      tokens and accepted lengths, seed for seed
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from typing import Callable

import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import run_state_machine_as_test

from minispec.errors import MinispecError
from minispec.acceptance.base import AcceptancePolicy, PolicyInputError, VerifyInput, get
from minispec.model.kv_cache import KVCache
from minispec.model.sampling import SamplingParams, logits_to_probs
from minispec.chain.speculative import generate_chain as generate
from minispec.testing.cache_machine import make_cache_machine, make_ragged_cache_machine
from minispec.testing.distribution import chi_square_p_value, sequence_distribution
from minispec.testing.strategies import model_configs, random_model, seeds, tiny_config

P_VALUE_FLOOR = 1e-4  # a correct lossless policy fails a chi-square check with probability 1e-4


class CheckFailed(AssertionError):
    """An invariant does not hold for the code under test; the message says which and why."""


def _run(label: str, check: Callable[[], None], progress: bool = True) -> None:
    started = time.perf_counter()
    try:
        check()
    except Exception as err:  # hypothesis re-raises the property's own error after shrinking
        detail = str(err).strip() or type(err).__name__
        if progress:
            print(f"minispec.testing: {label} FAILED ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
        raise CheckFailed(f"{label}: {detail}") from err
    if progress:
        print(f"minispec.testing: {label} ok ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)


def check_settings() -> settings:
    """The hypothesis settings the checks run under: the active profile, with no deadline and no
    too-slow health check (a tiny model's first call is slow, and the checks time nothing); if no
    profile was loaded (hypothesis' own default of 100 examples), the size of minispec's dev profile."""
    from minispec.testing.profiles import PROFILES

    changes = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    if getattr(settings, "_current_profile", None) == "default":
        changes["max_examples"] = PROFILES["dev"]["max_examples"]
    return settings(settings(), **changes)


# --------------------------------------------------------------------------------- caches


def require_factory(check: str, factory, expected: str) -> None:
    """MinispecError (one line, naming the check and what it got) unless `factory` can be called."""
    if not callable(factory):
        raise MinispecError(f"{check}({factory!r}): not callable ({type(factory).__name__}); expected {expected}")


CACHE_METHODS = ("check_room", "positions", "mask", "write", "advance", "truncate")  # what the model calls


def require_cache(check: str, factory, batch_size: int) -> None:
    """Build one small cache with `factory` (as the checks will) and refuse, in one line naming the
    check, a factory that raises or returns something the model cannot use (None, a list, ...)."""
    name = getattr(factory, "__name__", repr(factory))
    try:
        cache = factory(2, batch_size, 2, 8, 4, dtype=torch.float64, device="cpu")
    except Exception as err:  # noqa: BLE001 - user code
        raise MinispecError(f"{check}({name}): cache_factory(num_layers, batch_size, num_kv_heads, max_seq_len, "
                            f"head_dim, dtype=, device=) raised {type(err).__name__}: {' '.join(str(err).split())}"
                            ) from None
    missing = [m for m in CACHE_METHODS if not hasattr(cache, m)]
    if missing:
        raise MinispecError(f"{check}({name}): cache_factory(...) returned {type(cache).__name__}, which has no "
                            f"{', '.join(missing)}; expected a cache (a KVCache or one with its methods)")


def check_cache(cache_factory=KVCache, *, max_len: int = 40, progress: bool = True) -> None:
    """Run the append / verify-chunk / truncate state machine against `cache_factory`."""
    require_factory("check_cache", cache_factory, "a cache class (KVCache's constructor) or a function that makes one")
    require_cache("check_cache", cache_factory, 1)
    machine = make_cache_machine(cache_factory, max_len)
    name = getattr(cache_factory, "__name__", repr(cache_factory))
    _run(f"check_cache({name}): cache validity under appends and rollbacks",
         lambda: run_state_machine_as_test(machine, settings=settings(check_settings(), stateful_step_count=20)),
         progress)


def check_ragged_cache(cache_factory=None, *, batch_size: int = 3, max_len: int = 40, progress: bool = True) -> None:
    """Run the ragged append / per-row rollback / rows-leave state machine against `cache_factory`
    (default minispec.batch.ragged_cache.RaggedKVCache): every row must behave as a cache of its own."""
    if cache_factory is not None:
        require_factory("check_ragged_cache", cache_factory,
                        "a batch cache class (RaggedKVCache's constructor) or a function that makes one")
        require_cache("check_ragged_cache", cache_factory, batch_size)
    machine = make_ragged_cache_machine(cache_factory, batch_size, max_len)
    name = getattr(cache_factory, "__name__", "RaggedKVCache") if cache_factory is not None else "RaggedKVCache"
    _run(f"check_ragged_cache({name}): every row equals a single cache under ragged appends and rollbacks",
         lambda: run_state_machine_as_test(machine, settings=settings(check_settings(), stateful_step_count=20)),
         progress)


# ------------------------------------------------------------------------------- policies


@st.composite
def verify_inputs(draw, max_gamma: int = 5, max_vocab: int = 8, temperature: float | None = None,
                  filters: bool = True) -> VerifyInput:
    """Random but consistent policy inputs: drafts drawn from their own q_draft (float64).

    The slices are drawn, not only T in {0, 1} where softmax(target_logits) and p_target coincide:
    temperatures far from 1 (0.3, 2.0) and, at T > 0 with `filters`, top-k and top-p, so a rule
    that reads the raw logits where its definition reads the processed p_target is caught."""
    gamma = draw(st.integers(0, max_gamma))
    vocab = draw(st.integers(2, max_vocab))
    temp = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0, 2.0])) if temperature is None else temperature
    top_k = draw(st.one_of(st.none(), st.integers(1, vocab))) if filters and temp > 0 else None
    top_p = draw(st.sampled_from([None, 0.5, 0.9])) if filters and temp > 0 else None
    gen = torch.Generator().manual_seed(draw(seeds))
    params = SamplingParams(temp, top_k, top_p)
    target_logits = 2 * torch.randn(gamma + 1, vocab, generator=gen, dtype=torch.float64)  # [gamma+1, V]
    draft_logits = 2 * torch.randn(gamma, vocab, generator=gen, dtype=torch.float64)  # [gamma, V]
    q_draft = logits_to_probs(draft_logits, params)  # [gamma, V]
    draft_tokens = torch.multinomial(q_draft, 1, generator=gen).squeeze(-1) if gamma else torch.zeros(0, dtype=torch.long)
    return VerifyInput(draft_tokens=draft_tokens, q_draft=q_draft, target_logits=target_logits,
                       p_target=logits_to_probs(target_logits, params), params=params,
                       generator=torch.Generator().manual_seed(draw(seeds)), draft_logits=draft_logits)


def with_head(inp: VerifyInput, seed: int) -> VerifyInput:
    """`inp` as the loop builds it from a random linear LM head: target logits = head(hidden),
    plus `hidden` and `head` (for DropMatch)."""
    gen = torch.Generator().manual_seed(seed)
    vocab, rows = inp.target_logits.shape[1], inp.gamma + 1
    hidden = torch.randn(rows, 8, generator=gen, dtype=torch.float64)  # [gamma+1, d]
    weight = torch.randn(vocab, 8, generator=gen, dtype=torch.float64)  # [V, d]
    head = lambda h: h @ weight.T  # noqa: E731  [..., d] -> [..., V]
    target_logits = head(hidden)  # [gamma+1, V]: as the loop does
    return VerifyInput(inp.draft_tokens, inp.q_draft, target_logits, logits_to_probs(target_logits, inp.params),
                       inp.params, inp.generator, inp.draft_logits, hidden=hidden, head=head)


def check_neutral_arguments(policy_factory: Callable[..., AcceptancePolicy], neutral: dict | None, base: str,
                            neutral_temperatures: tuple) -> None:
    """check_policy's neutral=, base= and neutral_temperatures= as one-line usage errors, before any check runs:
    a mistake in them is the caller's, not a failure of the policy (CheckFailed), and base= or
    neutral_temperatures= without neutral= would be ignored."""
    if neutral is None:
        if base != "exact" or tuple(neutral_temperatures) != (0.0,):
            raise MinispecError(f"check_policy: base = {base!r}, neutral_temperatures = {neutral_temperatures!r}: "
                                "they set the neutral_is_base check, which runs only with neutral=; expected "
                                "neutral={...} with them (or neither)")
        return
    if not isinstance(neutral, dict):
        raise MinispecError(f"check_policy: neutral = {neutral!r}; expected a dict of the policy's options at which "
                            "it reduces to base, e.g. {'beta': 1.0}")
    try:
        get(base)
    except MinispecError:  # not get's own line: the registry grows with the policies a suite registers
        raise MinispecError(f"check_policy: base = {base!r}: not a registered acceptance policy; expected a name "
                            "that minispec.acceptance.available() lists, e.g. 'exact' or 'sampling'") from None
    if not isinstance(neutral_temperatures, (tuple, list)) or not neutral_temperatures:
        raise MinispecError(f"check_policy: neutral_temperatures = {neutral_temperatures!r}; expected a non-empty "
                            "tuple of temperatures, e.g. (0.0,) or (0.0, 1.0)")
    for temperature in neutral_temperatures:
        try:
            SamplingParams(temperature=temperature)
        except MinispecError as error:
            raise MinispecError(f"check_policy: neutral_temperatures: {error}") from None
    try:
        built = policy_factory(**neutral)
    except (MinispecError, TypeError) as error:
        raise MinispecError(f"check_policy: neutral = {neutral!r}: policy_factory(**neutral) failed: {error}") from None
    if not isinstance(built, AcceptancePolicy):
        raise MinispecError(f"check_policy: policy_factory(**neutral) returned {type(built).__name__}; expected an "
                            "AcceptancePolicy")


def check_info(info, gamma: int) -> None:
    """The info-counter rule every policy obeys (minispec.chain.stats counts what it reports): each
    Decision.info entry is a work count (a finite number >= 0) or per-position flags (a tensor, list
    or tuple of gamma entries, each 0 or 1), which the loop counts over the committed drafts only.
    A count of accepted positions reported as a number could not be cut where an eos ends the run,
    so it is refused here. Entries of other kinds (a note) are allowed and ignored by the stats."""
    assert isinstance(info, dict), f"Decision.info is {type(info).__name__}; expected a dict"
    for key, value in info.items():
        if isinstance(value, bool):
            continue  # a switch, not counted
        if isinstance(value, numbers.Number):
            assert math.isfinite(value) and value >= 0, f"info[{key!r}] = {value!r}; expected a count >= 0"
            assert not key.startswith(("accepted", "deferred", "judged")), (
                f"info[{key!r}] = {value!r} counts positions as a number; expected per-position flags [gamma] "
                "(the loop counts them over the committed drafts)")
        elif isinstance(value, (torch.Tensor, list, tuple)):
            flags = value.tolist() if isinstance(value, torch.Tensor) else list(value)
            assert len(flags) == gamma, f"info[{key!r}]: {len(flags)} per-position flags; expected gamma = {gamma}"
            assert all(f in (0, 1) for f in flags), f"info[{key!r}] = {flags}; expected flags of 0 or 1"


def check_policy(policy_factory: Callable[..., AcceptancePolicy], *, lossless: bool | None = None,
                 neutral: dict | None = None, base: str = "exact", neutral_temperatures: tuple = (0.0,),
                 statistical: bool = True, progress: bool = True) -> None:
    """Run every applicable policy invariant (see the module docstring) against `policy_factory`.

    lossless: whether the policy claims to preserve the target distribution (default: the
      class's own `lossless` attribute). neutral: kwargs at which a lossy policy should reduce to
      `base` (e.g. {"p": 0.0} for DropMatch), at each of `neutral_temperatures` (0: greedy; a policy
      whose neutral setting is its base at T > 0 too, draw for draw, lists those temperatures
      as well: {"beta": 1.0} for lenience at (0.0, 1.0)). statistical=False skips the two
      sampling-based losslessness checks (they take a few seconds each). progress: one line per
      check on stderr.
    """
    if not callable(policy_factory) or isinstance(policy_factory, AcceptancePolicy):
        raise MinispecError(f"check_policy({policy_factory!r}): expected a callable that returns a new policy, "
                            "e.g. check_policy(MyPolicy) or check_policy(lambda: acceptance.get('exact')), not a "
                            "name or an instance (each check needs fresh policies)")
    try:
        policy = policy_factory()
    except TypeError as err:  # a constructor that needs arguments: the checks build fresh policies with none
        name = getattr(policy_factory, "__name__", repr(policy_factory))
        raise MinispecError(f"check_policy({name}): calling it with no arguments failed ({err}); expected a "
                            f"zero-argument factory, e.g. check_policy(lambda: {name}(...your options...))") from None
    if not isinstance(policy, AcceptancePolicy):
        raise MinispecError(f"check_policy: policy_factory() returned {type(policy).__name__}; expected an "
                            "AcceptancePolicy (a subclass of minispec.acceptance.AcceptancePolicy)")
    check_neutral_arguments(policy_factory, neutral, base, neutral_temperatures)
    quick = check_settings()
    name = type(policy).__name__
    claims_lossless = policy.lossless if lossless is None else lossless

    def fresh_input(inp: VerifyInput, seed: int) -> tuple[AcceptancePolicy, VerifyInput]:
        """A new, reset policy and the input with target logits from a random head (`with_head`)."""
        p = policy_factory()
        p.reset()
        return p, with_head(inp, seed)

    @quick
    @given(inp=verify_inputs(), seed=seeds)
    def decision_range(inp, seed):
        p, inp = fresh_input(inp, seed)
        before = {name: value.clone() for name, value in vars(inp).items() if isinstance(value, torch.Tensor)}
        d = p(inp)
        for name, value in before.items():  # the loop reuses p_target and the caches' rows after the decision
            assert torch.equal(getattr(inp, name), value), f"{name}: changed in place by the policy; expected it untouched"
        vocab = inp.target_logits.shape[1]
        assert 0 <= d.num_accepted <= inp.gamma, f"num_accepted = {d.num_accepted} with gamma = {inp.gamma}"
        assert 0 <= d.next_token < vocab, f"next_token = {d.next_token} outside [0, {vocab})"
        check_info(d.info, inp.gamma)

    @quick
    @given(inp=verify_inputs(), seed=seeds, gen_seed=seeds)
    def determinism(inp, seed, gen_seed):
        decisions = []
        for _ in range(2):
            p, run_inp = fresh_input(inp, seed)
            run_inp.generator = torch.Generator().manual_seed(gen_seed)
            d = p(run_inp)
            decisions.append((d.num_accepted, d.next_token))
        assert decisions[0] == decisions[1], f"same seed, different decisions: {decisions}"

    def validation():
        inp = _fixed_input()
        bad_inputs = {
            "q_draft with the wrong vocabulary": dict(q_draft=inp.q_draft[:, :-1]),
            "p_target with a missing bonus row": dict(p_target=inp.p_target[:-1]),
            "a draft token outside the vocabulary": dict(draft_tokens=torch.tensor([0, 1, 99])),
        }
        for what, change in bad_inputs.items():
            p, good = fresh_input(inp, 0)
            broken = VerifyInput(**{**good.__dict__, **change})
            try:
                p(broken)
            except (PolicyInputError, ValueError):
                continue  # rejected with a clear input error, as it should be
            except Exception as err:
                raise CheckFailed(f"{name} crashed on {what} with {type(err).__name__}({err}); expected a "
                                  f"PolicyInputError from the input check (AcceptancePolicy.__call__ runs it)") from None
            raise CheckFailed(f"{name} accepted {what} without raising")

    @quick
    @given(cfg=model_configs(vocab_size=12), seed=seeds, gamma=st.integers(1, 5),
           prompt=st.lists(st.integers(0, 5), min_size=1, max_size=10))
    def greedy_equals_plain(cfg, seed, gamma, prompt):
        target = random_model(cfg, seed, scale=3.0)
        for draft in (random_model(cfg, seed + 1, scale=3.0), "ngram:2"):
            plain = generate(target, prompt, max_new_tokens=10, eos_token_ids=[])
            spec = generate(target, prompt, max_new_tokens=10, draft=draft, policy=policy_factory(), gamma=gamma,
                            eos_token_ids=[])
            assert spec.tokens == plain.tokens, f"speculative {spec.tokens} != plain greedy {plain.tokens}"

    def one_step_lossless():
        vocab, coins, params = 4, 2000, SamplingParams(1.0)
        for case in range(2):
            gen = torch.Generator().manual_seed(1000 + case)
            draft_logits = 1.5 * torch.randn(1, vocab, generator=gen, dtype=torch.float64)  # [1, V]
            q_draft = logits_to_probs(draft_logits, params)  # [1, V]

            def verify_input(x: int, coin: int) -> tuple[AcceptancePolicy, VerifyInput]:
                placeholder = torch.zeros(2, vocab, dtype=torch.float64)  # replaced by the head's logits
                inp = VerifyInput(torch.tensor([x]), q_draft, placeholder, placeholder, params,
                                  torch.Generator().manual_seed(coin), draft_logits)
                return fresh_input(inp, seed=case)  # same hidden state and head for every coin

            p_target = verify_input(0, 0)[1].p_target  # [2, V]: row 0 scores x, row 1 the bonus
            observed = torch.zeros(vocab, dtype=torch.float64)
            for x in range(vocab):  # exact over the draft token, weight q(x)
                counts = torch.zeros(vocab, dtype=torch.float64)
                inp = verify_input(x, 0)[1]
                for coin in range(coins):  # Monte Carlo over the policy's own coins: a fresh policy each
                    policy_ = policy_factory()
                    policy_.reset()
                    inp.generator = torch.Generator().manual_seed(coin)
                    d = policy_(inp)
                    counts[x if d.num_accepted >= 1 else d.next_token] += 1
                observed += float(q_draft[0, x]) * counts
            # observed is a q-weighted mix of multinomial counts: its variance is at most that
            # of one multinomial with `coins` draws, so the chi-square test is conservative.
            pv = chi_square_p_value({(i,): float(observed[i]) for i in range(vocab)},
                                    {(i,): float(p_target[0, i]) for i in range(vocab)}, coins)
            if pv < P_VALUE_FLOOR:
                raise CheckFailed(
                    f"{name}'s first emitted token is not distributed as p_target "
                    f"(case {case}: p_target={[round(v, 3) for v in p_target[0].tolist()]}, "
                    f"observed={[round(v / coins, 3) for v in observed.tolist()]}, chi-square p-value {pv:.2g})")

    def multi_step_lossless():
        cfg = tiny_config(vocab_size=4, num_layers=1)
        target, draft = random_model(cfg, 11, scale=2.0), random_model(cfg, 12, scale=2.0)
        prompt, n, runs = [0, 1, 2, 1], 3, 2000
        for temperature in (0.5, 2.0):
            probs = sequence_distribution(target, prompt, n, SamplingParams(temperature))
            counts: dict = {}
            for s in range(runs):
                out = generate(target, prompt, max_new_tokens=n, draft=draft, policy=policy_factory(), gamma=2,
                               temperature=temperature, seed=s, eos_token_ids=[])
                counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
            pv = chi_square_p_value(counts, probs, runs)
            if pv < P_VALUE_FLOOR:
                worst = max(probs, key=lambda k: abs(counts.get(k, 0) / runs - probs[k]))
                raise CheckFailed(
                    f"{name} changes the distribution of 3-token outputs at temperature "
                    f"{temperature} (chi-square p-value {pv:.2g}; e.g. {list(worst)}: expected {probs[worst]:.3f}, "
                    f"observed {counts.get(worst, 0) / runs:.3f})")

    @quick
    @given(cfg=model_configs(vocab_size=12), seed=seeds, gamma=st.integers(1, 5),
           prompt=st.lists(st.integers(0, 5), min_size=1, max_size=10))
    def neutral_is_base(cfg, seed, gamma, prompt):
        target = random_model(cfg, seed, scale=3.0)
        for temperature in neutral_temperatures:
            for draft in (random_model(cfg, seed + 1, scale=3.0), "ngram:2", target):
                run = dict(max_new_tokens=10, draft=draft, gamma=gamma, temperature=temperature, seed=seed,
                           eos_token_ids=[])
                want = generate(target, prompt, policy=base, **run)
                got = generate(target, prompt, policy=policy_factory(**neutral), **run)
                assert got.tokens == want.tokens, f"T = {temperature}: tokens {got.tokens} != {base}'s {want.tokens}"
                assert got.stats["accepted_length_histogram"] == want.stats["accepted_length_histogram"], \
                    f"T = {temperature}: accepted lengths {got.stats['accepted_length_histogram']} != {base}'s"

    _run(f"check_policy({name}): validation", validation, progress)
    _run(f"check_policy({name}): decision_range", decision_range, progress)
    _run(f"check_policy({name}): determinism", determinism, progress)
    if claims_lossless:
        _run(f"check_policy({name}): greedy_equals_plain", greedy_equals_plain, progress)
        if statistical:
            _run(f"check_policy({name}): one_step_lossless", one_step_lossless, progress)
            _run(f"check_policy({name}): multi_step_lossless", multi_step_lossless, progress)
    if neutral is not None:
        _run(f"check_policy({name}): neutral_is_base", neutral_is_base, progress)


def _fixed_input() -> VerifyInput:
    """A small valid input (gamma 3, V 6) for the validation check to break in different ways."""
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(1.0)
    target_logits = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    draft_logits = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    return VerifyInput(torch.tensor([0, 1, 2]), logits_to_probs(draft_logits, params), target_logits,
                       logits_to_probs(target_logits, params), params, torch.Generator().manual_seed(0), draft_logits)
