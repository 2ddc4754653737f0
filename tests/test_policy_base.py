"""The acceptance-policy interface (minispec/acceptance/base.py): the input check, the prefix
rule, the registry, and one-line errors for bad options."""

import pytest
import torch

import minispec.acceptance as acceptance
from minispec.acceptance import (AcceptancePolicy, Decision, ExactMatch, PolicyInputError, TypicalAcceptance,
                                 VerifyInput, check_input, first_rejection, register)
from minispec.errors import MinispecError
from minispec.testing import decided, verify_input

F64 = torch.float64


@register("test-accept-nothing")
class AcceptNothing(AcceptancePolicy):
    """A user policy, registered from outside the package: always rejects, emits token 0."""

    def decide(self, inp: VerifyInput) -> Decision:
        return Decision(0, 0)


class AcceptTooMuch(AcceptancePolicy):
    def decide(self, inp: VerifyInput) -> Decision:
        return Decision(inp.gamma + 1, 0)


def _good_input() -> VerifyInput:
    return verify_input([1, 2], [[0, 5, 0, 0], [0, 0, 5, 0], [5, 0, 0, 0]])


@pytest.mark.parametrize("field, bad, expected_name", [
    ("draft_tokens", torch.tensor([[1, 2]]), "draft_tokens"),  # [1, gamma], not [gamma]
    ("draft_tokens", torch.tensor([1, 2], dtype=torch.int32), "draft_tokens"),
    ("draft_tokens", torch.tensor([1, 4]), "draft_tokens"),  # id 4 with V = 4
    ("draft_tokens", torch.tensor([-1, 2]), "draft_tokens"),
    ("target_logits", torch.zeros(2, 4, dtype=F64), "target_logits"),  # gamma rows, not gamma+1
    ("p_target", torch.zeros(3, 5, dtype=F64), "p_target"),
    ("q_draft", torch.zeros(3, 4, dtype=F64), "q_draft"),
    ("draft_logits", torch.zeros(2, 3, dtype=F64), "draft_logits"),
    ("hidden", torch.zeros(2, 5, dtype=F64), "hidden"),  # gamma rows, not gamma+1
])
def test_check_input_rejects_wrong_shapes_and_ids(field, bad, expected_name):
    inp = _good_input()
    check_input(inp)  # the unmodified input passes
    setattr(inp, field, bad)
    with pytest.raises(PolicyInputError, match=expected_name):
        check_input(inp)
    with pytest.raises(PolicyInputError):  # and a policy call checks before deciding
        ExactMatch()(inp)


def test_get_unknown_name_lists_the_known_names():
    with pytest.raises(MinispecError) as err:
        acceptance.get("greedy-ish")
    for name in ("exact", "sampling", "block", "typical", "dropmatch", "dropmatch-lazy"):
        assert name in str(err.value)
    assert "\n" not in str(err.value)


def test_get_builds_by_name_with_options():
    policy = acceptance.get("typical", eps=0.2, delta=0.5)
    assert isinstance(policy, TypicalAcceptance) and (policy.eps, policy.delta) == (0.2, 0.5)
    assert acceptance.get(policy) is policy
    assert set(acceptance.available()) >= {"exact", "sampling", "typical", "dropmatch", "dropmatch-lazy"}
    with pytest.raises(MinispecError, match="options"):
        acceptance.get(policy, eps=0.1)  # options go to the constructor, not with an object


def test_register_a_user_policy():
    policy = acceptance.get("test-accept-nothing")
    assert isinstance(policy, AcceptNothing) and policy.name == "test-accept-nothing"
    assert decided(policy(_good_input())) == (0, 0)
    with pytest.raises(ValueError, match="already registered"):
        register("exact")(AcceptNothing)


def test_call_rejects_a_num_accepted_out_of_range():
    with pytest.raises(PolicyInputError, match="num_accepted"):
        AcceptTooMuch()(_good_input())


def test_first_rejection_is_the_prefix_rule():
    assert first_rejection(torch.tensor([True, True, False, True])) == 2  # the last True is discarded
    assert first_rejection(torch.tensor([True, True])) == 2
    assert first_rejection(torch.tensor([], dtype=torch.bool)) == 0


@pytest.mark.parametrize("build, name", [
    (lambda: TypicalAcceptance(eps=0.0), "eps"),
    (lambda: TypicalAcceptance(eps=1.5), "eps"),
    (lambda: TypicalAcceptance(delta=0.0), "delta"),
])
def test_bad_policy_options_are_one_line_errors_naming_the_parameter(build, name):
    with pytest.raises(MinispecError) as err:
        build()
    assert name in str(err.value) and "\n" not in str(err.value)



class HeadRowsPolicy(ExactMatch):
    """A user policy using the interface's two extras: it scores rows of its own with `inp.head` (each
    verify row doubled) and refuses, in `reset`, a run whose steps may draft more than `max_gamma`."""

    name = "test-head-rows"
    seen: list = []  # (head(hidden), target_logits, head(2 * hidden)) per decision

    def __init__(self, max_gamma: int = 64):
        self.max_gamma = max_gamma
        HeadRowsPolicy.seen = []

    def reset(self, seed=None, gamma=None):
        if gamma is not None and gamma > self.max_gamma:
            raise MinispecError(f"test-head-rows max_gamma={self.max_gamma}: a run of gamma {gamma}")

    def decide(self, inp):
        self.seen.append((inp.head(inp.hidden), inp.target_logits, inp.head(2 * inp.hidden)))
        return super().decide(inp)


@pytest.mark.parametrize("loop", ["chain", "batch"])
def test_a_user_policy_scores_rows_of_its_own_with_the_targets_head(loop):
    """inp.head is the target's LM head and inp.hidden its input: head(hidden) is the verify's own
    logits, and the head takes any rows (here 2 * hidden, checked against the weight directly)."""
    from minispec.batch.speculative import generate_batch
    from minispec.chain.speculative import generate_chain
    from minispec.testing import random_model, tiny_config

    target, draft = random_model(tiny_config(), 0, scale=3.0), random_model(tiny_config(), 1)
    policy = HeadRowsPolicy()
    if loop == "chain":
        tokens = generate_chain(target, [1, 2, 3], max_new_tokens=12, draft=draft, policy=policy, gamma=3).tokens
        plain = generate_chain(target, [1, 2, 3], max_new_tokens=12).tokens
    else:
        tokens = generate_batch(target, [[1, 2, 3]], max_new_tokens=12, draft=draft, policy=policy, gamma=3)[0].tokens
        plain = generate_batch(target, [[1, 2, 3]], max_new_tokens=12)[0].tokens
    assert tokens == plain
    assert HeadRowsPolicy.seen
    for clean, target_logits, doubled in HeadRowsPolicy.seen:
        torch.testing.assert_close(clean, target_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(doubled, 2 * clean, rtol=1e-4, atol=1e-4)  # the head is linear, float32 rounding


@pytest.mark.parametrize("loop", ["chain", "tree", "batch"])
def test_a_user_policy_refuses_a_run_before_the_first_step(loop):
    from minispec.batch.speculative import generate_batch
    from minispec.chain.speculative import generate_chain
    from minispec.testing import random_model, tiny_config
    from minispec.trees.speculative import generate_tree

    from minispec.trees.walks import register_walk, walk_for

    register_walk(HeadRowsPolicy)(walk_for(ExactMatch()))  # its tree form is exact match's
    target, draft = random_model(tiny_config(), 0), random_model(tiny_config(), 1)
    policy = HeadRowsPolicy(max_gamma=3)
    run = {"chain": lambda: generate_chain(target, [1, 2], max_new_tokens=8, draft=draft, policy=policy, gamma=5),
           "tree": lambda: generate_tree(target, [1, 2], max_new_tokens=8, draft=draft, policy=policy, tree=6, gamma=5),
           "batch": lambda: generate_batch(target, [[1, 2]], max_new_tokens=8, draft=draft, policy=policy, gamma=5)}
    with pytest.raises(MinispecError, match=r"^test-head-rows max_gamma=3: a run of gamma 5$"):
        run[loop]()
    assert HeadRowsPolicy.seen == []


def test_a_decision_of_one_element_tensors_is_taken_as_ints_and_anything_else_is_refused():
    """A user policy returning torch.tensor(eos) as its next token: the loop must see the id (a 0-d
    tensor never equals an int eos in a list); a float, a bool or a vector is refused by name."""
    import numpy
    import torch

    from minispec.acceptance import AcceptancePolicy, Decision, PolicyInputError
    from minispec.chain.speculative import generate_chain
    from minispec.testing import random_model, tiny_config

    class Returns(AcceptancePolicy):
        def __init__(self, num_accepted, next_token):
            self.num_accepted, self.next_token = num_accepted, next_token

        def decide(self, inp):
            return Decision(self.num_accepted, self.next_token)

    model = random_model(tiny_config(vocab_size=12, num_layers=1), 0)
    out = generate_chain(model, [1, 2], max_new_tokens=8, draft="ngram:1", gamma=2,
                         policy=Returns(torch.tensor(0), torch.tensor(5)), eos_token_ids=[5])
    # the prefill's token, then the policy's eos at the first verify step, and the run stops there
    assert len(out.tokens) == 2 and out.tokens[-1] == 5 and out.stats["finish_reason"] == "eos"
    out = generate_chain(model, [1, 2], max_new_tokens=8, draft="ngram:1", gamma=2,
                         policy=Returns(numpy.int64(0), numpy.int64(5)), eos_token_ids=[5])
    assert len(out.tokens) == 2 and out.tokens[-1] == 5
    for num_accepted, next_token, field in [(0, 5.0, "next_token"), (0, True, "next_token"), (0.0, 5, "num_accepted"),
                                            (0, torch.tensor([5, 6]), "next_token"), (0, 99, "next_token")]:
        with pytest.raises(PolicyInputError, match=field):
            generate_chain(model, [1, 2], max_new_tokens=4, draft="ngram:1", gamma=2,
                           policy=Returns(num_accepted, next_token), eos_token_ids=[])


def test_numpy_scalars_are_the_numbers_they_print():
    """np.float32(0.3) is the 0.3 the user typed, not 0.30000001192092896; np.int64(3) is 3; a bool or
    text is still refused."""
    import numpy

    from minispec.acceptance import get
    from minispec.errors import MinispecError

    policy = get("dropmatch", p=numpy.float32(0.3), paths=numpy.int64(3))
    assert (policy.p, policy.paths) == (0.3, 3) and type(policy.p) is float and type(policy.paths) is int
    assert get("lenience", beta=numpy.float64(0.25)).beta == 0.25
    for bad in (dict(p=numpy.bool_(True)), dict(paths=numpy.float32(2.0)), dict(p="0.3")):
        with pytest.raises(MinispecError, match="dropmatch"):
            get("dropmatch", **bad)


@pytest.mark.parametrize("returned", [(1, 0), None, [1, 0], {"num_accepted": 1, "next_token": 0}, 1])
def test_a_decide_that_returns_no_decision_is_one_input_error_naming_the_policy(returned):
    class Sloppy(AcceptancePolicy):
        name = "sloppy"

        def decide(self, inp):
            return returned

    with pytest.raises(PolicyInputError, match=rf"^sloppy: decide returned {type(returned).__name__}; expected a "
                                                r"Decision$"):
        Sloppy()(verify_input([1, 2], [[0, 5, 0, 0], [0, 0, 5, 0], [5, 0, 0, 0]]))
