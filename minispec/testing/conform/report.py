"""python -m minispec.testing.conform: the suite's verdicts on named engines, as markdown tables.

    python -m minispec.testing.conform transformers transformers:w=0.5 minispec:sampling
    python -m minispec.testing.conform vllm vllm:no-probs      vLLM's rejection sampler with and without draft
                                                               probabilities, where installed (docs/conformance.md)
    python -m minispec.testing.conform sglang sglang:block     SGLang's chain rejection sampler, token-level and
                                                               block verification, where installed
    python -m minispec.testing.conform lmdeploy litgpt medusa eagle
                                                               lmdeploy's portable rejection sampler, litgpt's whole
                                                               speculative step, Medusa's typical acceptance, EAGLE's
                                                               evaluate_posterior, where installed
    python -m minispec.testing.conform all                     transformers (plain, w = 0.5), sample-then-match, every minispec
                                                               policy, and each public engine installed (one line for each not)
    python -m minispec.testing.conform --planted               each planted bug class: caught, and by what
    python -m minispec.testing.conform --power                 the steps each planted class needs to be caught

Exit status: 0 when every engine keeps every invariant (and, with --planted, every planted bug is
caught by the invariant meant for it); 1 otherwise; 2 for a bad ENGINE or flag (one line).
    python -m minispec.testing.conform mypackage.mymodule:engine   your own Engine (or a function returning one)

Engines: `vllm`, `vllm:no-probs`, `sglang`, `sglang:block`, `lmdeploy`, `litgpt`, `medusa`, `eagle`, `transformers`, `transformers:w=W` (assistant_ensemble_weight W in (0, 1)),
`sample-then-match`, `minispec:NAME` or `minispec:NAME:key=value,...` (a registered policy and its options), or
`module:attribute` naming an Engine. --delta sets the bias of total variation each statistical
check must detect 99% of the time (smaller: more samples, more minutes); --only runs the
invariants named (e.g. --only constrained).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from minispec import acceptance
from minispec.cli import Parser, load_object, parse_options, ranged, run_main
from minispec.generate.policy_spec import policy_spec
from minispec.errors import MinispecError
from minispec.testing.conform.contract import Engine
from minispec.testing.conform.engines import (NEEDS_THE_HEAD, minispec_engine, sample_then_match_engine,
                                               transformers_engine)
from minispec.testing.conform.invariants import INVARIANTS, Budget, Verdict, conform
from minispec.testing.conform.planted import PLANTS, planted_engine
from minispec.testing.conform.power import power_table
from minispec.testing.conform.sglang_engine import sglang_engine
from minispec.testing.conform.eagle_engine import eagle_engine
from minispec.testing.conform.litgpt_engine import litgpt_engine
from minispec.testing.conform.lmdeploy_engine import lmdeploy_engine
from minispec.testing.conform.medusa_engine import medusa_engine
from minispec.testing.conform.vllm_engine import vllm_engine

PROG = "minispec.testing.conform"
# name -> (package, factory); the factory raises a MinispecError (one line) where the package is missing
PUBLIC_ENGINES = {"vllm": ("vllm", vllm_engine), "vllm:no-probs": ("vllm", lambda: vllm_engine(draft_probs=False)),
                  "lmdeploy": ("lmdeploy", lmdeploy_engine), "litgpt": ("litgpt", litgpt_engine),
                  "medusa": ("medusa", medusa_engine), "eagle": ("eagle", eagle_engine),
                  "sglang": ("sglang", sglang_engine), "sglang:block": ("sglang", lambda: sglang_engine(block=True))}


def installed_engines() -> list[Engine]:
    """Each public engine whose package imports here; one line on stderr for each that does not."""
    engines = []
    for name, (_, factory) in PUBLIC_ENGINES.items():
        try:
            engines.append(factory())
        except MinispecError as err:
            print(f"{PROG}: {name}: skipped ({err})", file=sys.stderr, flush=True)
    return engines


def engine_named(spec: str) -> list[Engine]:
    """The engines a command-line name stands for; MinispecError naming ENGINE if none."""
    if spec == "all":
        public = installed_engines()  # first: vLLM must be imported before transformers brings in Triton
        return [transformers_engine(), transformers_engine(0.5),
                transformers_engine(proposes=True, name="transformers proposing"), sample_then_match_engine()] + [
            minispec_engine(name) for name in acceptance.available() if name not in NEEDS_THE_HEAD] + public
    if spec in PUBLIC_ENGINES:
        return [PUBLIC_ENGINES[spec][1]()]
    if spec == "sample-then-match":
        return [sample_then_match_engine()]
    if spec == "transformers":
        return [transformers_engine()]
    if spec.startswith("transformers:"):
        name, options = parse_options(spec, "ENGINE")
        try:
            weight = float(options.pop("w", "nan"))
        except ValueError:
            weight = math.nan
        if options or not 0 < weight < 1:  # also nan
            raise MinispecError(f"ENGINE {spec!r}: expected transformers:w=W with 0 < W < 1")
        return [transformers_engine(weight)]
    if spec.startswith("minispec:"):
        try:
            name, options = policy_spec(spec[len("minispec:"):])
            return [minispec_engine(name, **options)]
        except (ValueError, MinispecError) as err:
            raise MinispecError(f"ENGINE {spec!r}: {str(err).replace('--policy ', '')}") from None
    if ":" not in spec:
        raise MinispecError(f"ENGINE {spec!r}: expected all, {', '.join(PUBLIC_ENGINES)}, transformers, transformers:w=W, sample-then-match, "
                            "minispec:NAME[:k=v,...] or module:attribute")
    found = load_object(spec, "ENGINE")
    if isinstance(found, type) or (callable(found) and not isinstance(found, Engine)):
        try:
            found = found()  # a factory (or an Engine subclass) that takes no arguments
        except Exception as err:  # noqa: BLE001 - user code
            raise MinispecError(f"ENGINE {spec!r}: calling it failed ({type(err).__name__}: "
                                f"{' '.join(str(err).split())}); expected an Engine or a function of no "
                                "arguments returning one") from None
    if not isinstance(found, Engine):
        raise MinispecError(f"ENGINE {spec!r}: {type(found).__name__}, not a minispec.testing.conform.Engine")
    return [found]


def invariant_list(text: str) -> tuple[str, ...]:
    """--only: comma-separated names from INVARIANTS."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in INVARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"--only {text!r}: {', '.join(map(repr, unknown))} is not an invariant; "
                                         f"expected comma-separated names from {', '.join(INVARIANTS)}")
    return names


def verdict_table(results: dict[str, list[Verdict]]) -> str:
    """Engines as columns, invariants as rows (those that ran), each cell a verdict."""
    names = list(results)
    ran = {v.invariant for verdicts in results.values() for v in verdicts}
    lines = ["| invariant | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for invariant in (name for name in INVARIANTS if name in ran):
        cells = [next((v.status for v in results[n] if v.invariant == invariant), "") for n in names]
        lines.append(f"| {invariant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def evidence(results: dict[str, list[Verdict]]) -> str:
    lines = []
    for name, verdicts in results.items():
        lines.append(f"\n{name}:\n")
        lines += [f"- {v.invariant}: {v.status}. {v.evidence}" for v in verdicts]
    return "\n".join(lines) + "\n"


def planted_table(budget: Budget) -> tuple[str, bool]:
    """The planted bug classes as a table, and whether every one was caught by its invariant."""
    rows = ["| bug class | seen in | planted | should fail | failed | evidence |", "|---|---|---|---|---|---|"]
    all_caught = True
    for plant in PLANTS:
        verdicts = conform(planted_engine(plant), budget)
        failed = [v.invariant for v in verdicts if v.status == "FAIL"]
        mine = next(v for v in verdicts if v.invariant == plant.catches)
        caught = "**yes**" if plant.catches in failed else "NO"
        all_caught &= plant.catches in failed
        rows.append(f"| {plant.bug} | {plant.seen_in} | `{plant.name}` | {plant.catches} ({caught}) | "
                    f"{', '.join(failed) or 'none'} | {mine.evidence} |")
        print(f"{PROG}: {plant.name}: {caught}", file=sys.stderr, flush=True)
    return "\n".join(rows) + "\n", all_caught


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("engines", nargs="*", metavar="ENGINE", help="engines to test (see the module docstring)")
    parser.add_argument("--planted", action="store_true", help="run the suite on each planted bug class")
    parser.add_argument("--power", action="store_true",
                        help="for each planted bug class a chi-square invariant catches: the steps it needs to catch "
                             "it 99%% of the time, beside the suite's own (minispec.testing.conform.power)")
    parser.add_argument("--delta", type=ranged(float, "--delta", lo=0.01, hi=0.25), default=0.05,
                        help="the total variation each statistical check must detect 99%% of the time")
    parser.add_argument("--seed", type=ranged(int, "--seed", lo=0), default=0, help="draws the fixed steps and samples")
    parser.add_argument("--only", type=invariant_list, default=(), metavar="INVARIANT,...",
                        help="run these invariants only (default: every one)")
    args = parser.parse_args(argv)
    if not args.engines and not args.planted and not args.power:
        parser.error("name an ENGINE (or all), or give --planted or --power")
    if args.power and (args.engines or args.planted or args.only):
        parser.error("--power: alone (it estimates each planted bug's law; no ENGINE, --planted or --only)")
    if args.only and args.planted:
        parser.error("--only: not with --planted (each planted bug is judged by the whole suite)")

    def body() -> int:
        engines = [e for spec in args.engines for e in engine_named(spec)]  # every name checked before any run
        names = [e.name for e in engines]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # one column each: a second engine of the same name would hide the first's verdicts
            raise MinispecError(f"ENGINE: {', '.join(map(repr, twice))} named twice; expected each engine once "
                                "(an engine of your own needs a name of its own)")
        budget = Budget(delta=args.delta, seed=args.seed)
        started = time.perf_counter()
        failed = False
        if engines:
            results = {}
            for engine in engines:
                results[engine.name] = conform(engine, budget, args.only)
                print(f"{PROG}: {engine.name}: {sum(v.status == 'FAIL' for v in results[engine.name])} failed",
                      file=sys.stderr, flush=True)
            failed = any(not v.passed for vs in results.values() for v in vs)
            print(verdict_table(results) + evidence(results))
        if args.power:
            print(power_table(budget))
        if args.planted:
            table, all_caught = planted_table(budget)
            print(table)
            failed = failed or not all_caught  # a planted bug the suite lets through fails the command
        print(f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
        return 1 if failed else 0

    return run_main(PROG, body)
