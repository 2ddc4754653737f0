"""minispec.testing.conform: a conformance suite for any engine's acceptance step.

    from minispec.testing.conform import Engine, conform, minispec_engine, transformers_engine
    for verdict in conform(transformers_engine()):
        print(verdict.invariant, verdict.status, verdict.evidence)

    python -m minispec.testing.conform transformers            the same, as a table

    def test_my_engine():                                     in your own pytest suite
        assert_conforms(Engine("mine", my_step))

contract.py is the door (StepInput -> StepOutput, and what an engine claims), engines.py the
adapters (the public engines' in vllm_engine.py, lmdeploy_engine.py, litgpt_engine.py), invariants.py the checks (grammar.py the toy grammar of the constrained one), stats.py the chi-square with its planted-bias control,
planted.py the bug classes planted into copies of transformers' sampler.
"""

from minispec.testing.conform.contract import Engine, StepInput, StepOutput, lossless, overlap, step_input
from minispec.testing.conform.engines import minispec_engine, transformers_engine
from minispec.testing.conform.invariants import INVARIANTS, Budget, Verdict, assert_conforms, conform

__all__ = ["Engine", "StepInput", "StepOutput", "lossless", "overlap", "step_input", "minispec_engine",
           "transformers_engine", "INVARIANTS", "Budget", "Verdict", "assert_conforms", "conform"]
