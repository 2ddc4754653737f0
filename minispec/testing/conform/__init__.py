"""minispec.testing.conform: a conformance suite for any engine's acceptance step.

    from minispec.testing.conform import Engine, conform, minispec_engine, transformers_engine
    for verdict in conform(transformers_engine()):
        print(verdict.invariant, verdict.status, verdict.evidence)

    python -m minispec.testing.conform transformers            the same, as a table

contract.py is the door (StepInput -> StepOutput, and what an engine claims), engines.py the
adapters, invariants.py the checks, stats.py the chi-square with its planted-bias control,
planted.py the bug classes planted into copies of transformers' sampler.
"""

from minispec.testing.conform.contract import Engine, StepInput, StepOutput, lossless, overlap, step_input
from minispec.testing.conform.engines import minispec_engine, transformers_engine
from minispec.testing.conform.invariants import INVARIANTS, Budget, Verdict, conform

__all__ = ["Engine", "StepInput", "StepOutput", "lossless", "overlap", "step_input", "minispec_engine",
           "transformers_engine", "INVARIANTS", "Budget", "Verdict", "conform"]
