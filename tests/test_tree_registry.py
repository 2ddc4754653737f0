"""Tree walks are looked up in a registry that a policy from outside the package can join.

A policy written and registered here (as a user would, in their own module) runs on trees once it
registers its walk: through generate_tree, the front door and the CLI's policy name; its walk is
what decides; and a policy without a walk is one line that says how to give it one.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from minispec.acceptance import AcceptancePolicy, Decision, ExactMatch, SpeculativeSampling, register
from minispec.trees.walks import TreeDecision, TreeInput, register_walk, sampling_walk, walk_for
from minispec.decode import generate
from minispec.errors import MinispecError
from minispec.testing import loop_setups, random_model, tiny_config
from minispec.trees.speculative import generate_tree


@register("outside-sampling")
class OutsideSampling(AcceptancePolicy):
    """Speculative sampling, written outside the package (its chain rule is the built-in one's)."""

    lossless = True

    def decide(self, inp) -> Decision:
        return SpeculativeSampling().decide(inp)


WALKED: list[int] = []  # how many nodes each call of the outside walk saw


@register_walk(OutsideSampling)
def outside_walk(policy: OutsideSampling, inp: TreeInput) -> TreeDecision:
    WALKED.append(inp.tree.num_nodes)
    return TreeDecision(*sampling_walk(inp.tree, inp.p_target, inp.generator))


@register("outside-no-walk")
class NoWalk(AcceptancePolicy):
    def decide(self, inp) -> Decision:
        return ExactMatch().decide(inp)


@given(setup=loop_setups(), seed=st.integers(0, 2**32), n_new=st.integers(1, 12),
       temperature=st.sampled_from([0.0, 1.0]))
def test_a_policy_registered_outside_runs_on_trees_as_its_walk_decides(setup, seed, n_new, temperature):
    cfg, model_seed, prompt = setup
    target, draft = random_model(cfg, model_seed, scale=3.0), random_model(cfg, model_seed + 1, scale=3.0)
    WALKED.clear()
    outside = generate_tree(target, prompt, max_new_tokens=n_new, draft=draft, tree=6, gamma=3,
                            policy="outside-sampling", temperature=temperature, seed=seed, eos_token_ids=[])
    built_in = generate_tree(target, prompt, max_new_tokens=n_new, draft=draft, tree=6, gamma=3,
                             policy="sampling", temperature=temperature, seed=seed, eos_token_ids=[])
    assert outside.tokens == built_in.tokens  # the same walk, draw for draw
    assert outside.stats["policy"] == "outside-sampling"
    assert len(WALKED) == outside.stats["verify_steps"]  # the registered walk decided every step
    front = generate(target, prompt, max_new_tokens=n_new, draft=draft, tree=6, gamma=3, policy=OutsideSampling(),
                     temperature=temperature, seed=seed, eos_token_ids=[])
    assert front.tokens == outside.tokens


def test_a_policy_without_a_walk_is_one_line_naming_register_walk():
    with pytest.raises(MinispecError, match="'outside-no-walk' has no tree form.*register_walk"):
        walk_for(NoWalk())
    target = random_model(tiny_config(), 0)
    with pytest.raises(MinispecError, match="no tree form"):
        generate_tree(target, [1, 2, 3], max_new_tokens=4, draft="ngram", tree=4, policy="outside-no-walk")


def test_a_class_has_one_walk_and_a_subclass_does_not_inherit_it():
    with pytest.raises(ValueError, match="already has a tree walk"):
        register_walk(OutsideSampling)(lambda policy, inp: None)

    class Sub(OutsideSampling):
        pass

    Sub.name = "outside-sub"
    with pytest.raises(MinispecError, match="no tree form"):
        walk_for(Sub())


def test_the_cli_runs_a_registered_policy_on_a_tree(real_ckpt, capsys):
    """--policy NAME with --tree: any policy registered (with its walk) before main runs."""
    import json

    from minispec.generate import main

    WALKED.clear()
    code = main(["--ckpt", str(real_ckpt), "--prompt", "Count: 1, 2, 3, 4, 1, 2, 3,", "--max-new-tokens", "6",
                 "--draft", "ngram", "--tree", "4", "--gamma", "2", "--policy", "outside-sampling", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["stats"]["policy"] == "outside-sampling" and out["stats"]["tree"]
    assert len(WALKED) == out["stats"]["verify_steps"] > 0
